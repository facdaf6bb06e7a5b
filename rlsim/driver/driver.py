"""Driver: one run's state between the policy and the engine, and the end of each step.

It holds the data order (a seeded shuffle, or a real log's own order), the visits taken and not
yet trained, the requests, the finished lengths the policy may see, and the records; `apply` turns
a policy's actions into engine calls (launching through `rlsim.driver.launch`), `handle` records an
engine event before the policy is told of it, and `train` ends the step. Rewards are scored by a
pool of CPU workers as samples finish (overlapping rollout), each taking the run's reward latency
or the trace's per-sample `reward_time_s`. Then the step's training phases run
(`rlsim.step_costs`: old log-probs, reference when KL is on, the update, weight sync). Under
`colocated` placement rollout is paused for all of it (veRL's hybrid engine), and with
`free_cache_engine` the engines sleep (KV freed, weights offloaded) and wake after; under
`disaggregated` rollout goes on during training. `snapshot`/`restore` resume a real run. The loop
that calls all this is `rlsim.driver.loop.run_loop`.
"""

from __future__ import annotations

import dataclasses
import heapq
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from rlsim.config import ClusterConfig, DynamicSamplingConfig, RLConfig
from rlsim.driver.dynamic_sampling import GroupFilter, check_rewards
from rlsim.driver.launch import Launcher, Launching
from rlsim.driver.requests import RequestTable
from rlsim.driver.trace_index import TraceIndex
from rlsim.driver.turns import ABORT_TAG, TOOL_TAG, ToolConfig, Trajectories
from rlsim.driver.view import View
from rlsim.errors import RlsimError
from rlsim.profile import Profile
from rlsim.protocol import (
    SYNC_MODES,
    Abort,
    Aborted,
    Engine,
    EventBatch,
    Finished,
    Launch,
    Policy,
    Preempted,
    Timer,
    Train,
)
from rlsim.records import Records, StepWindow, column
from rlsim.step_costs import step_cost, weight_sync_s
from rlsim.trace.format import Trace
from rlsim.trace.turns import TurnTable, has_turns


def told_batches(policy: Policy) -> bool:
    """Whether the policy is told whole batches: the most derived class defining `on_events` or
    `on_event` defines `on_events` (a subclass overriding `on_event` of a batch policy is told events)."""
    for cls in type(policy).__mro__:
        if "on_events" in vars(cls):
            return True
        if "on_event" in vars(cls):
            return False
    return callable(getattr(policy, "on_events", None))  # (an instance attribute)


def told_quiet(policy: Policy):  # noqa: ANN201 - its on_quiet_events, or None
    """The policy's `on_quiet_events`, where the class that defines its `on_event` defines it too
    (a subclass overriding `on_event` alone is told every event by it)."""
    for cls in type(policy).__mro__:
        if "on_event" in vars(cls):
            return policy.on_quiet_events if "on_quiet_events" in vars(cls) else None
    return None


@dataclass
class Driver(Launcher):
    """State of one run; use `run_loop` rather than this class directly."""

    engine: Engine
    policy: Policy
    trace: Trace
    profile: Profile
    cluster: ClusterConfig
    rl: RLConfig
    dynamic_sampling: DynamicSamplingConfig | None = None
    tools: ToolConfig | None = None  # tool workers of a multi-turn trace (default ToolConfig())
    index: TraceIndex = field(init=False)
    records: Records = field(init=False)

    def __post_init__(self) -> None:
        rl = self.rl
        if rl.samples_per_prompt > self.trace.meta.samples_per_prompt:
            raise RlsimError(
                f"samples_per_prompt={rl.samples_per_prompt} but the trace holds only "
                f"{self.trace.meta.samples_per_prompt} samples per prompt"
            )
        if rl.epochs > len(self.trace.epochs):
            raise RlsimError(f"{rl.epochs} epochs asked but the trace holds {len(self.trace.epochs)}")
        self.index = TraceIndex(self.trace, rl.max_response_len)
        first = len(self.index.prompts_by_epoch[self.trace.epochs[0]])
        if first < rl.prompts_per_step:
            raise RlsimError(
                f"the trace holds {first} prompts per epoch, fewer than one step "
                f"(prompts_per_step={rl.prompts_per_step})"
            )
        self.records = Records()
        self.groups: GroupFilter | None = None
        if self.dynamic_sampling is not None:
            if not getattr(self.policy, "whole_groups", True):
                raise RlsimError(
                    f"dynamic sampling judges whole GRPO groups, but {self.policy.name} trains single "
                    "trajectories: use sortedrl(keep_groups=true)+dynamic_sampling"
                )
            check_rewards(self.trace.table.columns)
            self.groups = GroupFilter(self.dynamic_sampling, rl.prompts_per_step)
        self.first_token: dict[int, float] = getattr(self.engine, "first_token", {})  # engines that track it
        rng = np.random.default_rng(rl.seed)
        logged = self.index.logged_order
        self.order = [
            logged[e] if logged is not None else rng.permutation(self.index.prompts_by_epoch[e])
            for e in self.trace.epochs[: rl.epochs]
        ]  # a real log replays in its own order; otherwise a seeded shuffle, as a dataloader's
        self.epoch_ptr, self.pos = 0, 0
        self.taken_epoch: dict[int, int] = {}  # prompt -> epoch of its current visit
        self.pending: set[tuple[int, int]] = set()  # visits (epoch, prompt) taken, not yet trained
        self.trained_count: dict[tuple[int, int], int] = {}  # visit -> samples trained so far
        self.next_sample: dict[tuple[int, int], int] = {}
        self.finished: dict[tuple[int, int], list[int]] = {}  # visit -> finished lengths
        self.history: dict[int, list[int]] = {}  # prompt -> finished lengths of its previous visit
        self.in_flight: dict[int, set[int]] = {}  # prompt -> its requests in flight (none: absent)
        self.requests = RequestTable()  # every request launched, by id (ids are handed out in order)
        self.version = 0
        self.rr = 0
        self.assigned = [0] * self.engine.num_instances  # requests assigned and not yet ended
        self.reused_samples = 0
        self.reward_free = [0.0] * rl.reward_workers
        self.reward_done: dict[int, float] = {}
        self.view = View(self, self.policy)
        self.batched = told_batches(self.policy)
        self.quiet = self.batched and getattr(self.policy, "quiet", False) is True
        need = getattr(self.policy, "placement", None)
        if need is not None and self.cluster.placement != need:
            raise RlsimError(
                f"policy {self.policy.name} runs on a {need} cluster: add --placement {need}"
                + (" --train-gpus N" if need == "disaggregated" else "")
            )
        self.turns = (  # a multi-turn trace's trajectories in flight (rlsim.driver.turns)
            Trajectories(TurnTable(self.trace.table), self.engine, self.tools or ToolConfig(), rl.max_response_len)
            if has_turns(self.trace.table) else None
        )
        # a policy that says how many finishes it answers nothing to, on an engine that can run to them
        self.quiet_for = getattr(self.policy, "quiet_for", None)
        takes = inspect.signature(self.engine.step).parameters if self.quiet_for is not None else {}
        if "finishes" not in takes:
            self.quiet_for = None
        self.quiet_prompts = "prompts" in takes  # ... also counted prompt by prompt
        if self.turns is not None:  # a turn's end calls a tool at once: the engine may not run on to idle
            self.quiet, self.quiet_for = False, None
        # ... and is told the events it promised to answer nothing to as one batch
        self.told_quiet = told_quiet(self.policy) if self.quiet_for is not None and not self.batched else None
        self.rollout_version = 0  # the weights the rollout generates with (behind `version` between syncs)
        self.syncing = False  # the rollout is stopped for a weight sync; launches wait in `held`
        self.held: list[Launch] = []

    # ---- checkpoints (real runs resume from the last finished step) ------------------------
    _NOT_STATE = (
        "engine", "trace", "index", "view", "profile", "cluster", "rl", "dynamic_sampling", "first_token", "batched",
        "quiet", "quiet_for", "quiet_prompts", "told_quiet", "tools",
    )  # fmt: skip

    def snapshot(self) -> dict:
        """Everything the run has decided so far (data order position, visits, requests,
        records, the policy object and its state) at a step boundary; picklable."""
        state = {k: v for k, v in vars(self).items() if k not in self._NOT_STATE}
        state["view"] = (self.view.step, self.view.version, self.view.now)
        return state

    @classmethod
    def restore(  # noqa: ANN206
        cls, state: dict, engine: Engine, trace: Trace, profile: Profile, cluster, rl, ds  # noqa: ANN001
    ) -> Driver:
        """A driver continuing from `snapshot()` on a new engine. Requests that were in flight
        at the snapshot are submitted again (with their ids) and run from their first token."""
        state = dict(state)
        state.pop("engine_cfg", None)  # a checkpoint written when the driver held its own copy
        drv = cls(engine, state.pop("policy"), trace, profile, cluster, rl, ds)
        step, version, now = state.pop("view")
        vars(drv).update(state)
        if "rollout_version" not in state:  # a checkpoint from before syncs could skip a step
            drv.rollout_version = drv.version
        if isinstance(drv.requests, dict):  # a checkpoint written when requests were a dict by id
            drv.requests = [drv.requests[i] for i in range(len(drv.requests))]
        if isinstance(drv.requests, list):  # ... or a list of Request tuples
            drv.requests = RequestTable(drv.requests)
        drv.view = View(drv, drv.policy)
        drv.view.step, drv.view.version, drv.view.now = step, version, now
        flying = sorted(r for ids in drv.in_flight.values() for r in ids)
        if flying:
            engine.submit([drv.requests[r] for r in flying])
        return drv

    # ---- data order -----------------------------------------------------------------------
    def take_prompts(self, n: int) -> list[int]:
        """The next prompts of the seeded epoch order. An epoch is a barrier: the next epoch's
        prompts are handed out only once every prompt taken in this one has trained, so a
        prompt never has two visits open at once."""
        order = self.order
        while self.epoch_ptr < len(order) and self.pos >= len(order[self.epoch_ptr]):
            epoch = self.index.epochs[self.epoch_ptr]
            if any(e == epoch for e, _ in self.pending):
                return []
            self.epoch_ptr, self.pos = self.epoch_ptr + 1, 0
        if self.epoch_ptr >= len(order) or n <= 0:
            return []
        chunk = [int(p) for p in order[self.epoch_ptr][self.pos : self.pos + n]]
        self.pos += len(chunk)
        epoch = self.index.epochs[self.epoch_ptr]
        for p in chunk:
            prev = self.taken_epoch.get(p)
            if prev is not None:
                self.history[p] = self.finished.pop((prev, p), [])
            self.taken_epoch[p] = epoch
            self.pending.add((epoch, p))
        return chunk

    # ---- actions --------------------------------------------------------------------------
    @property
    def policy_name(self) -> str:
        return getattr(self.policy, "name", None) or type(self.policy).__name__

    def apply(self, actions: list) -> Train | None:
        train = None
        batch = Launching()
        launched: list[Launching] = []
        if not isinstance(actions, (list, tuple)):
            raise RlsimError(
                f"policy {self.policy_name} answered {actions!r:.80}, not a list of actions (rlsim/protocol.py)"
            )
        for act in actions:
            if isinstance(act, Launch):
                if self.syncing:  # the rollout is stopped for a weight sync: launched when it resumes
                    self.held.append(act)
                    continue
                self._launch(act, batch)
            elif isinstance(act, Abort):
                if batch:
                    self.engine.submit(self._dispatch(batch))
                    launched.append(batch)
                    batch = Launching()
                ids = act.request_ids
                if self.turns is not None:  # trajectories waiting on a tool leave its queue
                    ids = self.turns.abort_waiting(ids, self.requests)
                self.engine.abort(ids)
            elif isinstance(act, Train):
                train = act
            else:
                raise RlsimError(
                    f"policy {self.policy_name} answered {act!r:.80}, which is not an action: Launch, Abort or "
                    "Train (rlsim/protocol.py)"
                )
        if batch:
            self.engine.submit(self._dispatch(batch))
            launched.append(batch)
        if launched:  # one columnar append per submitted batch (the hot path of an epoch)
            now = self.engine.now
            for b in launched:
                self.records.launch(b, now, self.view.step)
        return train

    def _rewards(self, done: list[tuple[int, float]]) -> None:
        """Score these finished samples, in order: each goes to the reward worker free first."""
        index, q, free, reward_done = self.index, self.requests, self.reward_free, self.reward_done
        default = self.rl.reward_latency_s
        timed = index.reward_time is not None
        for rid, t in done:
            took = index.reward_time_s(q.epoch[rid], q.prompt_id[rid], q.sample_idx[rid], default) if timed else default
            finish = max(free[0], t) + took
            heapq.heapreplace(free, finish)
            reward_done[rid] = finish

    def handle(self, ev):  # noqa: ANN001, ANN201 - an Event in, the event the policy is told out
        """Book an engine event; a response that ended exactly at a chunk's end is told as "stop".
        A multi-turn trajectory's turns and tool calls are the driver's: None (nothing to tell)."""
        if type(ev) is not Finished and type(ev) is not Aborted:
            return self._handle_other(ev)
        told = self._book_events((ev,))
        return ev if told is None else (told[0] if told else None)

    def _book_events(self, batch, on_event=None, quiet=None):  # noqa: ANN001, ANN202 - a sequence of events
        """Book a batch's events (finishes and aborts here, in one loop: the hot path of an epoch;
        any other event through `_handle_other`). Returns None when every event is told as itself,
        else the events to tell (an event told otherwise replaced, one told not at all left out).
        With `on_event` (the per-event adapter), each event is booked and the policy told of it,
        its actions applied, before the next: returns the Train asked for. Rewards are scored after
        the loop, in booking order, either way (only an update reads them, after the batch).
        `quiet`: what the policy's `quiet_for` answered before the step; the events it covers are
        booked together and told as one batch (`on_quiet_events`), where the policy has it."""
        if quiet is not None and on_event is not None and self.told_quiet is not None:
            j = self._quiet_prefix(batch, quiet)
            if j:
                head = batch[:j]
                told = self._book_events(head)
                told = head if told is None else told
                if told and self.told_quiet(EventBatch(told), self.view):
                    raise RlsimError(
                        f"policy {self.policy.name} answered events its quiet_for said it answers nothing to"
                    )
                if j == len(batch):
                    return None
                batch = batch[j:]
        reqs, turns, cap = self.requests, self.turns, self.rl.max_response_len
        inst_of, pid_of, epoch_of, max_of, target_of = (
            reqs.instance, reqs.prompt_id, reqs.epoch, reqs.max_tokens, reqs.target_tokens
        )
        assigned, in_flight, finished = self.assigned, self.in_flight, self.finished
        pop_first = self.first_token.pop
        c = self.records.cols
        finish_time, tokens, outcome, reason_of, first_token = (
            c["finish_time"], c["num_output_tokens"], c["outcome"], c["finish_reason"], c["first_token_time"]
        )
        rewarded: list[tuple[int, float]] = []
        told_all = train = None
        view = self.view
        for j, ev in enumerate(batch):
            told, kind = ev, type(ev)
            rid = ev[0]
            if kind is Finished:
                chunk = None
                if turns is not None:
                    told = turns.finished(ev, reqs[rid])
                    if told is None:  # a turn ended in a tool call: the trajectory goes on
                        if told_all is None:
                            told_all = list(batch[:j])
                        continue
                    chunk = turns.suspended(rid)  # (None: a one-turn sample)
                _, t, _, n, reason = told
                ended = "finished"
                if chunk is False:  # a trajectory that ended: its reason is its last turn's
                    pass
                elif chunk or (reason == "length" and max_of[rid] < cap and not self._at_model_len(rid)):
                    if chunk or target_of[rid] > n:
                        # a chunk ended at the policy's max_tokens: the response goes on (or is dropped)
                        ended, reason = "chunk", "length"
                    else:
                        told, reason = told._replace(finish_reason="stop"), "stop"  # it ended exactly there
            elif kind is Aborted:
                if turns is not None:
                    told = turns.aborted(ev)
                t, n = told.time, told.num_output_tokens
                ended, reason = "aborted", told.reason
                if reason != "abort":  # the engine's own (SGLang's refusal): recorded as an abort with its
                    # reason, told to the policy as its sample's end, as SGLang answers it (a response ended
                    # with that reason, which frameworks count among the step's)
                    told = Finished(rid, t, told.instance, n, reason)
            else:
                told = self._handle_other(ev)
                ended = None
            if ended is not None:
                assigned[inst_of[rid]] -= 1
                pid = pid_of[rid]
                flight = in_flight[pid]
                flight.discard(rid)
                if not flight:  # (so asking whether anything flies costs the prompts in flight only)
                    del in_flight[pid]
                finish_time[rid], tokens[rid], outcome[rid], reason_of[rid] = t, n, ended, reason
                first = pop_first(rid, None)
                if first is not None:
                    first_token[rid] = first
                if ended == "finished":
                    finished.setdefault((epoch_of[rid], pid), []).append(n)
                    rewarded.append((rid, t))
                elif reason != "abort":  # the engine's own abort, told as an ended sample: scored as one
                    rewarded.append((rid, t))
            if on_event is not None:  # the adapter: the policy hears of this event before the next is booked
                if told is not None and (acts := on_event(told, view)):
                    train = self.apply(acts) or train
                continue
            if told is not ev and told_all is None:
                told_all = list(batch[:j])
            if told_all is not None and told is not None:
                told_all.append(told)
        if rewarded:  # scored in booking order, after the loop: only the update reads them
            self._rewards(rewarded)
        return train if on_event is not None else told_all

    def _at_model_len(self, rid: int) -> bool:
        """Whether request `rid`'s max_tokens is its cap under vLLM's max_model_len (its response
        ended there, as it would under any policy), not a policy's shorter chunk."""
        model_len, reqs = self.rl.max_model_len, self.requests
        return model_len is not None and reqs.max_tokens[rid] >= model_len - reqs.num_prompt_tokens[rid]

    def _quiet_prefix(self, batch, quiet) -> int:  # noqa: ANN001 - events; a count or prompt id -> count
        """How many of the batch's first events a `quiet_for` answer covers: those before the
        finish it runs to (the k-th, or a prompt's k[p]-th) and before any timer."""
        if isinstance(quiet, Mapping):
            seen: dict[int, int] = {}  # watched prompt -> its finishes so far in this batch
            prompt_of, count = self.requests.prompt_id, quiet.get
            for j, ev in enumerate(batch):
                kind = type(ev)
                if kind is Finished or (kind is Aborted and ev.reason != "abort"):  # (the latter told as a finish)
                    p = prompt_of[ev[0]]
                    c = count(p)
                    if c is not None:
                        k = seen.get(p, 0) + 1
                        if k >= c:
                            return j
                        seen[p] = k
                elif kind is Timer:
                    return j
            return len(batch)
        k = int(quiet)
        if k <= 1:
            return 0
        for j, ev in enumerate(batch):
            kind = type(ev)
            if kind is Finished or (kind is Aborted and ev.reason != "abort"):  # (the latter told as a finish)
                k -= 1
                if not k:
                    return j
            elif kind is Timer:
                return j
        return len(batch)

    def _handle_other(self, ev):  # noqa: ANN001, ANN201
        """`handle` for an event other than a finish or an abort."""
        if isinstance(ev, Preempted):
            self.records.preempted(ev.request_id)
        elif type(ev) is Timer and self.turns is not None and ev.tag in (TOOL_TAG, ABORT_TAG):
            if ev.tag == ABORT_TAG:  # a trajectory taken off the tool queue: told as aborted now
                return self.handle(self.turns.aborts.pop(0))
            nxt = self.turns.answered(ev.time, self.requests, self.rollout_version)
            if nxt:
                self.engine.submit(nxt)
            return None
        return ev

    def handle_batch(self, batch: EventBatch) -> EventBatch:
        """`handle` for a whole batch (a policy told batches): the batch the policy is told (itself,
        unless an event is told otherwise or not at all)."""
        told = self._book_events(batch)
        return batch if told is None else EventBatch(told)

    def react(self, batch: EventBatch) -> Train | None:
        """Book a batch and tell the policy: whole (`on_events`, its actions applied after the
        batch) or, through the adapter, event by event (`on_event`, each event's actions applied
        before the next is handled). Returns the Train asked for, if any."""
        if self.batched:
            batch = self.handle_batch(batch)
            acts = self.policy.on_events(batch, self.view) if batch else None
            return self.apply(acts) if acts else None
        quiet = self.quiet_for(self.view) if self.told_quiet is not None else None  # (nothing told since the step)
        return self._book_events(batch, self.policy.on_event, quiet)

    POLL_S = 0.02  # how often a real run looks whether the trainer process is done

    def _train_beside(self, learner, ids, sync: str, start: float, window):  # noqa: ANN001, ANN202
        """A real disaggregated update: the trainer process updates while the engines go on
        (events told to the policy as usual); then, unless this update skips the sync, the
        engines stop and the weights are pushed (vLLM's reload: requests still running are
        preempted and continue under the new weights). With "drain" the requests in flight
        finish first, launches held meanwhile. Answers the measured cost and the trainer's metrics."""
        engine = self.engine
        engine.call_at(start, "train_start")
        started = draining = False
        result = None
        while True:
            batch = EventBatch.of(engine.step())
            self.view.now = engine.now
            keep = []
            for i, ev in enumerate(batch):
                tag = ev.tag if type(ev) is Timer else None
                if tag == "train_start":
                    learner.start([self.requests[r] for r in ids], self.version)
                    started = True
                    engine.call_at(engine.now + self.POLL_S, "trainer_poll")
                elif tag == "trainer_poll":
                    if result is None:
                        engine.call_at(engine.now + self.POLL_S, "trainer_poll")
                else:
                    keep.append(i)
            if keep:
                self.react(batch if len(keep) == len(batch) else batch.select(keep))
            if started and result is None and learner.done():
                result = learner.finish()
                if sync == "none":
                    break
                if sync in ("drain", "interrupt"):
                    self.syncing, draining = True, sync == "drain"
                window.sync_start = engine.now
            if result is not None and draining and not any(self.in_flight.values()):
                draining = False
            if result is not None and not draining:
                window.sync_begin = engine.now
                engine.pause()
                pushed = learner.push()
                engine.resume()
                result = (dataclasses.replace(result[0], update_weights=pushed), result[1])
                break
        engine.drop_timers("trainer_poll")
        return result

    def _priced_sync(self, cost, sync: str):  # noqa: ANN001, ANN202 - a StepCost in and out
        """The step's cost as the policy runs it: no old log-prob pass where it trains on the
        engine's log-probs (`use_rollout_log_probs`), no weight sync after a local update, and the
        weights moved in buckets where it uses a checkpoint engine (`sync_bucket_bytes`)."""
        policy = self.policy
        if getattr(policy, "use_rollout_log_probs", False):  # the engine's log-probs: no recompute
            cost = dataclasses.replace(cost, old_log_prob=0.0)
        if sync == "none":
            return dataclasses.replace(cost, update_weights=0.0)
        bucket = getattr(policy, "sync_bucket_bytes", None)
        if bucket is not None:
            gpus = self.cluster.num_gpus
            cost = dataclasses.replace(cost, update_weights=weight_sync_s(self.profile, gpus, bucket))
        return cost

    def filter_groups(self, act: Train, window: StepWindow) -> Train | None:
        """Dynamic sampling: keep the batch's groups whose rewards differ; the Train of P0 valid
        groups once there are enough (or the generation batches ran out), else None."""
        groups: dict[tuple[int, int], list[int]] = {}
        for r in act.request_ids:
            q = self.requests[r]
            groups.setdefault((q.epoch, q.prompt_id), []).append(r)

        def reward(r: int) -> float:
            q = self.requests[r]
            return self.index.reward_of(q.epoch, q.prompt_id, q.sample_idx)

        self.pending.difference_update(self.groups.add(groups, reward))
        # Generate again only if this batch produced something and more can come: the epoch still
        # has prompts (its last step trains what is valid, as DAPO's dataloader ends the epoch) or
        # samples are in flight.
        more = self.take_more or any(self.in_flight.values())
        if not self.groups.done and act.request_ids and more:
            return None
        ids, surplus, stats = self.groups.take()
        self.pending.difference_update(surplus)
        window.extra.update(stats)
        return Train(tuple(ids))

    @property
    def take_more(self) -> bool:
        """Whether the current epoch still has prompts to hand out."""
        return self.epoch_ptr < len(self.order) and self.pos < len(self.order[self.epoch_ptr])

    def train(self, act: Train, window: StepWindow) -> None:
        gen_end = self.engine.now
        window.mark_gen_end(self.engine)
        ids = act.request_ids
        reward_end = max(map(self.reward_done.pop, ids), default=gen_end)  # popped: a run's memory stays flat
        rows = np.fromiter(ids, np.int64, len(ids))
        out, prompt = column(self.records.num_output_tokens)[rows], column(self.requests.num_prompt_tokens)[rows]
        lens = (out + prompt).astype(float)
        colocated = self.cluster.placement == "colocated"
        sleep = colocated and self.profile.engine.free_cache_engine
        cluster = self.cluster
        cost = step_cost(self.profile, lens, cluster.training_gpus, self.rl.use_kl_loss, sleep, cluster.num_gpus)
        sync = act.sync
        if sync not in SYNC_MODES:
            modes = ", ".join(SYNC_MODES)
            raise RlsimError(f"policy {self.policy.name} asked for weight sync {sync!r}; one of {modes}")
        cost = self._priced_sync(cost, sync)
        start = max(gen_end + cost.rollout_sleep, reward_end)
        window.train_start = start
        if colocated:
            self.engine.pause(sleep=sleep)
        # A real engine with a learner trains for real once the rewards are in: the phases take
        # the time they take, and the measured StepCost replaces the profile's.
        learner = getattr(self.engine, "learner", None)
        beside = getattr(self.engine, "async_learner", None)  # a trainer process beside the rollout
        if learner is not None and sync != "step":
            raise RlsimError(
                f"sync={sync!r} needs the rollout to go on while the trainer updates: a real run trains beside "
                "it with --placement disaggregated"
            )
        if beside is not None:
            cost, metrics = self._train_beside(beside, ids, sync, start, window)
            self.engine.call_at(self.engine.now, "train_done")
        elif learner is not None:
            self.engine.call_at(start, "train_start")
        elif sync in ("drain", "interrupt"):  # the update, then a sync that stops the rollout
            self.engine.call_at(start + cost.training, "sync_start")
        else:
            self.engine.call_at(start + cost.training + cost.rollout_wake_up + cost.update_weights, "train_done")
        metrics = metrics if beside is not None else {}
        done = draining = False
        while not done:
            batch = EventBatch.of(self.engine.step(until_idle=self.quiet))
            if not batch:
                raise RuntimeError("engine stalled while training")
            self.view.now = self.engine.now
            if not any(type(ev) is Timer for ev in batch):
                self.react(batch)
            else:
                for i, ev in enumerate(batch):  # the step's own timers, in order among the events
                    tag = ev.tag if type(ev) is Timer else None
                    if tag == "train_done":
                        done = True
                    elif tag == "train_start":
                        cost, metrics = learner([self.requests[r] for r in ids], self.version)
                        self.engine.call_at(self.engine.now, "train_done")
                    elif tag == "sync_start":
                        self.syncing, draining = True, sync == "drain"
                        window.sync_start = self.engine.now
                    else:
                        self.react(batch.select([i]))
            if draining and not any(self.in_flight.values()):
                draining = False
            if self.syncing and not draining and window.sync_begin is None:
                # the rollout stops (its KV freed: veRL clears the cache for the new weights)
                window.sync_begin = self.engine.now
                self.engine.pause(sleep=getattr(self.engine, "sleeps_for_sync", True))
                self.engine.call_at(self.engine.now + cost.update_weights, "train_done")
        if sync != "none":
            updated = getattr(self.engine, "weights_updated", None)  # (a real engine does its own)
            if updated is not None:
                updated()
        self.engine.resume()
        if sync != "none":
            self.rollout_version = self.version + 1
        window.close(reward_end, cost, self.engine.now)
        self.records.step_done(
            window, ids, self.requests, self.version, self.index, self.rl.samples_per_prompt, self.cluster.num_gpus
        )
        if metrics:  # the trainer's own (veRL's names: actor/pg_loss, critic/score/mean, ...)
            self.records.steps[-1].update(metrics)
        step_metrics = getattr(self.policy, "step_metrics", None)
        if step_metrics is not None:  # the policy's own (fully_async: veRL's fully_async/* names)
            self.records.steps[-1].update(step_metrics(self.view, ids))
        self.version += 1
        self.view.version = self.version
        if self.syncing:  # the rollout resumes under the new weights: the held launches go out
            self.syncing = False
            held, self.held = self.held, []
            if held:
                self.apply(held)
        # A visit closes once R0 of its samples trained (a policy may train them over several
        # updates, as SortedRL does trajectory by trajectory).
        counts = self.trained_count
        epochs, prompts = column(self.requests.epoch)[rows].tolist(), column(self.requests.prompt_id)[rows].tolist()
        for visit in zip(epochs, prompts, strict=True):
            counts[visit] = counts.get(visit, 0) + 1
            if counts[visit] >= self.rl.samples_per_prompt:
                self.pending.discard(visit)
                del counts[visit]
