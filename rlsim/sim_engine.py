"""SimEngine: a SimPy rollout cluster with vLLM continuous-batching semantics.

One SimPy process per rollout instance (one vLLM engine on TP GPUs). Each instance keeps vLLM's
`waiting` queue and `running` list: at every iteration boundary it admits waiting requests
(FCFS) while `max_num_seqs`, the token budget `max_num_batched_tokens` (chunked prefill) and the
KV capacity allow; when decode growth would overflow the KV cache it preempts the most recently
admitted request (its KV is dropped; it is recomputed, prompt plus generated tokens, on
readmission); a request finishes at its target length, `finish_reason = length` when that is
its `max_tokens` cap.

Event jumping: between events the decode batch is fixed (B sequences, KV context C growing by B
per iteration), so k iterations cost `k*(t_w + (alpha+gamma)*B + beta*C) + beta*B*k*(k-1)/2`.
An instance runs iterations one at a time only while a prefill or an admission is pending, and
otherwise jumps straight to the next finish or KV exhaustion. A submit or abort arriving mid-jump
interrupts it: the iterations already done (and the one in progress) are committed, and the
instance re-plans at the next iteration boundary; `pause()` (colocated training takes the GPUs)
interrupts a jump the same way, so no token is generated during training. `exact=True` runs
every iteration one at a time: the reference that proves the fast path.

Sleep (veRL's `free_cache_engine`): `pause(sleep=True)` frees every instance's KV cache once its
iteration in progress ends. Running requests keep their generated tokens and go back to the front
of the waiting queue, so after `resume()` they re-prefill prompt plus generated tokens.

Prefix caching (vLLM v1, on by default): a prompt's KV is held once per instance while any
request of it runs there; a request whose prompt is cached computes only its own tokens (at
least the last prompt token, as vLLM recomputes one token on a full hit). When the last holder
leaves, the prompt's KV stays cached in free memory (least recently freed evicted first), so a
preempted or later sibling reuses it. KV is counted in tokens here (vLLM allocates blocks).

Speculative decoding (HistoSpec, `rlsim.speculation`) gives a request a mean of `rate` tokens
per iteration with `verify` tokens per iteration under verification: the KV context then grows
by the batch's summed rate per iteration and the iteration charges `gamma` per verified token,
so the closed form still holds.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import simpy

from rlsim.profile import Profile
from rlsim.protocol import Aborted, Event, Finished, Preempted, Request, Timer


@dataclass(slots=True)
class _Seq:
    req: Request
    target: int  # tokens to generate: min(trace length, max_tokens)
    generated: int = 0  # committed at the last (re)start or preemption
    prefilled: int = 0  # KV tokens already computed since the last admission
    start_iter: int = 0  # instance iteration count when decoding (re)started
    finish_iter: int = 0
    decoding: bool = False
    preemptions: int = 0
    rate: float = 1.0  # tokens per decode iteration (> 1 under speculative decoding)
    verify: float = 1.0  # tokens per iteration under verification
    skip: int = 0  # prompt tokens found in the prefix cache at this admission (not computed)
    pshared: int = 0  # computed prompt tokens whose KV sits in the instance's prefix entry


@dataclass(slots=True)
class _Instance:
    idx: int
    waiting: deque = field(default_factory=deque)
    running: dict = field(default_factory=dict)  # rid -> _Seq, admission order
    heap: list = field(default_factory=list)  # (finish_iter, rid) of decoding sequences
    iters: int = 0
    kv: float = 0  # KV tokens held
    n_dec: int = 0
    rate_sum: float = 0.0  # KV growth per iteration of the decoding sequences
    verify_sum: float = 0.0  # tokens computed per iteration by the decoding sequences
    aborts: set = field(default_factory=set)
    prefix: dict = field(default_factory=dict)  # prompt_id -> [holders, tokens] (KV held, in `kv`)
    cached: dict = field(default_factory=dict)  # prompt_id -> tokens: freed, still reusable (LRU order)
    cached_tokens: int = 0
    proc: simpy.Process | None = None
    wake: simpy.Event | None = None
    jumping: bool = False
    busy: float = 0.0
    run_start: float | None = None  # start of the iteration or jump in progress
    segments: list = field(default_factory=list)  # merged (start, end) busy intervals


class SimEngine:
    """Simulated rollout instances behind the `Engine` protocol."""

    def __init__(
        self,
        profile: Profile,
        num_instances: int,
        exact: bool = False,
        spec=None,  # noqa: ANN001 - rlsim.speculation.SpecModel or None
        enable_prefix_caching: bool = True,
    ) -> None:
        self.profile = profile
        self.num_instances = num_instances
        self.exact = exact
        self.spec = spec
        self.caching = enable_prefix_caching
        self.env = simpy.Environment()
        self._outbox: list[Event] = []
        self._paused = False
        self._sleep = False
        self.prefix_hit_tokens = 0  # prompt tokens not computed thanks to the prefix cache
        self.wake_reprefill_tokens = 0  # tokens recomputed because a sleep freed their KV
        self.pause_interrupts = 0  # jumps cut short by pause() (colocated training taking the GPUs)
        self._resume = self.env.event()
        self._where: dict[int, int] = {}
        self.first_token: dict[int, float] = {}
        self.instances = [_Instance(i) for i in range(num_instances)]
        for inst in self.instances:
            inst.proc = self.env.process(self._run(inst))

    # ---- Engine protocol ------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.env.now

    def submit(self, requests: Sequence[Request]) -> None:
        touched = set()
        for req in requests:
            inst = self.instances[req.instance]
            target = min(req.target_tokens, req.max_tokens)
            seq = _Seq(req, target)
            if self.spec is not None:
                seq.rate, seq.verify = self.spec.plan(req.epoch, req.prompt_id, req.sample_idx, target)
            inst.waiting.append(seq)
            self._where[req.request_id] = req.instance
            touched.add(req.instance)
        for i in touched:
            self._poke(self.instances[i])

    def abort(self, request_ids: Iterable[int]) -> None:
        for rid in request_ids:
            i = self._where.get(rid)
            if i is None:
                continue
            inst = self.instances[i]
            for seq in inst.waiting:
                if seq.req.request_id == rid:
                    inst.waiting.remove(seq)
                    del self._where[rid]
                    self._outbox.append(Aborted(rid, self.env.now, i, seq.generated))
                    break
            else:
                inst.aborts.add(rid)
                if inst.run_start is None:  # between iterations (idle or paused): abort now
                    self._apply_aborts(inst)
                else:
                    self._poke(inst)

    def call_at(self, when: float, tag: str) -> None:
        def fire(_: simpy.Event) -> None:
            self._outbox.append(Timer(tag, self.env.now))

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

    def resume(self) -> None:
        self._paused = self._sleep = False
        if not self._resume.triggered:
            self._resume.succeed()
        self._resume = self.env.event()

    def step(self) -> list[Event]:
        env = self.env
        outbox, peek, advance = self._outbox, env.peek, env.step
        while not outbox:
            if peek() == math.inf:
                return []
            advance()
            outbox = self._outbox
        now = env.now
        while peek() <= now:  # everything else happening at this instant
            advance()
        out, self._outbox = self._outbox, []
        return out

    def busy_time(self, instance: int) -> float:
        inst = self.instances[instance]
        extra = self.env.now - inst.run_start if inst.run_start is not None else 0.0
        return inst.busy + extra

    def segments(self, instance: int) -> list[tuple[float, float]]:
        return list(self.instances[instance].segments)

    # ---- internals ------------------------------------------------------------------------
    def _poke(self, inst: _Instance) -> None:
        if inst.wake is not None and not inst.wake.triggered:
            inst.wake.succeed()
        elif inst.jumping:
            inst.jumping = False  # one interrupt per jump
            inst.proc.interrupt()

    def _generated(self, inst: _Instance, seq: _Seq) -> int:
        if not seq.decoding:
            return seq.generated
        done = int((inst.iters - seq.start_iter) * seq.rate + 1e-9)
        return seq.generated + min(done, seq.target - seq.generated)

    def _busy(self, inst: _Instance, start: float, end: float) -> None:
        inst.run_start = None
        inst.busy += end - start
        if inst.segments and inst.segments[-1][1] >= start - 1e-12:
            inst.segments[-1] = (inst.segments[-1][0], end)
        else:
            inst.segments.append((start, end))

    def _drop(self, inst: _Instance, seq: _Seq) -> int:
        """Remove a running sequence, free its KV, return the tokens it generated."""
        gen = self._generated(inst, seq)
        del inst.running[seq.req.request_id]
        own = seq.prefilled - min(seq.prefilled, seq.pshared)
        inst.kv -= own + ((inst.iters - seq.start_iter) * seq.rate if seq.decoding else 0)
        if self.caching:
            pid = seq.req.prompt_id
            entry = inst.prefix[pid]
            entry[0] -= 1
            if entry[0] == 0:  # the last holder left: the prompt's KV stays cached in free memory
                del inst.prefix[pid]
                inst.kv -= entry[1]
                inst.cached[pid] = entry[1]
                inst.cached_tokens += entry[1]
        seq.prefilled = seq.skip = seq.pshared = 0
        if seq.decoding:
            inst.n_dec -= 1
            inst.rate_sum -= seq.rate
            inst.verify_sum -= seq.verify
            if inst.n_dec == 0:  # no float drift left behind
                inst.rate_sum = inst.verify_sum = 0.0
        return gen

    def _apply_aborts(self, inst: _Instance) -> None:
        for rid in list(inst.aborts):
            seq = inst.running.get(rid)
            if seq is not None:
                gen = self._drop(inst, seq)
                self._outbox.append(Aborted(rid, self.env.now, inst.idx, gen))
                self._where.pop(rid, None)
        inst.aborts.clear()

    def _preempt_for(self, inst: _Instance, need: float) -> int:
        """Preempt the most recently admitted requests until `need` more KV tokens fit."""
        cap = self.profile.kv_capacity_tokens
        count = 0
        while inst.running and inst.kv + need > cap:
            rid, seq = next(reversed(inst.running.items()))
            was_decoding = seq.decoding
            gen = self._drop(inst, seq)
            need -= seq.rate if was_decoding else 0
            seq.generated, seq.decoding = gen, False
            seq.preemptions += 1
            inst.waiting.appendleft(seq)
            self._outbox.append(Preempted(rid, self.env.now, inst.idx, gen))
            count += 1
        return count

    def _finish_due(self, inst: _Instance) -> None:
        heap = inst.heap
        while heap and heap[0][0] <= inst.iters:
            _, rid = heapq.heappop(heap)
            seq = inst.running.get(rid)
            if seq is None or not seq.decoding or seq.finish_iter != inst.iters:
                continue  # stale entry (aborted or preempted)
            gen = self._drop(inst, seq)
            reason = "length" if gen >= seq.req.max_tokens else "stop"
            self._outbox.append(Finished(rid, self.env.now, inst.idx, gen, reason))
            self._where.pop(rid, None)

    def _free_kv(self, inst: _Instance) -> None:
        """Sleep: drop every running request's KV and the prefix cache; running requests wait,
        first in their admission order, to re-prefill prompt plus generated tokens on wake."""
        carried = list(inst.running.values())
        for seq in carried:
            gen = self._drop(inst, seq)
            seq.generated, seq.decoding = gen, False
            self.wake_reprefill_tokens += seq.req.num_prompt_tokens + gen
        inst.waiting.extendleft(reversed(carried))
        inst.heap.clear()
        inst.prefix.clear()
        inst.cached.clear()
        inst.kv = inst.cached_tokens = 0

    def _evict(self, inst: _Instance) -> None:
        """Drop least recently freed prompt KV until held plus cached fits the capacity."""
        cap = self.profile.kv_capacity_tokens
        while inst.cached and inst.kv + inst.cached_tokens > cap:
            pid = next(iter(inst.cached))
            inst.cached_tokens -= inst.cached.pop(pid)

    def _admission(self, inst: _Instance, seq: _Seq, budget: int) -> tuple[int, int]:
        """(tokens of the first chunk, KV tokens it allocates) if `seq` were admitted now."""
        prompt = seq.req.num_prompt_tokens
        if not self.caching:
            take = min(prompt + seq.generated, budget)
            return take, take
        pid = seq.req.prompt_id
        held = pid in inst.prefix
        skip = (prompt if seq.generated else prompt - 1) if held or pid in inst.cached else 0
        take = min(prompt + seq.generated - skip, budget)
        return take, take - min(take, prompt - skip) + (0 if held else prompt)

    def _attach(self, inst: _Instance, seq: _Seq) -> None:
        """Admit `seq`'s prompt into the prefix cache (shared, revived from free memory, or new)."""
        if not self.caching:
            return
        prompt, pid = seq.req.num_prompt_tokens, seq.req.prompt_id
        entry = inst.prefix.get(pid)
        if entry is None:
            hit = inst.cached.pop(pid, None)
            if hit is not None:
                inst.cached_tokens -= hit
            inst.prefix[pid] = [1, prompt]
            inst.kv += prompt
        else:
            entry[0] += 1
            hit = prompt
        seq.skip = 0 if hit is None else (prompt if seq.generated else prompt - 1)
        seq.pshared = prompt - seq.skip
        self.prefix_hit_tokens += seq.skip

    def _prefill_kv(self, seq: _Seq, take: int) -> int:
        """KV tokens a prefill chunk of `take` tokens allocates (shared prompt tokens are held by
        the prefix entry)."""
        return take - min(take, max(0, seq.pshared - seq.prefilled))

    def _start_decoding(self, inst: _Instance, seq: _Seq) -> None:
        seq.decoding = True
        seq.start_iter = inst.iters
        seq.finish_iter = inst.iters + math.ceil((seq.target - seq.generated) / seq.rate - 1e-9)
        inst.n_dec += 1
        inst.rate_sum += seq.rate
        inst.verify_sum += seq.verify
        heapq.heappush(inst.heap, (seq.finish_iter, seq.req.request_id))

    def _one_iteration(self, inst: _Instance) -> tuple[float, list[tuple[_Seq, int]]]:
        """Schedule one iteration (decodes, then admissions/prefill chunks); return its cost."""
        p = self.profile
        preempted = self._preempt_for(inst, inst.rate_sum)
        budget = p.max_num_batched_tokens - math.ceil(inst.verify_sum)
        chunks: list[tuple[_Seq, int]] = []
        partial = inst.running.values() if len(inst.running) > inst.n_dec else ()  # skip the scan when none
        for seq in partial:  # continue partial prefills first
            if not seq.decoding and budget > 0:
                need = seq.req.num_prompt_tokens + seq.generated - seq.skip - seq.prefilled
                room = int(p.kv_capacity_tokens - inst.kv - inst.rate_sum)
                take = min(need, budget, max(0, seq.pshared - seq.prefilled) + max(0, room))
                if take > 0:
                    chunks.append((seq, take))
                    budget -= take
                    inst.kv += self._prefill_kv(seq, take)
        # As in vLLM, no admissions in an iteration that had to preempt.
        while not preempted and inst.waiting and budget > 0 and len(inst.running) < p.max_num_seqs:
            seq = inst.waiting[0]
            take, kv = self._admission(inst, seq, budget)
            if inst.kv + inst.rate_sum + kv > p.kv_capacity_tokens:
                break
            inst.waiting.popleft()
            inst.running[seq.req.request_id] = seq
            self._attach(inst, seq)
            chunks.append((seq, take))
            budget -= take
            inst.kv += self._prefill_kv(seq, take)
        if inst.cached_tokens:
            self._evict(inst)
        prefill = sum(t for _, t in chunks)
        batch = inst.n_dec + len(chunks)
        dt = p.iteration_s(batch, inst.kv, inst.verify_sum, prefill)
        return dt, chunks

    def _jump_plan(self, inst: _Instance) -> int:
        """Iterations until the next finish or KV exhaustion (0: run one exact iteration)."""
        if self.exact or not inst.heap or inst.n_dec != len(inst.running):
            return 0
        if inst.waiting and len(inst.running) < self.profile.max_num_seqs:
            budget = self.profile.max_num_batched_tokens - math.ceil(inst.verify_sum)
            _, kv = self._admission(inst, inst.waiting[0], budget)
            if budget > 0 and inst.kv + inst.rate_sum + kv <= self.profile.kv_capacity_tokens:
                return 0  # an admission is possible now
        k_finish = inst.heap[0][0] - inst.iters
        k_kv = int((self.profile.kv_capacity_tokens - inst.kv) // inst.rate_sum)
        return max(0, min(k_finish, k_kv))

    def _jump_cost(self, inst: _Instance, k: int) -> tuple[float, float]:
        p, b = self.profile, inst.n_dec
        a = p.t_w_s + p.alpha_s * b + p.gamma_s * inst.verify_sum + p.beta_s * inst.kv
        q = p.beta_s * inst.rate_sum
        return a * k + q * k * (k - 1) / 2, q  # (total, per-iteration increment)

    def _iters_done(self, inst: _Instance, elapsed: float, k: int) -> int:
        """Whole iterations of a jump completed after `elapsed` seconds (at most k)."""
        total, q = self._jump_cost(inst, 1)
        a = total
        if q == 0:
            n = int(elapsed / a)
        else:  # q/2 n^2 + (a - q/2) n - elapsed = 0
            bq = a - q / 2
            n = int((-bq + math.sqrt(bq * bq + 2 * q * elapsed)) / q)
        while n > 0 and self._jump_cost(inst, n)[0] > elapsed + 1e-12:
            n -= 1
        while n + 1 <= k and self._jump_cost(inst, n + 1)[0] <= elapsed:
            n += 1
        return min(n, k)

    def _advance(self, inst: _Instance, k: int) -> None:
        inst.iters += k
        inst.kv += k * inst.rate_sum
        if inst.cached_tokens:
            self._evict(inst)

    def _run(self, inst: _Instance):  # noqa: ANN202 - SimPy generator
        env = self.env
        while True:
            if inst.aborts:
                self._apply_aborts(inst)
            if self._paused:
                if self._sleep and (inst.running or inst.prefix or inst.cached):
                    self._free_kv(inst)
                yield self._resume
                continue
            if not inst.running and not inst.waiting:
                inst.wake = env.event()
                yield inst.wake
                inst.wake = None
                continue
            k = self._jump_plan(inst)
            start = inst.run_start = env.now
            if k == 0:
                dt, chunks = self._one_iteration(inst)
                if not chunks and inst.n_dec == 0:  # nothing schedulable (KV too small)
                    raise RuntimeError(
                        f"instance {inst.idx}: request needs more KV than the capacity "
                        f"{self.profile.kv_capacity_tokens}"
                    )
                yield env.timeout(dt)
                self._advance(inst, 1)
                for seq, take in chunks:
                    seq.prefilled += take
                    if seq.prefilled >= seq.req.num_prompt_tokens + seq.generated - seq.skip:
                        seq.generated += 1  # the prefill iteration samples the first token
                        seq.prefilled += 1
                        inst.kv += 1
                        self._start_decoding(inst, seq)
                        self.first_token.setdefault(seq.req.request_id, env.now)
                self._busy(inst, start, env.now)
            else:
                total, _ = self._jump_cost(inst, k)
                inst.jumping = True
                try:
                    yield env.timeout(total)
                    done = k
                except simpy.Interrupt:
                    done = self._iters_done(inst, env.now - start, k)
                    if done < k:
                        done += 1  # the iteration in progress completes
                    end = start + self._jump_cost(inst, done)[0]
                    inst.jumping = False
                    if end > env.now:
                        yield env.timeout(end - env.now)
                inst.jumping = False
                self._advance(inst, done)
                self._busy(inst, start, env.now)
            self._finish_due(inst)
