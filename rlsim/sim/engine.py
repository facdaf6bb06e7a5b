"""SimEngine: a SimPy rollout cluster whose instances schedule as vLLM's v1 scheduler does.

One SimPy process per rollout instance (one vLLM engine on TP GPUs). The scheduling rules live
behind one seam (`rlsim.sim.rollout_scheduler.RolloutScheduler`, built by `make_scheduler` for the
engine): vLLM's are `rlsim.sim.vllm_rules.VLLMRules`, the compiled core's port of vLLM 0.32's
`Scheduler` (the same source `CompiledEngine` runs), checked iteration by iteration against it
(`rlsim.sim.sched_parity`): running requests first in running-list order,
then waiting ones under `max_num_seqs` and `max_num_batched_tokens` (chunked prefill, or not);
KV in blocks of `block_size`; a waiting or preempted request admitted only if its whole sequence
fits; preemption from the back of the running list when a request's next slots do not fit, and no
admission in an iteration that preempted; prefix caching at block granularity with vLLM's
free-queue order. This module prices iterations with the profile's cost model (each iteration's
batch, KV context, decode and prefill tokens, and the requests it prefills, which pay the
profile's per-request term) and turns the scheduler's finishes and preemptions into events.

Event jumping (`rlsim.sim.jump`): between events the decode batch is fixed, so an instance jumps
straight to its next finish or block shortage in one SimPy timeout; it runs iterations one at a
time only while a prefill or an admission is pending. A submit, abort or `pause()` arriving
mid-jump interrupts it at the next iteration boundary. `exact=True` runs every iteration one at
a time: the reference that proves the fast path.

Lockstep (`lockstep=True`, how `rlsim run --real` drives its engines: the driver calls each
engine's `step()` and reacts to its outputs before the next): an instance whose iteration
produced a finish or a preemption starts its next iteration only once the driver has taken the
events, so a submit or abort the driver makes in reaction lands before that iteration, not one
iteration later as with an engine that runs on by itself (vLLM's `AsyncLLM`, the default).
Under SGLang's rules an instance does not wait: a real SGLang instance hands the driver a batch's
outputs after launching the next batch (its overlap loop), so the driver's reaction lands before
the schedule after the one in flight, and an abort is answered at once with the tokens the
request has then, as `rlsim.real.sglang_instance` answers it.

Async scheduling (the engine's `async_scheduling`, vLLM's default on GPU executors: the engine core
schedules the next batch before the last one's tokens are known): the scheduler keeps a finished
request's place for one more schedule (`rlsim.sim.scheduler`), and a submit or abort that reaches a
busy instance lands one schedule later than it would without it, as the engine core polls its
input only after the batch it has already scheduled.

Replay (`iteration_times`, `rlsim.sim.replay`): each iteration takes the measured time of the
real one it replays instead of the profile's prediction.

Sleep (veRL's `free_cache_engine`): `pause(sleep=True)` frees every instance's KV cache (and its
prefix cache) once its iteration in progress ends. Running requests keep their generated tokens
and go back to the front of the waiting queue, so after `resume()` they re-prefill prompt plus
generated tokens.

Weight updates (`weights_updated`): under SGLang's rules an update flushes the radix cache
(`flush_cache_after_weight_update` in sglang's `weight_updater.py`, `flush_cache=True` by
default), which SGLang does only with nothing running, so RL frameworks pause it first
(`pause_generation(mode="retract")`): its running requests go back to wait, as a sleep sends
them. Under vLLM's rules an update changes no scheduling state here (the engines that sleep
for it have freed their prefix cache already).

Data-parallel attention (a profile's `data_parallel_size` D > 1: vLLM's data_parallel_size with
enable_expert_parallel): instances i D .. i D + D - 1 are the ranks of one group. Each keeps its
own scheduler and KV, but the group steps in lockstep: an iteration starts once every rank with
work has scheduled its batch, and lasts the slowest rank's own iteration plus the group's routed
experts at D x the busiest rank's tokens (`Profile.dp_group_s`: vLLM pads each rank to the
busiest one's tokens for its CUDA graphs, and runs a dummy batch on a rank with none; under
`enforce_eager` the experts see the ranks' own tokens, a dummy's one each). A rank that gets work while its
group is mid-iteration joins at the next one. Ranks run iteration by iteration (no jumps), and the
engine counts the group iterations and the idle ranks' dummy ones (`dp_counts`).

Speculative decoding (HistoSpec, `rlsim.spec.speculation`) gives a request a mean of `rate` tokens
per iteration with `verify` tokens per iteration under verification: the KV context then grows
by the batch's summed rate per iteration and the iteration charges `gamma` per verified token,
the compute-bound rate past the knee (`Profile.compute_excess_s`) and the drafter's CPU time per
speculating request, all fixed while the batch is, so the closed form still holds; a speculating
request holds `lookahead` extra KV slots.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import simpy

from rlsim.errors import RlsimError
from rlsim.profile import Profile
from rlsim.protocol import EventBatch, Finished, Request
from rlsim.rollout_engines import rollout_engine
from rlsim.sim.jump import iters_done, jump_cost
from rlsim.sim.replay import Replay
from rlsim.sim.rollout_scheduler import RolloutScheduler, make_scheduler
from rlsim.sim.seq import Seq


def request_too_large(req: Request, target: int, cap: int) -> RlsimError:
    """The error for a request whose prompt and response exceed an instance's KV capacity."""
    return RlsimError(
        f"request {req.request_id} (prompt {req.num_prompt_tokens} + response {target} tokens) needs "
        f"{req.num_prompt_tokens + target} KV tokens, more than an instance holds ({cap}): raise "
        "--gpu-memory-utilization, use a profile with more GPUs per instance, or lower --max-response-len"
    )


def head_too_large(instance: int, cap: int) -> RlsimError:
    """The error for an instance whose waiting head can never fit, with nothing running."""
    return RlsimError(
        f"instance {instance}: a request needs more KV than the capacity {cap}: raise --gpu-memory-utilization, "
        "use a profile with more GPUs per instance, or lower --max-response-len"
    )


@dataclass(slots=True)
class _Instance:
    idx: int
    sched: RolloutScheduler
    aborts: set = field(default_factory=set)
    proc: simpy.Process | None = None
    wake: simpy.Event | None = None
    jumping: bool = False
    busy: float = 0.0
    seq_time: float = 0.0  # integral of running sequences over time (batch-slot use)
    cur_batch: int = 0  # sequences of the iteration or jump in progress
    run_start: float | None = None  # start of the iteration or jump in progress
    segments: list = field(default_factory=list)  # merged (start, end) busy intervals
    emitted: bool = False  # lockstep: its last iteration produced events the driver has not seen
    # async scheduling: submits and aborts that arrived while it was busy (`incoming`) reach the
    # scheduler one schedule later (`ready`, applied before the next schedule)
    incoming: list = field(default_factory=list)
    ready: list = field(default_factory=list)
    answered: list = field(default_factory=list)  # lockstep, SGLang: aborts answered, taken before the next schedule
    flush: bool = False  # SGLang: new weights arrived; its radix cache is flushed before its next schedule
    group: _Group | None = None  # data-parallel attention: the lockstep group it is a rank of


@dataclass(slots=True)
class _Group:
    """The ranks of one data-parallel attention group, stepping in lockstep (the module docstring)."""

    ranks: list
    pending: dict = field(default_factory=dict)  # rank -> (own seconds, tokens, its start event)
    inflight: bool = False
    check: bool = False  # a start check is scheduled at this instant


class SimEngine:
    """Simulated rollout instances behind the `Engine` protocol."""

    def __init__(
        self,
        profile: Profile,
        num_instances: int,
        exact: bool = False,
        spec=None,  # noqa: ANN001 - rlsim.spec.speculation.SpecModel or None
        iteration_times: Sequence[Sequence[tuple[float, int, int]]] | None = None,
        lockstep: bool = False,
        lengths_sent: bool = False,
    ) -> None:
        # the profile under the run's engine (`rlsim.step_costs.with_engine`): its costs, its KV
        # capacity and, in `profile.engine`, every vLLM setting the scheduler follows
        engine = profile.engine
        self.profile = profile
        self.num_instances = num_instances
        self.exact = exact or iteration_times is not None
        # replay: per instance, (seconds, decode requests, prefill tokens) of each real iteration
        self._replay = Replay(iteration_times) if iteration_times is not None else None
        self.lockstep = lockstep
        # a replay-mode real run under SGLang sent each request its length as its max tokens
        # (`rlsim.real.engine`), which SGLang's rules read (its reservations, and the overlap
        # scheduler's skip of a request its queued result finishes by length); the original cap
        # still names the finish reason, as the real run names it
        self._rules = rollout_engine(engine.rollout_engine)  # what the engine's rules do (`rlsim.rollout_engines`)
        self._caps: dict[int, int] | None = {} if lengths_sent and self._rules.reads_max_tokens else None
        self.async_scheduling = engine.async_scheduling
        # whether a submit or abort reaching a busy instance lands a schedule late (the platform
        # schedules the next batch while this one runs: vLLM's async scheduling, SGLang's overlap
        # loop on a GPU); not in lockstep under SGLang, whose real instance hands the driver a
        # batch's outputs after launching the next, so that the driver's reaction lands at the
        # schedule after (`rlsim.real.sglang_instance`: the instance holds no iteration back)
        self._late_inputs = bool(engine.async_scheduling) and not (lockstep and self._rules.outputs_after_next_launch)
        self._answered: set[int] = set()  # lockstep under SGLang: aborts answered, not yet taken
        self._held: list[simpy.Event] = []
        self.replay = self._replay.counts if self._replay is not None else dict.fromkeys(Replay.COUNTS, 0)
        self.spec = spec
        self._draft_s = spec.draft_s if spec is not None else 0.0
        self.block_size = engine.block_size
        self.env = simpy.Environment()
        self._outbox = EventBatch()
        self._timed = False  # a timer fired into the outbox
        self._num_finished = 0  # finishes reported so far (what `step` counts against `finishes`)
        self._paused = False
        self._sleep = False
        self.wake_reprefill_tokens = 0  # tokens recomputed because a sleep freed their KV
        self.pause_interrupts = 0  # jumps cut short by pause() (colocated training taking the GPUs)
        self._resume = self.env.event()
        self._where: dict[int, int] = {}
        self._watch: Mapping[int, int] = {}  # `step(prompts=...)`: the driver's watched prompts (not changed)
        self._watch_left: dict[int, int] = {}  # finishes a watched prompt that finished may still have
        self._watch_hit = False
        self.first_token: dict[int, float] = {}
        kv = profile.kv_capacity_tokens
        self.instances = [_Instance(i, make_scheduler(engine, kv)) for i in range(num_instances)]
        dp = profile.data_parallel_size
        # data-parallel attention: group iterations, and rank iterations run as dummies by idle ranks
        self.dp_counts = {"group_iterations": 0, "idle_rank_iterations": 0}
        if dp > 1:
            if num_instances % dp:
                raise RlsimError(
                    f"{num_instances} rollout instances are not a whole number of data-parallel groups of {dp} ranks "
                    f"(profile {profile.name}): give the rollout a multiple of {dp * profile.instance_gpus} GPUs"
                )
            for first in range(0, num_instances, dp):
                group = _Group(self.instances[first : first + dp])
                for inst in group.ranks:
                    inst.group = group
        for inst in self.instances:
            inst.proc = self.env.process(self._run(inst))

    @property
    def prefix_hit_tokens(self) -> int:
        """Prompt tokens not computed thanks to the prefix cache."""
        return sum(inst.sched.prefix_hit_tokens for inst in self.instances)

    # ---- Engine protocol ------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.env.now

    def submit(self, requests: Sequence[Request]) -> None:
        touched = set()
        cap = self.instances[0].sched.kv_capacity_tokens if self.instances else 0
        # SGLang with parallel sampling: a launch's samples of one prompt on one instance (consecutive
        # requests) are one request with n > 1 (`SGLangScheduler.add_call`)
        calls = self.instances and self.instances[0].sched.groups_calls
        call: list[Seq] = []
        for req in requests:
            target = min(req.target_tokens, req.max_tokens)
            if req.num_prompt_tokens + target > cap and not self._rules.aborts_too_long:  # (SGLang aborts it, goes on)
                raise request_too_large(req, target, cap)
            if self._caps is not None:  # (a replay-mode real run under SGLang: see __init__)
                self._caps[req.request_id] = req.max_tokens
                req = req._replace(max_tokens=max(1, target))
            # a continued chunk's KV comes with it (Seer's global KV pool): not recomputed
            seq = Seq(req, target, generated=req.kept_tokens, transfer=req.kept_tokens > 0)
            if self.spec is not None:
                spec = self.spec.plan(req.epoch, req.prompt_id, req.sample_idx, target, req.policy_version)
                seq.rate, seq.verify = spec
                if seq.rate != 1.0:
                    seq.lookahead = self.spec.lookahead
            if calls and not req.prompt_len and not req.kept_tokens:
                last = call[-1].req if call else None
                if last is None or (last.instance, last.epoch, last.prompt_id, last.request_id + 1) != (
                    req.instance, req.epoch, req.prompt_id, req.request_id
                ):
                    self._send(call)
                    call = []
                call.append(seq)
            else:
                if call:
                    self._send(call)
                    call = []
                self._send_one(seq)
            self._where[req.request_id] = req.instance
            touched.add(req.instance)
        self._send(call)
        for i in touched:
            self._poke(self.instances[i])

    def _send_one(self, seq: Seq) -> None:
        """Hand one request to its instance, now or, while it is busy under async scheduling,
        before its schedule after next (every request but those of a parallel-sampling call)."""
        inst = self.instances[seq.req.instance]
        if self._defer(inst):
            inst.incoming.append(("submit", seq))
        else:
            inst.sched.add(seq)

    def _send(self, seqs: list[Seq]) -> None:
        """Hand one request (or one call of several samples) to its instance, now or, while it is
        busy under async scheduling, before its schedule after next."""
        if len(seqs) <= 1:
            if seqs:
                self._send_one(seqs[0])
            return
        inst = self.instances[seqs[0].req.instance]
        if self._defer(inst):
            inst.incoming.append(("call", seqs))
        else:
            inst.sched.add_call(seqs)

    def abort(self, request_ids: Iterable[int]) -> None:
        request_ids = list(request_ids)
        if self.lockstep and self._rules.outputs_after_next_launch:  # answered now, taken before the next schedule
            rest = []
            for rid in request_ids:
                i = self._where.get(rid)
                inst = self.instances[i] if i is not None else None
                if inst is None or not self._answer_abort(inst, rid):
                    rest.append(rid)
                elif inst.run_start is None:
                    self._abort_silently(inst, [rid])
                else:
                    inst.answered.append(rid)
                    self._poke(inst)
            request_ids = rest
        elif self._late_inputs:
            now = []
            for rid in request_ids:
                i = self._where.get(rid)
                if i is not None and self._defer(self.instances[i]):
                    self.instances[i].incoming.append(("abort", rid))
                    self._poke(self.instances[i])
                else:
                    now.append(rid)
            request_ids = now
        self._abort_now(request_ids)

    def _answer_abort(self, inst: _Instance, rid: int) -> bool:
        """Lockstep under SGLang: answer an abort when it is asked, with the tokens the request has
        now, as a real run's instance answers it (`SglangInstance.abort`); the scheduler takes it
        before its next schedule, as SGLang's loop does. False for a request whose finish is
        already on its way (its `Finished` answers instead)."""
        sched = inst.sched
        seq = sched.find(rid)
        if seq is None or seq.reported:
            return False
        self._outbox.aborted(rid, self.env.now, inst.idx, sched.generated(seq))
        del self._where[rid]
        self._answered.add(rid)  # a finish before the scheduler takes the abort is not reported
        return True

    def _abort_silently(self, inst: _Instance, rids: list[int]) -> None:
        """The scheduler's side of aborts already answered (`_answer_abort`)."""
        sched = inst.sched
        sched.remove_waiting(set(rids))
        for rid in rids:
            seq = sched.running_seq(rid)
            if seq is not None and not seq.reported:
                sched.abort(seq)
            self._answered.discard(rid)

    def _abort_now(self, request_ids: list[int]) -> None:
        """Abort these requests before the next schedule (waiting ones at once)."""
        by_inst: dict[int, set[int]] = {}
        for rid in request_ids:
            i = self._where.get(rid)
            if i is not None:
                by_inst.setdefault(i, set()).add(rid)
        gone = {}  # waiting requests, taken out of each queue in one pass
        for i, rids in by_inst.items():
            gone.update((seq.req.request_id, seq) for seq in self.instances[i].sched.remove_waiting(rids))
        for rid in request_ids:  # events in the order given
            i = self._where.get(rid)
            if i is None:
                continue
            seq = gone.get(rid)
            if seq is not None:
                del self._where[rid]
                self._outbox.aborted(rid, self.env.now, i, seq.generated)
                continue
            inst = self.instances[i]
            inst.aborts.add(rid)
            if inst.run_start is None:  # between iterations (idle or paused): abort now
                self._apply_aborts(inst)
            else:
                self._poke(inst)

    def call_at(self, when: float, tag: str) -> None:
        def fire(_: simpy.Event) -> None:
            self._outbox.timer(tag, self.env.now)
            self._timed = True

        self.env.timeout(max(0.0, when - self.env.now)).callbacks.append(fire)

    def pause(self, sleep: bool = False) -> None:
        """Start no new iteration; a jump in progress stops after its current iteration.
        `sleep=True` also frees the KV cache (veRL's hybrid engine during training)."""
        self._paused, self._sleep = True, sleep
        for inst in self.instances:
            if inst.run_start is None:  # idle or already between iterations
                if sleep:
                    self._free_kv(inst)
            elif inst.jumping:
                inst.jumping = False
                inst.proc.interrupt()
                self.pause_interrupts += 1

    def weights_updated(self) -> None:
        """New weights reached the rollout: under SGLang's rules each instance flushes its radix
        cache, retracting what runs, once its iteration in progress ends (see the module docstring)."""
        if not self._rules.flushes_on_weight_update:
            return
        for inst in self.instances:
            if inst.run_start is None:  # idle, paused or between iterations
                self._flush(inst)
            else:  # at the end of the iteration in progress (a jump stops after its current one)
                inst.flush = True
                self._poke(inst)

    def _flush(self, inst: _Instance) -> None:
        inst.flush = False
        self._free_kv(inst)

    def resume(self) -> None:
        self._paused = self._sleep = False
        if not self._resume.triggered:
            self._resume.succeed()
        self._resume = self.env.event()

    def step(self, until_idle: bool = False, finishes: int = 1, prompts: Mapping[int, int] | None = None) -> EventBatch:
        env = self.env
        # a watched prompt's count is read at its first finish (`_finished`): the driver watches
        # hundreds, thousands of prompts a call, few of which finish before it returns
        self._watch, self._watch_left, self._watch_hit = prompts or {}, {}, False
        if self._held:  # lockstep: the driver has seen the outputs; the instances go on
            held, self._held = self._held, []
            for hold in held:
                hold.succeed()
        outbox, peek, advance = self._outbox, env.peek, env.step
        before = self._num_finished  # (every finish in the outbox came during this call)
        while not outbox:
            if peek() == math.inf:
                return EventBatch()
            advance()
        now = env.now
        while peek() <= now:  # everything else happening at this instant
            advance()
        if (until_idle or finishes > 1) and not self.lockstep:  # on, instant by instant, while requests run
            where = self._where  # and no timer fired (and fewer than `finishes` finished,
            while where and not self._timed and peek() < math.inf:  # no watched prompt as many as it may)
                if not until_idle and (self._num_finished - before >= finishes or self._watch_hit):
                    break
                advance()
                now = env.now
                while peek() <= now:
                    advance()
        out, self._outbox, self._timed = self._outbox, EventBatch(), False
        self._watch, self._watch_left = {}, {}
        if self.lockstep:  # the driver sees these events now: an instance that has not yet held need not
            for inst in self.instances:
                inst.emitted = False
        return out

    def busy_time(self, instance: int) -> float:
        inst = self.instances[instance]
        extra = self.env.now - inst.run_start if inst.run_start is not None else 0.0
        return inst.busy + extra

    def seq_time(self, instance: int) -> float:
        """Sequence-seconds run on this instance so far (running sequences integrated over
        time): against `max_num_seqs` x wall time it gives the batch-slot bubble."""
        inst = self.instances[instance]
        extra = (self.env.now - inst.run_start) * inst.cur_batch if inst.run_start is not None else 0.0
        return inst.seq_time + extra

    @property
    def max_num_seqs(self) -> int:
        return self.profile.engine.max_num_seqs

    def segments(self, instance: int) -> list[tuple[float, float]]:
        """Merged busy intervals in time order, the iteration or jump in progress counted up to now (as
        `busy_time` counts it), so an instance mid-jump and one mid-iteration read the same."""
        inst = self.instances[instance]
        segs = list(inst.segments)
        if inst.run_start is not None and self.env.now > inst.run_start:
            if segs and segs[-1][1] >= inst.run_start - 1e-12:
                segs[-1] = (segs[-1][0], self.env.now)
            else:
                segs.append((inst.run_start, self.env.now))
        return segs

    # ---- internals ------------------------------------------------------------------------
    def _defer(self, inst: _Instance) -> bool:
        """Async scheduling (or SGLang's overlap loop): whether what reaches this instance now lands
        a schedule late (an iteration is in flight, or earlier arrivals wait; an idle or paused
        engine takes it at once)."""
        return self._late_inputs and (inst.run_start is not None or bool(inst.ready or inst.incoming))

    def _take_arrivals(self, inst: _Instance) -> None:
        """Async scheduling, before a schedule: what arrived before the previous schedule lands
        now, what arrived since waits for the next one (all of it lands if the instance is idle or
        paused: no schedule is coming for it to wait behind)."""
        s = inst.sched
        if self._paused or not s.has_work():
            land, inst.ready, inst.incoming = inst.ready + inst.incoming, [], []
        else:
            land, inst.ready, inst.incoming = inst.ready, inst.incoming, []
        aborts = []
        for kind, item in land:
            if kind == "submit":
                s.add(item)
            elif kind == "call":
                s.add_call(item)
            else:
                aborts.append(item)
        if aborts:
            self._abort_now(aborts)

    def _poke(self, inst: _Instance) -> None:
        if inst.wake is not None and not inst.wake.triggered:
            inst.wake.succeed()
        elif inst.jumping:
            inst.jumping = False  # one interrupt per jump
            inst.proc.interrupt()

    def _busy(self, inst: _Instance, start: float, end: float) -> None:
        inst.run_start = None
        if end <= start:
            return
        inst.busy += end - start
        if inst.segments and inst.segments[-1][1] >= start - 1e-12:
            inst.segments[-1] = (inst.segments[-1][0], end)
        else:
            inst.segments.append((start, end))

    def _apply_aborts(self, inst: _Instance) -> None:
        sched = inst.sched
        for rid in list(inst.aborts):
            seq = sched.running_seq(rid)
            if seq is not None and not seq.reported:  # (a reported one has finished already)
                gen = sched.abort(seq)
                self._outbox.aborted(rid, self.env.now, inst.idx, gen)
                self._where.pop(rid, None)
        inst.aborts.clear()

    def _finished(self, inst: _Instance, done: list[Seq]) -> None:
        if self._answered and done:  # finishes of requests whose abort was answered already (`_answer_abort`)
            answered = self._answered
            kept = [seq for seq in done if seq.req.request_id not in answered]
            answered.difference_update(seq.req.request_id for seq in done)
            done = kept
        if not done:
            return
        now = self.env.now
        inst.emitted = True
        self._num_finished += len(done)
        append, where, generated, watch = self._outbox.append, self._where, inst.sched.generated, self._watch
        own_abort = inst.sched.own_abort
        for seq in done:
            rid = seq.req.request_id
            if (why := own_abort(seq)) is not None:  # the engine aborted it of its own accord, and went on
                self._outbox.aborted(rid, now, inst.idx, 0, why)  # (the driver tells it as the sample's end)
                if self._caps:
                    self._caps.pop(rid, None)
            else:
                gen = generated(seq)  # (async: an end-of-sequence stop still decodes, its count in start_iter)
                cap = self._caps.pop(rid) if self._caps else seq.req.max_tokens
                append(Finished(rid, now, inst.idx, gen, "length" if gen >= cap else "stop"))
            where.pop(rid, None)
            if watch and seq.req.prompt_id in watch:  # a watched prompt's finish (a count below 1 counts 1)
                pid = seq.req.prompt_id
                left = self._watch_left.get(pid)
                if left is None:
                    left = max(watch[pid], 1)
                if left > 0:
                    left = self._watch_left[pid] = left - 1
                    self._watch_hit = self._watch_hit or not left

    def _lockstep(self, inst: _Instance, own_s: float, tokens: int):  # noqa: ANN202 - SimPy generator
        """Run a data-parallel rank's scheduled batch as part of its group's next iteration: wait
        for it to start, then for it to end; (its start, its seconds)."""
        group, go = inst.group, self.env.event()
        group.pending[inst.idx] = (own_s, tokens, go)
        self._group_check(group)
        took = yield go
        start = inst.run_start = self.env.now
        yield self.env.timeout(took)
        return start, took

    def _group_check(self, group: _Group) -> None:
        """Start the group's next iteration once everything at this instant has run (every rank
        that finished the last one has scheduled again, or gone idle)."""
        if not group.check:
            group.check = True
            self.env.timeout(0).callbacks.append(lambda _: self._group_start(group))

    def _group_start(self, group: _Group) -> None:
        group.check = False
        if group.inflight or not group.pending:
            return
        pending = group.pending.values()
        idle = len(group.ranks) - len(group.pending)  # each runs a dummy batch of one token
        tokens = [n for _, n, _ in pending]
        took = max(own for own, _, _ in pending) + self.profile.dp_group_s(max(tokens), sum(tokens) + idle)
        group.inflight = True
        self.env.timeout(took).callbacks.append(lambda _: self._group_end(group))  # before the ranks' own ends
        self.dp_counts["group_iterations"] += 1
        self.dp_counts["idle_rank_iterations"] += idle
        for _, _, go in pending:
            go.succeed(took)
        group.pending = {}

    def _group_end(self, group: _Group) -> None:
        group.inflight = False
        self._group_check(group)  # ranks that scheduled during the iteration start the next

    def _free_kv(self, inst: _Instance) -> None:
        """Sleep: drop every running request's KV and the prefix cache; running requests wait,
        first in their running order, to re-prefill prompt plus generated tokens on wake."""
        for seq in inst.sched.free_all():
            self.wake_reprefill_tokens += seq.req.num_prompt_tokens + seq.generated

    def _run(self, inst: _Instance):  # noqa: ANN202 - SimPy generator
        env, sched, p = self.env, inst.sched, self.profile
        while True:
            if inst.ready or inst.incoming:
                self._take_arrivals(inst)
            if inst.answered:
                self._abort_silently(inst, inst.answered)
                inst.answered = []
            if inst.aborts:
                self._apply_aborts(inst)
            if inst.flush:
                self._flush(inst)
            if self._paused:
                if self._sleep:
                    self._free_kv(inst)
                sched.on_idle()  # (an engine left with nothing has idled before the pause reached it)
                yield self._resume
                continue
            if not sched.has_work():
                sched.on_idle()  # SGLang: a fully idle engine's new-token ratio goes back to its start
                inst.wake = env.event()
                yield inst.wake
                inst.wake = None
                continue
            if self.lockstep and inst.emitted and not self._rules.outputs_after_next_launch:
                inst.emitted = False
                # the previous iteration's outputs reach the driver before the next one starts
                hold = env.event()
                self._held.append(hold)
                yield hold
                continue
            # an arrival that lands after the next schedule lets only one iteration run first
            k = 0 if self.exact or inst.ready or inst.group is not None else sched.jump_plan()
            start = inst.run_start = env.now
            if k == 0:
                out = sched.schedule()
                for seq in out.preempted:
                    if not seq.reported and seq.req.request_id >= 0:  # (async: a finished one's slot; a warm-up)
                        self._outbox.preempted(seq.req.request_id, env.now, inst.idx, seq.generated)
                        inst.emitted = True
                batch = out.num_decodes + len(out.chunks)
                if batch == 0 and not out.preempted and sched.holds_finished():  # async: only finished ones held slots
                    sched.release_finishing()
                    inst.run_start = None
                    continue
                if batch == 0 and not out.preempted:  # nothing running and the head cannot fit
                    raise head_too_large(inst.idx, sched.kv_capacity_tokens)
                if batch:
                    took = p.iteration_s(batch, sched.ctx, out.decode_tokens, out.prefill_tokens, len(out.chunks))
                    took += p.compute_excess_s(out.decode_tokens) + self._draft_s * sched.num_speculating
                    if self._replay is not None:
                        took = self._replay.took(inst.idx, out, took)
                    inst.cur_batch = batch
                    if inst.group is None:
                        yield env.timeout(took)
                    else:  # its group's iteration, which starts when every rank with work has scheduled
                        start, took = yield from self._lockstep(inst, took, out.decode_tokens + out.prefill_tokens)
                    inst.seq_time += batch * took
                done = sched.complete(out)
                for seq, _ in out.chunks:
                    if seq.generated and seq.req.request_id >= 0:  # its prefill ended: the first token is out
                        self.first_token.setdefault(seq.req.request_id, env.now)
                self._busy(inst, start, env.now)
                self._finished(inst, done)
            else:
                total, _ = jump_cost(p, sched, self._draft_s, k)
                inst.cur_batch = sched.num_decoding
                inst.jumping = True
                try:
                    yield env.timeout(total)
                    done_k = k
                except simpy.Interrupt:
                    done_k = iters_done(p, sched, self._draft_s, env.now - start, k)
                    if done_k < k:
                        done_k += 1  # the iteration in progress completes
                    end = start + jump_cost(p, sched, self._draft_s, done_k)[0]
                    inst.jumping = False
                    if end > env.now:
                        yield env.timeout(end - env.now)
                inst.jumping = False
                inst.seq_time += sched.num_decoding * (env.now - start)
                sched.advance(done_k)
                self._busy(inst, start, env.now)
                self._finished(inst, sched.finish_due())
