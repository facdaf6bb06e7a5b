"""Trajectories: the driver's multi-turn samples (trace schema 2, `rlsim.trace.turns`).

A policy launches a sample and is told when it ends, as for a single-turn sample; in between the
driver runs its turns. Each turn is a request under the sample's request id, on the instance the
sample was placed on (its KV is there): turn k's prompt is the context so far, the first
`prompt_len` tokens of it the prompt its siblings share. A turn that ends in a tool call (the
trace's "tool", unless the engine cut it at `max_tokens`) goes to a CPU tool worker: the first
of `tool_workers` free takes it (by default there is no limit: a logged latency already holds the
tool server's own queueing), for the trace's latency times `tool_latency_scale`, or a fixed
`tool_latency_s`; when it answers, the next turn is submitted with the tool's appended tokens.
The policy is told the trajectory's end: `num_output_tokens` summed over its turns.

Aborting a trajectory aborts its running turn, or drops it from the tool queue (told as an
abort at that instant, through a `turn_abort` timer). What it records, over the run
(`summary`): turns, tool calls, tool wait (queue and call) as a share of trajectory time, GPU idle
during tool calls (instance time with no running request while at least one of its trajectories
waits on a tool), the prefix hit rate of later turns, and the tokens prefilled again (context an
earlier turn had computed that was not hit: evicted, or never full blocks).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from rlsim.errors import RlsimError
from rlsim.protocol import Aborted, Finished, Request
from rlsim.trace.turns import TurnTable

TOOL_TAG = "tool_done"
ABORT_TAG = "turn_abort"


@dataclass(slots=True)
class Trajectory:
    """A multi-turn sample in flight: its turns still to run and what it has generated."""

    outs: list[int]
    latency: list[float]
    append: list[int]
    turn: int = 0
    generated: int = 0  # output tokens of its ended turns
    context: int = 0  # the context its current (or next) turn's prompt holds
    first_token: float | None = None
    versions: list[int] = field(default_factory=list)  # weight version each turn launched under
    start: float = 0.0  # launched at
    turn_start: float = 0.0  # its current turn submitted at
    waiting: bool = False  # between a tool call and the next turn
    wait_start: float = 0.0


@dataclass(frozen=True)
class ToolConfig:
    """CPU tool workers: how many calls run at once, and the latencies they take."""

    tool_workers: int | None = None  # None: no limit (each call starts at once, as veRL's agent loop awaits them)
    tool_latency_scale: float = 1.0
    tool_latency_s: float | None = None  # every call this long (a synthetic sweep), instead of the trace's

    def __post_init__(self) -> None:
        w = self.tool_workers
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w <= 0):
            raise RlsimError(f"tool_workers must be a positive integer, got {self.tool_workers!r}")
        if not (math.isfinite(self.tool_latency_scale) and self.tool_latency_scale >= 0):
            raise RlsimError(f"tool_latency_scale must be a finite number >= 0, got {self.tool_latency_scale}")
        if self.tool_latency_s is not None and not (math.isfinite(self.tool_latency_s) and self.tool_latency_s >= 0):
            raise RlsimError(f"tool_latency_s must be a finite number >= 0, got {self.tool_latency_s}")


class Trajectories:
    """The multi-turn samples of one run (`Driver.turns`, None for a single-turn trace)."""

    def __init__(self, table: TurnTable, engine, tools: ToolConfig) -> None:  # noqa: ANN001 - an Engine
        self.table, self.engine, self.tools = table, engine, tools
        self.first_token: dict[int, float] = getattr(engine, "first_token", {})  # engines that track it
        self.staleness_span = 0  # the most weight versions a trajectory's turns spanned
        self.live: dict[int, Trajectory] = {}
        self.free = [0.0] * (tools.tool_workers or 0)  # when each tool worker is next free (a heap)
        self.due: list[tuple[float, int]] = []  # (answer time, request id) of calls under way
        self.aborts: list[Aborted] = []  # abort events for trajectories taken off the tool queue
        self.turns = self.calls = self.trajectories = 0  # turns run (aborted ones too), tool calls, trajectories done
        self.finished_turns = 0  # turns of the trajectories done
        self.tool_wait_s = self.trajectory_s = 0.0
        self.reusable_tokens = 0  # later turns: context an earlier turn computed
        self.waits: dict[int, list[tuple[float, float]]] = {}  # instance -> tool-wait intervals
        self.latency: list[tuple[int, float]] = []  # (turn index, submit to finish) of multi-turn turns

    # ---- launching ---------------------------------------------------------------------------
    def first_turn(self, req: Request, row: int) -> Request:
        """The request for a launched sample's first turn (itself when it has one turn)."""
        outs, lat, add = self.table.turns(row)
        if len(outs) == 1:
            return req
        self.live[req.request_id] = Trajectory(outs, lat, add, context=req.num_prompt_tokens,
                                               versions=[req.policy_version], start=self.engine.now,
                                               turn_start=self.engine.now)
        return req._replace(target_tokens=outs[0], more_turns=True)

    # ---- events ------------------------------------------------------------------------------
    def finished(self, ev: Finished, req: Request) -> Finished | None:
        """A turn ended: schedule its tool call and answer None, or, on the last turn, the
        trajectory's finish (tokens over all its turns)."""
        tr = self.live.get(ev.request_id)
        self.turns += 1
        if tr is None:  # a sample of one turn
            self.trajectories += 1
            self.finished_turns += 1
            return ev
        tr.generated += ev.num_output_tokens
        tr.context += ev.num_output_tokens
        first = self.first_token.pop(ev.request_id, None)
        if tr.first_token is None:
            tr.first_token = first
        self.latency.append((tr.turn, ev.time - tr.turn_start))
        if tr.turn == len(tr.outs) - 1 or ev.finish_reason == "length":  # (a turn cut at max_tokens calls no tool)
            del self.live[ev.request_id]
            self.trajectories += 1
            self.finished_turns += tr.turn + 1
            self.trajectory_s += ev.time - tr.start
            self.staleness_span = max(self.staleness_span, tr.versions[-1] - tr.versions[0])
            if tr.first_token is not None:  # the trajectory's first token, for the records
                self.first_token[ev.request_id] = tr.first_token
            return ev._replace(num_output_tokens=tr.generated)
        latency = tr.latency[tr.turn] if self.tools.tool_latency_s is None else self.tools.tool_latency_s
        latency *= self.tools.tool_latency_scale
        if self.free:  # a limited pool: the first worker free takes the call
            done = max(self.free[0], ev.time) + latency
            heapq.heapreplace(self.free, done)
        else:
            done = ev.time + latency
        heapq.heappush(self.due, (done, ev.request_id))
        self.calls += 1
        self.tool_wait_s += done - ev.time
        tr.waiting, tr.wait_start = True, ev.time
        self.engine.call_at(done, TOOL_TAG)
        return None

    def answered(self, now: float, requests: list[Request], version: int) -> list[Request]:
        """Tool calls answered by `now`: their trajectories' next turns, to submit."""
        out = []
        due = self.due
        while due and due[0][0] <= now:
            _, rid = heapq.heappop(due)
            tr = self.live.get(rid)
            if tr is None or not tr.waiting:  # aborted while its tool ran
                continue
            q = requests[rid]
            self.waits.setdefault(q.instance, []).append((tr.wait_start, now))
            add = tr.append[tr.turn]
            self.reusable_tokens += tr.context - 1  # (its last sampled token was never fed back)
            tr.context += add
            tr.turn += 1
            tr.waiting, tr.turn_start = False, now
            tr.versions.append(version)
            out.append(q._replace(
                num_prompt_tokens=tr.context, target_tokens=tr.outs[tr.turn], policy_version=version,
                prompt_len=q.num_prompt_tokens, more_turns=tr.turn < len(tr.outs) - 1,
            ))
        return out

    def aborted(self, ev: Aborted) -> Aborted:
        """An abort of a running turn, told with the trajectory's tokens over all its turns."""
        tr = self.live.pop(ev.request_id, None)
        if tr is None:
            return ev
        first = self.first_token.pop(ev.request_id, None)
        if (tr.first_token or first) is not None:
            self.first_token[ev.request_id] = tr.first_token if tr.first_token is not None else first
        return ev._replace(num_output_tokens=tr.generated + ev.num_output_tokens)

    def abort_waiting(self, request_ids, requests: list[Request]) -> list[int]:  # noqa: ANN001
        """Take the trajectories among these that wait on a tool off the queue (each told as an
        abort now, through a timer); return the ids left for the engine to abort."""
        rest = []
        now = self.engine.now
        for rid in request_ids:
            tr = self.live.get(rid)
            if tr is None or not tr.waiting:
                rest.append(rid)
                continue
            del self.live[rid]
            q = requests[rid]
            self.waits.setdefault(q.instance, []).append((tr.wait_start, now))
            self.aborts.append(Aborted(rid, now, q.instance, tr.generated))
            self.engine.call_at(now, ABORT_TAG)
        return rest

    # ---- what a run reports ------------------------------------------------------------------
    def summary(self, engine, end: float) -> dict:  # noqa: ANN001 - the run's engine
        """Run-level multi-turn metrics (see the module docstring)."""
        n = engine.num_instances
        idle = 0.0
        segments = getattr(engine, "segments", None)
        for i, waits in self.waits.items():
            busy = segments(i) if segments else []
            idle += _uncovered(_merge(waits), busy)
        instances = getattr(engine, "instances", [])
        turn_tokens = sum(inst.sched.turn_tokens for inst in instances)
        hits = sum(inst.sched.turn_hit_tokens for inst in instances)
        lat = np.array(self.latency, float).reshape(-1, 2)
        return {
            "turns": self.turns,
            "tool_calls": self.calls,
            "turns_per_trajectory": self.finished_turns / self.trajectories if self.trajectories else float("nan"),
            "tool_wait_s": self.tool_wait_s,
            "tool_wait_share": self.tool_wait_s / self.trajectory_s if self.trajectory_s else float("nan"),
            "turn_version_span_max": self.staleness_span,
            "gpu_idle_during_tools_s": idle,
            "gpu_idle_during_tools_ratio": idle / (n * end) if end > 0 else float("nan"),
            "turn_prefix_hit_rate": hits / turn_tokens if turn_tokens else float("nan"),
            "reprefilled_tokens": max(0, self.reusable_tokens - hits),
            "turn_latency_p50_s": float(np.median(lat[:, 1])) if len(lat) else float("nan"),
            "turn_latency_p50_s_by_turn": [
                float(np.median(lat[lat[:, 0] == k, 1])) for k in range(5) if (lat[:, 0] == k).any()
            ] if len(lat) else [],
        }


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _uncovered(spans: list[tuple[float, float]], busy: list[tuple[float, float]]) -> float:
    """Time inside `spans` (merged) not covered by the merged, sorted `busy` intervals."""
    total, j = 0.0, 0
    for a, b in spans:
        covered = 0.0
        while j < len(busy) and busy[j][1] <= a:
            j += 1
        k = j
        while k < len(busy) and busy[k][0] < b:
            covered += min(b, busy[k][1]) - max(a, busy[k][0])
            k += 1
        total += (b - a) - covered
    return total
