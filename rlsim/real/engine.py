"""RealEngine: real vLLM rollout instances behind the `Engine` protocol the simulator implements.

The clock is the wall clock (seconds since the run started, plus the time already run before a
`--resume`). `step()` runs engine iterations until something happens: a request finishes, an
abort is answered, or a timer (training, weight sync, reward latency) falls due; while nothing
can run (paused for training, or idle) it sleeps until the next timer. One instance runs in this
process; several run as Ray actors, each stepping on its own, and `step()` takes whichever
iteration finishes first, so instances never wait for one another.

Length modes: `replay` forces each sample to the trace's length (`min_tokens = max_tokens = L`,
`ignore_eos`) so the real run does exactly the trace's work; `free` lets the model stop on its
own (up to the request's `max_tokens`) and keeps every response's token ids for the recorded
trace. Prompts are the trace's text in free mode when it has `prompt_text`, otherwise seeded
token ids of the trace's prompt length.

Multi-turn (`agent`, a task's `rlsim.trace.tasks.AgentTask`, free mode): the engine runs the agent
loop, as veRL's agent loop runs in its rollout workers. A turn that ends in the task's tool-call
token waits on the tool (its latency, on the first of `tool_workers` free; no limit by default),
then the next turn runs on the same instance with the tool's answer appended to the context
(vLLM's prefix cache holds the earlier turns' KV while it can). The driver is told the
trajectory's end only: its length is the tokens the model generated over all its turns; its
training sample is the whole context after the prompt, tool tokens masked off the loss.
"""

from __future__ import annotations

import contextlib
import heapq
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from rlsim.errors import RlsimError
from rlsim.protocol import Aborted, Event, EventBatch, Finished, Preempted, Request, Timer
from rlsim.real.backends import LocalBackend, PromptSource, RayBackend
from rlsim.real.vllm_instance import DETAILS

# The columns of a run's iterations.parquet: vLLM's batch (calibration's columns, -1 where the
# engine did not report them), the engine call's own time `step_s`, and `wall_s`, the time the
# instance spent on the iteration as the simulator counts it.
DETAIL_COLUMNS = (*DETAILS, "context_tokens")
ITERATION_COLUMNS = ("instance", "time", "step_s", "wall_s", "num_running", "new_tokens", *DETAIL_COLUMNS)


class RealEngine:
    """The `Engine` protocol over vLLM instances (`rlsim.real.vllm_instance.VllmInstance`)."""

    def __init__(
        self,
        backend: LocalBackend | RayBackend,
        num_instances: int,
        prompts: PromptSource,
        lengths: str = "replay",
        seed: int = 0,
        temperature: float = 1.0,
        clock_offset: float = 0.0,
        histospec: bool = False,
        on_finish: Callable[[Request, dict], None] | None = None,
        agent=None,  # noqa: ANN001 - rlsim.trace.tasks.AgentTask: run its turns and tool calls
        tool_latency_s: float = 0.5,
        tool_workers: int | None = None,
    ) -> None:
        self.backend = backend
        self.num_instances = num_instances
        self.prompts = prompts
        self.lengths = lengths
        self.seed = seed
        self.temperature = temperature
        self.histospec = histospec
        self.on_finish = on_finish
        # `rlsim run --real --train grpo`: the driver trains through `learner(requests, version)`
        # (-> StepCost, metrics), which reads the finished samples' tokens kept here until then
        self.learner: Callable[[list[Request], int], tuple[Any, dict]] | None = None
        # `--placement disaggregated --train grpo`: a trainer process updates beside the rollout
        # (`rlsim.real.learn.BesideLearner`: start, done, finish, push)
        self.async_learner = None
        self.samples: dict[int, dict] = {}
        self._t0 = time.perf_counter() - clock_offset
        self._timers: list[tuple[float, int, str]] = []
        self._order = 0
        self._outbox: list[Event] = []
        self._paused = False
        self.live: dict[int, Request] = {}  # rid -> request, submitted and not yet finished or aborted
        self._count = [0] * num_instances
        self._progress: dict[int, int] = {}
        self.first_token: dict[int, float] = {}
        # one tuple per engine iteration, in ITERATION_COLUMNS' order
        self.iterations: list[tuple] = []
        self._last_end = [0.0] * num_instances
        self._last_row: list[int | None] = [None] * num_instances  # each instance's last row in `iterations`
        self._busy = [0.0] * num_instances
        self._busy_since: dict[int, float] = {}
        self._segments: list[list[tuple[float, float]]] = [[] for _ in range(num_instances)]
        # HistoSpec only: prompt -> epoch -> finished responses' token ids, and what each
        # instance has been given.
        self.responses: dict[int, dict[int, list[list[int]]]] = {}
        self.prompt_ids: dict[int, list[int]] = {}
        self._published: set[tuple[int, int, int]] = set()  # (instance, prompt, epoch)
        # multi-turn: the trajectories in flight (rid -> prompt ids, each turn's tokens and log-probs,
        # each tool call's answer and latency), those waiting on a tool, and the tool calls under way
        self.agent = agent
        if agent is not None and lengths != "free":
            raise RlsimError("a multi-turn task runs with --lengths free: the model decides when to call its tool")
        self.tool_latency_s = tool_latency_s
        self._tool_free = [0.0] * (tool_workers or 0)
        self._tools: list[tuple[float, int]] = []
        self.trajectories: dict[int, dict] = {}
        self.waiting: set[int] = set()

    # ---- protocol -------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return time.perf_counter() - self._t0

    def idle(self) -> bool:
        """No request live and no iteration in flight on any instance."""
        return not self.live and not getattr(self.backend, "inflight", None)

    @contextlib.contextmanager
    def clock_stopped(self) -> Iterator[None]:
        """Work done inside (a calibration cell between steps) takes no time on the run's clock."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self._t0 += time.perf_counter() - t

    def busy_time(self, i: int) -> float:
        extra = self.now - self._busy_since[i] if i in self._busy_since else 0.0
        return self._busy[i] + extra

    def segments(self, i: int) -> list[tuple[float, float]]:
        """Busy intervals in time order, the one in progress counted up to now."""
        segs = list(self._segments[i])
        if i in self._busy_since:
            segs.append((self._busy_since[i], self.now))
        return segs

    def submit(self, requests: Sequence[Request]) -> None:
        per: dict[int, list[dict]] = {}
        for req in requests:
            if req.kept_tokens:
                raise RlsimError(
                    "divided rollout (a request continuing another's tokens, as seer does) runs in the "
                    "simulator only: real engines do not resume a response from its kept tokens yet"
                )
            per.setdefault(req.instance, []).append(self._vllm_request(req))
            self.live[req.request_id] = req
            self._progress[req.request_id] = 0
            self._count[req.instance] += 1
        for i, batch in per.items():
            if self.histospec:
                self._publish(i, [self.live[int(r["request_id"])] for r in batch])
            self.backend.call(i, "add", batch)
            self._mark(i)

    def abort(self, request_ids: Iterable[int]) -> None:
        per: dict[int, list[int]] = {}
        now = self.now
        for rid in request_ids:
            req = self.live.pop(rid, None)
            if req is None:
                continue
            if rid in self.waiting:  # a trajectory waiting on its tool: dropped from the queue
                self.waiting.discard(rid)
                tr = self.trajectories.pop(rid)
                self._outbox.append(Aborted(rid, now, req.instance, sum(len(t) for t in tr["turns"])))
                continue
            per.setdefault(req.instance, []).append(rid)
        for i, rids in per.items():
            answered = self.backend.call(i, "abort", [str(r) for r in rids])
            for rid in rids:
                done = int(answered.get(str(rid), self._progress.get(rid, 0)))
                tr = self.trajectories.pop(rid, None)  # a trajectory's earlier turns count too
                done += sum(len(t) for t in tr["turns"]) if tr else 0
                self._progress.pop(rid, None)
                self._count[i] -= 1
                self._outbox.append(Aborted(rid, now, i, done))
            self._mark(i)

    sleeps_for_sync = False  # a weight push preempts running requests itself (vLLM's reload)

    def call_at(self, when: float, tag: str) -> None:
        self._order += 1
        heapq.heappush(self._timers, (when, self._order, tag))

    def drop_timers(self, tag: str) -> None:
        """Forget the pending timers of this tag."""
        self._timers = [t for t in self._timers if t[2] != tag]
        heapq.heapify(self._timers)

    def pause(self, sleep: bool = False) -> None:
        if sleep:  # real runs record free_cache_engine=False (vLLM on a CPU has no sleep mode)
            raise RlsimError("real engines do not sleep during training yet (free_cache_engine must be off)")
        # An iteration already running on an actor completes; its outputs are delivered.
        for i, res in self.backend.drain():
            self._absorb(i, res)
        self._paused = True
        for i in range(self.num_instances):
            self._mark(i)

    def resume(self) -> None:
        self._paused = False
        for i in range(self.num_instances):
            self._mark(i)

    def step(self, until_idle: bool = False) -> EventBatch:
        out = EventBatch.of(self._step())
        while until_idle and out and not out.timers() and any(self._count):  # a quiet policy waits
            more = self._step()
            if not more:
                break
            out.extend(EventBatch.of(more))
        return out

    def _step(self) -> list[Event]:
        """The events of the next engine step (or due timers)."""
        while True:
            if self._outbox:
                out, self._outbox = self._outbox, []
                return out
            now = self.now
            if self._tools and self._tools[0][0] <= now:  # tools answered: their trajectories' next turns
                while self._tools and self._tools[0][0] <= now:
                    self._next_turn(heapq.heappop(self._tools)[1])
                continue
            if self._timers and self._timers[0][0] <= now:
                due = []
                while self._timers and self._timers[0][0] <= now:
                    when, _, tag = heapq.heappop(self._timers)
                    due.append(Timer(tag, when))
                return due
            runnable = [] if self._paused else [i for i in range(self.num_instances) if self._count[i]]
            due = min([t[0] for t in self._timers[:1]] + [t[0] for t in self._tools[:1]], default=None)
            if runnable:
                timeout = max(0.0, due - now) if due is not None else None
                for i, res in self.backend.next_step(runnable, timeout):
                    self._absorb(i, res)
                continue
            if due is not None:
                time.sleep(max(0.0, due - now))
                continue
            return []

    # ---- internals ------------------------------------------------------------------------
    def _vllm_request(self, req: Request) -> dict:
        # The same sample of a prompt draws the same seed every visit: without a training step
        # the weights do not change, so a prompt's responses repeat across visits.
        seed = int(np.random.default_rng([self.seed, req.prompt_id, req.sample_idx]).integers(2**31))
        out: dict[str, Any] = {"request_id": str(req.request_id), "temperature": self.temperature, "seed": seed}
        if self.lengths == "replay":
            n = max(1, min(req.target_tokens, req.max_tokens))
            out.update(max_tokens=n, min_tokens=n, ignore_eos=True)
        else:
            out.update(max_tokens=req.max_tokens, min_tokens=0, ignore_eos=False)
        text = self.prompts.texts.get(req.prompt_id) if self.lengths == "free" else None
        if text is not None:
            out["prompt"] = text
        else:
            out["prompt_token_ids"] = self.prompts.token_ids(req.prompt_id, req.num_prompt_tokens)
        if self.agent is not None:  # its first turn: a tool call ends it; its context goes on
            out["keep_prompt"] = True
            if self.agent.max_turns > 1:
                out["stop_token_ids"] = [self.agent.call_id]
        return out

    # ---- multi-turn (the agent loop) --------------------------------------------------------------
    def _turn_ended(self, req: Request, f: dict, now: float) -> dict | None:
        """A turn ended: None if it called the tool (the trajectory waits on it), else the
        trajectory's finish: the model's tokens over all turns, and for training the whole
        response (tool tokens in, masked off the loss)."""
        agent, rid = self.agent, req.request_id
        tr = self.trajectories.setdefault(rid, {
            "prompt": list(f.get("prompt_token_ids") or ()), "turns": [], "lps": [], "answers": [], "latency": [],
            "preemptions": 0,
        })  # fmt: skip
        out, lps = list(f["output_token_ids"]), list(f.get("logprobs") or ())
        tr["turns"].append(out)
        tr["lps"].append(lps)
        tr["preemptions"] += int(f.get("vllm/num_preemptions") or 0)
        called = bool(out) and (out[-1] == agent.call_id or f.get("stop_reason") == agent.call_id)
        if called and len(tr["turns"]) < agent.max_turns:
            latency = self.tool_latency_s
            if self._tool_free:  # a limited pool of tool workers: the first free takes the call
                done = max(self._tool_free[0], now) + latency
                heapq.heapreplace(self._tool_free, done)
            else:
                done = now + latency
            tr["answers"].append(agent.answer_ids(self.prompts.texts[req.prompt_id]))  # (a task trace has its text)
            tr["latency"].append(latency)
            heapq.heappush(self._tools, (done, rid))
            self.waiting.add(rid)
            self.live[rid] = req
            return None
        del self.trajectories[rid]
        resp, mask, logp = [], [], []
        for k, turn in enumerate(tr["turns"]):
            resp += turn
            mask += [1] * len(turn)
            logp += tr["lps"][k]
            if k < len(tr["answers"]):
                resp += tr["answers"][k]
                mask += [0] * len(tr["answers"][k])
                logp += [0.0] * len(tr["answers"][k])  # (masked off: never a ratio)
        model_tokens = [t for turn in tr["turns"] for t in turn]
        keep_lp = len(logp) == len(resp) and f.get("logprobs") is not None
        return {**f, "prompt_token_ids": tr["prompt"], "output_token_ids": model_tokens, "response_token_ids": resp,
                "loss_mask": mask, "logprobs": logp if keep_lp else None,
                "turn_tokens": tr["turns"], "turn_output_tokens": [len(t) for t in tr["turns"]],
                "tool_latency_s": tr["latency"], "tool_append_tokens": [len(a) for a in tr["answers"]],
                "tool_answers": tr["answers"], "vllm/num_preemptions": tr["preemptions"]}  # fmt: skip

    def _next_turn(self, rid: int) -> None:
        """A tool answered: the trajectory's next turn, its context the prompt, every turn and answer."""
        req = self.live.get(rid)
        if req is None or rid not in self.waiting:  # aborted while its tool ran
            return
        self.waiting.discard(rid)
        tr = self.trajectories[rid]
        context = list(tr["prompt"])
        for k, turn in enumerate(tr["turns"]):
            context += turn + (tr["answers"][k] if k < len(tr["answers"]) else [])
        k = len(tr["turns"])
        seed = int(np.random.default_rng([self.seed, req.prompt_id, req.sample_idx, k]).integers(2**31))
        d: dict[str, Any] = {"request_id": str(rid), "temperature": self.temperature, "seed": seed,
                             "max_tokens": req.max_tokens, "min_tokens": 0, "ignore_eos": False,
                             "prompt_token_ids": context, "keep_prompt": True}  # fmt: skip
        if k + 1 < self.agent.max_turns:
            d["stop_token_ids"] = [self.agent.call_id]
        self._progress[rid] = 0
        self._count[req.instance] += 1
        self.backend.call(req.instance, "add", [d])
        self._mark(req.instance)

    def _publish(self, i: int, reqs: list[Request]) -> None:
        """Give instance i the earlier visits' responses of these prompts (HistoSpec's history)."""
        rows = []
        for req in reqs:
            for e, resp in self.responses.get(req.prompt_id, {}).items():
                key = (i, req.prompt_id, e)
                if e < req.epoch and key not in self._published and resp:
                    self._published.add(key)
                    ids = self.prompt_ids.get(req.prompt_id) or self.prompts.token_ids(
                        req.prompt_id, req.num_prompt_tokens
                    )
                    rows.append({"prompt_token_ids": ids, "responses": resp})
        if rows:
            self.backend.call(i, "publish_history", rows)

    def _absorb(self, i: int, res: dict) -> None:
        now = self.now
        # The iteration's wall time as the instance lived it: from the previous iteration's end,
        # or from when work arrived after an idle or paused spell (the driver's handling of the
        # previous outputs included, as calibration times `LLMEngine.step()` back to back).
        wall = now - max(self._last_end[i], self._busy_since.get(i, now))
        self._last_end[i] = now
        det = res.get("details") or {}
        if res.get("ran", True) or self._last_row[i] is None:
            self._last_row[i] = len(self.iterations)
            counts = (self._count[i], res["new_tokens"], *(det.get(k, -1) for k in DETAIL_COLUMNS))
            self.iterations.append((i, now, res["step_s"], wall, *counts))
        else:  # SGLang's overlap loop: a pass that ran no batch, only the last one's result, ends that iteration
            k = self._last_row[i]
            row = self.iterations[k]
            took = (row[2] + res["step_s"], row[3] + wall)
            self.iterations[k] = (i, now, *took, row[4], row[5] + res["new_tokens"], *row[6:])
        for rid_s, n in res["progress"].items():
            rid = int(rid_s)
            if rid in self.live:
                self._progress[rid] = n
                if n and rid not in self.first_token:
                    self.first_token[rid] = now
        for f in res["finished"]:
            rid = int(f["request_id"])
            req = self.live.pop(rid, None)
            if req is None:
                continue  # aborted while this iteration ran
            self._count[i] -= 1
            self._progress.pop(rid, None)
            if self.agent is not None:
                f = self._turn_ended(req, f, now)
                if f is None:  # it called the tool: the trajectory goes on after the answer
                    continue
            n = len(f["output_token_ids"])
            if self.lengths == "replay":
                reason = "length" if req.target_tokens >= req.max_tokens else "stop"
            else:
                reason = f["finish_reason"] if f["finish_reason"] in ("stop", "length") else "stop"
            if self.histospec:
                self.responses.setdefault(req.prompt_id, {}).setdefault(req.epoch, []).append(f["output_token_ids"])
                if f.get("prompt_token_ids"):
                    self.prompt_ids[req.prompt_id] = f["prompt_token_ids"]
            if self.learner is not None or self.async_learner is not None:
                self.samples[rid] = {k: f.get(k) for k in ("prompt_token_ids", "output_token_ids", "logprobs")}
                if "response_token_ids" in f:  # a trajectory: the whole response, tool tokens masked
                    self.samples[rid] |= {"output_token_ids": f["response_token_ids"], "loss_mask": f["loss_mask"]}
            if self.on_finish is not None:
                self.on_finish(req, f)
            self._outbox.extend(Preempted(rid, now, i, n) for _ in range(int(f["vllm/num_preemptions"])))
            self._outbox.append(Finished(rid, now, i, n, reason))
        self._mark(i)

    def _mark(self, i: int) -> None:
        busy = self._count[i] > 0 and not self._paused
        if busy and i not in self._busy_since:
            self._busy_since[i] = self.now
        elif not busy and i in self._busy_since:
            start = self._busy_since.pop(i)
            end = self.now
            self._busy[i] += end - start
            segs = self._segments[i]
            if segs and start - segs[-1][1] < 1e-6:
                segs[-1] = (segs[-1][0], end)
            else:
                segs.append((start, end))
