"""InstanceScheduler: vLLM v1's scheduling rules for one rollout instance, iteration by iteration.

A port of what `vllm.v1.core.sched.scheduler.Scheduler.schedule()` and `update_from_output()` do
for a plain decoder (vLLM 0.32), with time left out (`rlsim.sim.engine` prices iterations):

- running requests first, in running-list order, each taking its next chunk (a decode: one
  token, `verify` under speculation) from the `max_num_batched_tokens` budget; when its KV slots
  do not fit, the request at the back of the running list is preempted (its blocks freed, its
  tokens recomputed on readmission, first in the waiting queue) until they fit or it preempted
  itself;
- then, unless something was preempted, waiting requests in order while the budget lasts and
  fewer than `max_num_seqs` run: a prefix-cache lookup (whole blocks, at most all tokens but the
  last), then admission only if the whole sequence (prompt plus generated tokens) fits in free
  blocks (`scheduler_reserve_full_isl`); with chunked prefill off, a prefill larger than the
  budget waits;
- KV in blocks of `block_size` tokens: a request holds `ceil(computed / block_size)` blocks, and
  the slot of a sampled token is allocated when the token is computed (the next iteration); a
  speculating request also holds `lookahead` slots for its draft tokens from the end of its
  prefill (vLLM's `num_lookahead_tokens`);
- a request whose prefill completes samples its first token in that iteration; a request
  finishes in the iteration that samples its `target`-th token, and its blocks are freed in
  running order.

`AsyncInstanceScheduler` is vLLM's `AsyncScheduler` (a subclass there as here; the engine runs it
where the profile's `async_scheduling` is on), driven by the engine core's batch queue of two:
the next batch is scheduled before the last one's tokens are known. A finished request keeps its
place for one more schedule: one that stops on an end-of-sequence token (`target < max_tokens`,
which the scheduler cannot foresee) decodes one more token that nobody reads, and one that reached
`max_tokens` is skipped but holds its blocks and its running slot; both are freed after that
schedule, in running order, and one preempted meanwhile is dropped, not requeued (its last token
finishes it while it waits). Everything else, placeholders included, schedules as without it.
`vllm_scheduler()` picks the class for the engine's `async_scheduling`.

No run schedules with these classes: both engines run the same rules from the compiled core's
source (`rlsim.sim.compiled.scheduler`; `SimEngine` through `rlsim.sim.vllm_rules.VLLMRules`), which
`rlsim.sim.sched_parity` holds to vLLM's own `Scheduler`. These classes are their readable twin, the
rules as objects: `tests/test_compiled_scheduler.py` runs both on the same random workloads
(speculation, transfers and turns included) and holds every iteration equal.

Between events a batch of decoding requests is fixed, so `jump_plan()` finds how many iterations
can pass before the next finish or block shortage and `advance(k)` commits them at once (block
needs counted from each request's position in its block, not iterated).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from operator import attrgetter

import numpy as np

from rlsim.sim.kv_blocks import BlockPool
from rlsim.sim.seq import QueueQueries, Scheduled, Seq, count_hits

_ORDER = attrgetter("order")  # running-list position


class InstanceScheduler(QueueQueries):
    """vLLM's `Scheduler`: its waiting queue, running list, budget, block pool and preemption for
    one instance (the readable twin of `rlsim.sim.vllm_rules.VLLMRules`)."""

    async_scheduling = False

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool = True,
        enable_prefix_caching: bool = True,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self.waiting: deque[Seq] = deque()
        self.running: dict[int, Seq] = {}  # request id -> Seq, running-list order
        self.heap: list = []  # (finish_iter, rid) of decoding sequences
        self.iters = 0
        self.ctx = 0.0  # KV context tokens of the running requests (the cost model's C)
        self.num_decoding = 0
        self.num_unit_rate = 0  # decoding sequences at one token per iteration (in `phase`)
        # unit-rate decoders by phase (computed - 1 - start_iter) % block_size: those at phase p
        # allocate a block in the iterations where (p + iters) % block_size == block_size - 1
        self.phase: list[dict[int, Seq]] = [{} for _ in range(block_size)]
        self._phase_counts = [0] * block_size  # len() of each phase dict, for decode_blocks' slices
        self._order = 0  # running-list position counter
        self.spec: dict[int, Seq] = {}  # decoding sequences at a rate other than one
        # their computed tokens, start iteration and rate in numpy slots, to count blocks at once
        self._spec_computed, self._spec_start_iter, self._spec_rate = np.zeros(0), np.zeros(0), np.zeros(0)
        self._slot: dict[int, int] = {}
        self._free_slots: list[int] = []
        self.rate_sum = 0.0
        self.verify_sum = 0.0
        self.prefix_hit_tokens = 0
        self.turn_tokens = self.turn_hit_tokens = 0  # later turns of trajectories: context, prefix hits
        self.finishing: list[Seq] = []  # async: reported finished, freed after the next schedule

    groups_calls = False  # each sample of a call is its own request (vLLM's n > 1 fans out before the scheduler)

    @property
    def kv_capacity_tokens(self) -> int:
        """KV tokens the instance holds (its blocks)."""
        return self.num_blocks * self.block_size

    # ---- queue changes ---------------------------------------------------------------------
    def add_call(self, seqs: list[Seq]) -> None:
        """A call's samples, queued one by one."""
        for seq in seqs:
            self.add(seq)

    def add(self, seq: Seq) -> None:
        seq.prompt_blocks = (seq.req.prompt_len or seq.req.num_prompt_tokens) // self.block_size
        self.waiting.append(seq)

    def remove_waiting(self, rids: set[int]) -> list[Seq]:
        """Take these requests out of the waiting queue (one pass, order kept); return them."""
        if not self.waiting:
            return []
        gone = [seq for seq in self.waiting if seq.req.request_id in rids]
        if gone:
            self.waiting = deque(seq for seq in self.waiting if seq.req.request_id not in rids)
        return gone

    # ---- one iteration ---------------------------------------------------------------------
    def _decode_need(self, seq: Seq) -> int:
        c = self.computed(seq) + seq.held_lookahead
        return self._blocks(c + seq.rate) - self._blocks(c)

    def _chunk_blocks(self, seq: Seq, take: int) -> tuple[int, int]:
        """(blocks a prefill chunk of `take` tokens allocates, lookahead held after it). Token
        counts of a sequence not decoding are integers, so the block counts are exact."""
        end, b = seq.computed + take, self.block_size
        la = seq.lookahead if end >= seq.req.num_prompt_tokens + seq.generated else 0
        return -(-(end + la) // b) + (seq.computed + seq.held_lookahead) // -b, la

    def _admit_check(self, seq: Seq, budget: int) -> tuple[int, list[tuple], int] | str | None:
        """(tokens of its first chunk, prefix hit, blocks hit) if the head of the queue can be
        admitted; None when its blocks do not fit, "budget" when chunked prefill is off and it
        exceeds the budget."""
        req, b = seq.req, self.block_size
        ntok = req.num_prompt_tokens + seq.generated
        hit, num_hit_blocks, evict = [], 0, 0
        if self.enable_prefix_caching:
            hit = self.pool.lookup(req.prompt_id, seq.prompt_blocks, req.request_id, (ntok - 1) // b)
            if hit:
                num_hit_blocks = sum(hi - lo for _, lo, hi in hit)
                evict = self.pool.evictable(hit)
        new = 1 if seq.transfer else ntok - num_hit_blocks * b
        if not self.enable_chunked_prefill and new > budget:
            return "budget"
        if -(-(ntok + seq.lookahead) // b) - num_hit_blocks + evict > self.pool.free:  # blocks it needs (ints: exact)
            return None
        return min(new, budget), hit, num_hit_blocks

    def schedule(self) -> Scheduled:
        """vLLM's `schedule()`: the batch of this iteration (blocks allocated, preemptions done)."""
        out = Scheduled()
        budget = self.max_num_batched_tokens
        pool = self.pool
        if self.num_decoding == len(self.running) and not self.spec and self.num_decoding <= budget:
            self._schedule_decodes(out)
            if out.preempted:
                return out
            return self._admit(out, budget - self.num_decoding)
        if self._bulk_ok(budget):
            dec = self.decode_blocks(1) if self.num_decoding else 0
            need = dec
            for seq in self.running.values():
                if not seq.decoding and not seq.reported:
                    need += self._chunk_blocks(seq, seq.req.num_prompt_tokens + seq.generated - seq.computed)[0]
            if need <= pool.free:  # nothing preempts and every running request fits the budget
                pool.take(dec)
                budget -= math.ceil(self.verify_sum - 1e-9)
                out.decode_tokens, out.num_decodes = self.verify_sum, self.num_decoding
                self.ctx += self.rate_sum
                for seq in self.running.values():
                    if not seq.decoding and not seq.reported:
                        take = seq.req.num_prompt_tokens + seq.generated - seq.computed
                        self._prefill_chunk(seq, take, out)
                        budget -= take
                return self._admit(out, budget)
        running = list(self.running.values())
        i, n = 0, len(running)
        while i < n and budget > 0:
            seq = running[i]
            if seq.reported and not seq.decoding:  # async: reached max_tokens, holds its blocks
                i += 1
                continue
            if seq.decoding:
                new = math.ceil(seq.verify - 1e-9)
                if new > budget:
                    break
                need = self._decode_need(seq)
            else:
                new = min(seq.req.num_prompt_tokens + seq.generated - seq.computed, budget)
                need = self._chunk_blocks(seq, new)[0]
            while need > pool.free:
                victim = running[n - 1]
                n -= 1
                self.preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if n <= i:  # it preempted itself
                break
            budget -= new
            if seq.decoding:
                pool.take(need)
                out.decode_tokens += seq.verify
                out.num_decodes += 1
                self.ctx += seq.rate
            else:
                self._prefill_chunk(seq, new, out)
            i += 1
        for seq in running[i:n]:  # decoders the budget left out this iteration do not advance
            if seq.decoding:
                self._stop_decoding(seq)
                self._start_decoding(seq, at=self.iters + 1)
        if out.preempted:
            return out
        return self._admit(out, budget)

    def _schedule_decodes(self, out: Scheduled) -> None:
        """The running loop when every running request decodes one token and the budget holds
        them all: only the requests whose next token opens a block allocate, in running order,
        preempting from the back when the pool is empty, as the loop over all of them would."""
        b = self.block_size
        pool = self.pool
        due = self.phase[(b - 1 - self.iters) % b]
        if len(due) <= pool.free:  # they all fit: in any order, nothing is preempted
            pool.take(len(due))
        else:
            self._take_in_order(sorted(due.values(), key=_ORDER), out)
        out.decode_tokens = out.num_decodes = self.num_decoding
        self.ctx += self.rate_sum

    def _take_in_order(self, needers: list[Seq], out: Scheduled) -> None:
        """Blocks for these decoders, in running order, preempting from the back of the running
        list whenever the pool is empty (the shortage case of `_schedule_decodes`)."""
        pool, running = self.pool, self.running
        i, n = 0, len(needers)
        while i < n:
            seq = needers[i]
            rid = seq.req.request_id
            if rid not in running:  # preempted from the back earlier in this iteration
                break
            if pool.free >= 1:  # the next needers in order, as many as the pool holds
                k = min(pool.free, n - i)
                pool.take(k)
                i += k
                continue
            while pool.free < 1:
                victim = running[next(reversed(running))]
                self.preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if rid not in running:
                break
            while needers[n - 1].req.request_id not in running:  # victims are a suffix of them
                n -= 1
            pool.take(1)
            i += 1

    def _bulk_ok(self, budget: int) -> bool:
        """Every running request's next chunk fits the budget (then only blocks can bind)."""
        need = math.ceil(self.verify_sum - 1e-9)
        if len(self.running) > self.num_decoding:
            for seq in self.running.values():
                if not seq.decoding and not seq.reported:
                    need += seq.req.num_prompt_tokens + seq.generated - seq.computed
        return need <= budget

    def _prefill_chunk(self, seq: Seq, take: int, out: Scheduled) -> None:
        blocks, seq.held_lookahead = self._chunk_blocks(seq, take)
        self.pool.take(blocks)
        if self.enable_prefix_caching:  # hash the prompt's full blocks this chunk completes (vLLM caches at allocation)
            lo, hi = seq.num_hashed_blocks, min(seq.prompt_blocks, (seq.computed + take) // self.block_size)
            if hi > lo:
                seq.hashed.append(self.pool.new(seq.req.prompt_id, lo, hi))
                seq.num_hashed_blocks = hi
        out.chunks.append((seq, take))
        out.prefill_tokens += take
        self.ctx += take

    def _admit(self, out: Scheduled, budget: int) -> Scheduled:
        pool = self.pool
        while budget > 0 and self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            ok = self._admit_check(seq, budget)
            if not isinstance(ok, tuple):
                out.blocked_by_kv = ok is None
                break
            take, hit, num_hit_blocks = ok
            self.waiting.popleft()
            seq.hashed = pool.acquire(hit) if hit else []
            seq.num_hashed_blocks = num_hit_blocks
            seq.computed = num_hit_blocks * self.block_size
            count_hits(self, seq)
            if seq.transfer:  # its KV was moved here: all but the last token are in place
                last = seq.req.num_prompt_tokens + seq.generated - 1
                pool.take(self._blocks(last) - self._blocks(seq.computed))
                self.ctx += last - seq.computed
                seq.computed, seq.transfer = last, False
            self.running[seq.req.request_id] = seq
            self._order += 1
            seq.order = self._order
            self._prefill_chunk(seq, take, out)
            budget -= take
        return out

    def complete(self, out: Scheduled) -> list[Seq]:
        """vLLM's `update_from_output()`: the iteration ran; return the requests it finished
        (their blocks freed, in running order; under async scheduling, after the next schedule)."""
        self.iters += 1  # (first: a finishing request's extra token counts in the blocks it frees)
        self.release_finishing()
        for seq, take in out.chunks:
            seq.computed += take
            if seq.computed >= seq.req.num_prompt_tokens + seq.generated:
                seq.generated += 1  # the iteration that ends a prefill samples a token
                self._start_decoding(seq)
        return self.finish_due()

    def finish_due(self) -> list[Seq]:
        """Finish the decoding requests whose last token the iterations so far sampled."""
        heap, it = self.heap, self.iters
        if not heap or heap[0][0] > it:
            return []
        due, running = [], self.running
        while heap and heap[0][0] <= it:
            rid = heapq.heappop(heap)[1]
            seq = running.get(rid)
            if seq is None or not seq.decoding or seq.finish_iter != it or seq.reported:
                continue  # stale entry (aborted, preempted, postponed or already reported)
            due.append(seq)
        if len(due) > 1:
            due.sort(key=_ORDER)
        return self._report(due)

    def _report(self, due: list[Seq]) -> list[Seq]:
        """The finished requests, freed in running order as vLLM applies the iteration's output."""
        for seq in due:
            self._free(seq, "finish")
        return due

    def _hash_lag(self, seq: Seq) -> bool:
        """Whether the newest token of this running request is a placeholder vLLM has not hashed."""
        return False

    def release_finishing(self) -> None:
        """Async scheduling: free the requests reported finished before the last schedule, in
        running order (vLLM frees them as it applies that iteration's output)."""
        if self.finishing:
            done, self.finishing = self.finishing, []
            for seq in done:
                if seq.req.request_id in self.running:  # not preempted meanwhile
                    self._free(seq, "finish")

    # ---- the running requests: token positions, decoding, freeing ---------------------------
    # A decoding request is not touched while it decodes: its tokens are counted from the iteration
    # it started at. Unit-rate decoders are bucketed by the phase of their position in their last
    # block (so the iterations where each allocates a block are known), speculating ones keep their
    # counts in numpy slots; finishing, preempting or aborting frees its blocks in vLLM's order.
    def computed(self, seq: Seq) -> float:
        if not seq.decoding:
            return seq.computed
        return seq.computed + (self.iters - seq.start_iter) * seq.rate

    def generated(self, seq: Seq) -> int:
        if not seq.decoding:
            return seq.generated
        done = int((self.iters - seq.start_iter) * seq.rate + 1e-9)
        return seq.generated + min(done, seq.target - seq.generated)

    def _blocks(self, tokens: float) -> int:
        return math.ceil(tokens / self.block_size - 1e-9)

    def _stop_decoding(self, seq: Seq) -> None:
        if seq.rate != 1.0:
            seq.generated = self.generated(seq)
            seq.computed = int(round(self.computed(seq)))
        seq.decoding = False
        self.num_decoding -= 1
        self.rate_sum -= seq.rate
        self.verify_sum -= seq.verify
        if seq.rate == 1.0:  # generated() and computed() at one token per iteration
            ran = self.iters - seq.start_iter
            seq.generated += min(ran, seq.target - seq.generated)
            seq.computed += ran
            self.num_unit_rate -= 1
            ph = (seq.computed - 1 - self.iters) % self.block_size
            del self.phase[ph][seq.req.request_id]
            self._phase_counts[ph] -= 1
        else:
            del self.spec[seq.req.request_id]
            j = self._slot.pop(seq.req.request_id)
            self._spec_computed[j] = self._spec_start_iter[j] = self._spec_rate[j] = 0.0  # an empty slot adds no blocks
            self._free_slots.append(j)
        if self.num_decoding == 0:  # no float drift left behind
            self.rate_sum = self.verify_sum = 0.0

    def _start_decoding(self, seq: Seq, at: int | None = None) -> None:
        """Decode from iteration `at` (default: the next one to run) one `rate` a step."""
        at = self.iters if at is None else at
        seq.decoding = True
        seq.start_iter = at
        seq.finish_iter = at + math.ceil((seq.target - seq.generated) / seq.rate - 1e-9)
        self.num_decoding += 1
        self.rate_sum += seq.rate
        self.verify_sum += seq.verify
        if seq.rate == 1.0:
            self.num_unit_rate += 1
            ph = (seq.computed - 1 - at) % self.block_size
            self.phase[ph][seq.req.request_id] = seq
            self._phase_counts[ph] += 1
        else:
            self.spec[seq.req.request_id] = seq
            if not self._free_slots:  # grow the slot arrays
                n = len(self._spec_computed)
                grow = np.zeros(max(n, 64))
                old = (self._spec_computed, self._spec_start_iter, self._spec_rate)
                self._spec_computed, self._spec_start_iter, self._spec_rate = (np.concatenate([a, grow]) for a in old)
                self._free_slots.extend(range(len(self._spec_computed) - 1, n - 1, -1))
            j = self._free_slots.pop()
            self._slot[seq.req.request_id] = j
            self._spec_computed[j] = seq.computed + seq.held_lookahead
            self._spec_start_iter[j], self._spec_rate[j] = at, seq.rate
        heapq.heappush(self.heap, (seq.finish_iter, seq.req.request_id))

    def _free(self, seq: Seq, how: str) -> int:
        """Take a running request out, free its blocks in reverse table order; return its tokens.
        `how`: "preempt" keeps its full blocks hittable, "finish"/"abort" do not. Under async
        scheduling a request that decoded since its prefill has its newest token still a
        placeholder, so vLLM has hashed its blocks only up to the token before it."""
        if how == "finish" and seq.req.more_turns:  # the trajectory's next turn hits its KV while cached
            how = "turn"
        lag = self._hash_lag(seq)
        if seq.decoding:
            self._stop_decoding(seq)
        del self.running[seq.req.request_id]
        c = seq.computed
        self.ctx -= c
        la, seq.held_lookahead = seq.held_lookahead, 0
        b = self.block_size
        if self.enable_prefix_caching:
            full, pool, hashed = c // b, self.pool, seq.hashed
            if lag:
                full = (c - 1) // b
            pool.give(-(-(c + la) // b) - full)  # the partial tail block (and any unhashed one) and the lookahead
            if how in ("preempt", "turn"):  # its own full blocks stay hittable: its readmission, its next turn
                pool.release([s for s in [pool.new(("own", seq.req.request_id), seq.num_hashed_blocks, full)] if s])
                pool.release(reversed(hashed))
            else:
                pool.give(full - seq.num_hashed_blocks, cached=True)  # its own full blocks: nothing hits them again
                own = [s for s in hashed if type(s.key) is tuple]
                if own:  # blocks of its own chain (a preempted request's): dead, freed first
                    pool.release(reversed(own), dead=True)
                    pool.release(reversed([s for s in hashed if type(s.key) is not tuple]))
                else:
                    pool.release(reversed(hashed))
        else:
            self.pool.give(-(-(c + la) // b))
        seq.hashed = []
        seq.num_hashed_blocks = seq.computed = 0
        return seq.generated

    def preempt(self, seq: Seq) -> int:
        gen = self._free(seq, "preempt")
        self.waiting.appendleft(seq)
        return gen

    def finish(self, seq: Seq) -> int:
        return self._free(seq, "finish")

    def abort(self, seq: Seq) -> int:
        return self._free(seq, "abort")

    def own_abort(self, seq: Seq) -> str | None:
        """vLLM aborts nothing of its own accord here (a prompt it cannot hold is refused before the run)."""
        return None

    def on_idle(self) -> None:
        """Nothing to schedule: vLLM's scheduler keeps no state that an idle pass resets."""

    def free_all(self) -> list[Seq]:
        """Sleep: every running request's KV and the prefix cache are dropped; running requests go
        back to the front of the waiting queue in running order, keeping their tokens."""
        self.release_finishing()
        carried = list(self.running.values())
        for seq in carried:
            if seq.decoding:
                self._stop_decoding(seq)
            seq.hashed = []
            seq.num_hashed_blocks = seq.computed = seq.held_lookahead = 0
        self.running.clear()
        self.heap.clear()
        self.ctx = 0.0
        self.pool.reset(self.num_blocks)
        self.waiting.extendleft(reversed(carried))
        return carried

    # ---- event jumping: how many iterations a fixed decode batch can run, and committing them ---
    # Between events the batch is fixed, so the blocks its decoders allocate over k iterations are
    # counted from each one's position in its last block, not iterated: `jump_plan` finds the next
    # finish or block shortage, `advance` commits.
    def decode_blocks(self, k: int) -> int:
        """Blocks the decoding requests allocate over the next k iterations."""
        b = self.block_size
        q, s = divmod(k, b)
        n = self.num_unit_rate * q
        if s:
            # a unit-rate decoder at phase p allocates in this iteration when (p + iters) % b == 0,
            # i.e. once in the first s iterations when (p + iters) % b >= b - s
            lo = (b - s - self.iters) % b  # phases (j - iters) % b for j in [b - s, b): a circular slice
            pc, hi = self._phase_counts, lo + s
            n += sum(pc[lo:hi]) if hi <= b else sum(pc[lo:]) + sum(pc[: hi - b])
        if self.spec:
            r = self._spec_rate
            # as computed(), for every speculative decoder
            c = self._spec_computed + (self.iters - self._spec_start_iter) * r
            n += int((np.ceil((c + k * r) / b - 1e-9) - np.ceil(c / b - 1e-9)).sum())
        return n

    def jump_plan(self) -> int:
        """Iterations that can run as a fixed decode batch before the next event (0: run one)."""
        if not self.heap or self.num_decoding != len(self.running) or self.finishing:
            return 0
        if math.ceil(self.verify_sum - 1e-9) > self.max_num_batched_tokens:
            return 0
        if self.waiting and len(self.running) < self.max_num_seqs:
            budget = self.max_num_batched_tokens - math.ceil(self.verify_sum - 1e-9)
            if budget > 0 and isinstance(self._admit_check(self.waiting[0], budget), tuple):
                return 0  # an admission is possible now
        k_finish = self.heap[0][0] - self.iters
        if k_finish <= 0:
            return 0
        free = self.pool.free
        if self.decode_blocks(k_finish) <= free:
            return k_finish
        lo, hi = 0, k_finish  # decode_blocks(lo) <= free < decode_blocks(hi)
        guess = int(free * self.block_size / max(self.rate_sum, 1e-9))
        if 0 < guess < hi:
            if self.decode_blocks(guess) <= free:
                lo = guess
            else:
                hi = guess
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.decode_blocks(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def advance(self, k: int) -> None:
        """Commit k decode iterations (`jump_plan` said they fit)."""
        self.pool.take(self.decode_blocks(k))
        self.iters += k
        self.ctx += k * self.rate_sum


class AsyncInstanceScheduler(InstanceScheduler):
    """vLLM's `AsyncScheduler`: a finished request is reported at once but keeps its place for one
    more schedule (its blocks and running slot, freed by `release_finishing` after it), and a
    running request's newest token is a placeholder that its block hashes do not cover yet."""

    async_scheduling = True

    def _report(self, due: list[Seq]) -> list[Seq]:
        for seq in due:  # reported now, freed after the next schedule
            seq.reported = True
            if seq.target >= seq.req.max_tokens:  # vLLM knows it is done: it schedules it no more
                self._stop_decoding(seq)
        self.finishing.extend(due)
        return due

    def _hash_lag(self, seq: Seq) -> bool:
        return seq.decoding and self.iters > seq.start_iter

    def preempt(self, seq: Seq) -> int:
        if seq.reported:  # already finished: its last token ends it while it would wait
            return self._free(seq, "finish")
        return super().preempt(seq)


def vllm_scheduler(*settings: int | bool, async_scheduling: bool = False, **named: int | bool) -> InstanceScheduler:
    """vLLM's scheduler for one instance under `InstanceScheduler`'s settings: `AsyncInstanceScheduler`
    where `async_scheduling` is on (as vLLM picks `AsyncScheduler`), else `InstanceScheduler`."""
    return (AsyncInstanceScheduler if async_scheduling else InstanceScheduler)(*settings, **named)
