"""RunningList: the running requests of one instance's scheduler: token positions, decoding, freeing.

A decoding request is not touched while it decodes: its tokens are counted from the iteration it
started at. Unit-rate decoders are bucketed by the phase of their position in their last block
(so the iterations where each allocates a block are known), speculating ones keep their counts in
numpy slots; finishing, preempting or aborting frees its blocks in vLLM's order (`rlsim.sim.kv_blocks`).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from rlsim.sim.seq import Seq


class RunningList:
    """`InstanceScheduler`'s running-request bookkeeping (a mixin over its state)."""

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
        self.n_dec -= 1
        self.rate_sum -= seq.rate
        self.verify_sum -= seq.verify
        if seq.rate == 1.0:  # generated() and computed() at one token per iteration
            ran = self.iters - seq.start_iter
            seq.generated += min(ran, seq.target - seq.generated)
            seq.computed += ran
            self.n_unit -= 1
            ph = (seq.computed - 1 - self.iters) % self.block_size
            del self.phase[ph][seq.req.request_id]
            self._pc[ph] -= 1
        else:
            del self.spec[seq.req.request_id]
            j = self._slot.pop(seq.req.request_id)
            self._sc[j] = self._sst[j] = self._sr[j] = 0.0  # an empty slot adds no blocks
            self._free_slots.append(j)
        if self.n_dec == 0:  # no float drift left behind
            self.rate_sum = self.verify_sum = 0.0

    def _start_decoding(self, seq: Seq, at: int | None = None) -> None:
        """Decode from iteration `at` (default: the next one to run) one `rate` a step."""
        at = self.iters if at is None else at
        seq.decoding = True
        seq.start_iter = at
        seq.finish_iter = at + math.ceil((seq.target - seq.generated) / seq.rate - 1e-9)
        self.n_dec += 1
        self.rate_sum += seq.rate
        self.verify_sum += seq.verify
        if seq.rate == 1.0:
            self.n_unit += 1
            ph = (seq.computed - 1 - at) % self.block_size
            self.phase[ph][seq.req.request_id] = seq
            self._pc[ph] += 1
        else:
            self.spec[seq.req.request_id] = seq
            if not self._free_slots:  # grow the slot arrays
                n = len(self._sc)
                grow = np.zeros(max(n, 64))
                self._sc, self._sst, self._sr = (np.concatenate([a, grow]) for a in (self._sc, self._sst, self._sr))
                self._free_slots.extend(range(len(self._sc) - 1, n - 1, -1))
            j = self._free_slots.pop()
            self._slot[seq.req.request_id] = j
            self._sc[j], self._sst[j], self._sr[j] = seq.computed + seq.held_la, at, seq.rate
        heapq.heappush(self.heap, (seq.finish_iter, seq.req.request_id))

    def _free(self, seq: Seq, how: str) -> int:
        """Take a running request out, free its blocks in reverse table order; return its tokens.
        `how`: "preempt" keeps its full blocks hittable, "finish"/"abort" do not. Under async
        scheduling a request that decoded since its prefill has its newest token still a
        placeholder, so vLLM has hashed its blocks only up to the token before it."""
        lag = self.async_scheduling and seq.decoding and self.iters > seq.start_iter
        if seq.decoding:
            self._stop_decoding(seq)
        del self.running[seq.req.request_id]
        c = seq.computed
        self.ctx -= c
        la, seq.held_la = seq.held_la, 0
        b = self.block_size
        if self.caching:
            full, pool, hashed = c // b, self.pool, seq.hashed
            if lag:
                full = (c - 1) // b
            pool.give(-(-(c + la) // b) - full)  # the partial tail block (and any unhashed one) and the lookahead
            if how == "preempt":  # its own full blocks stay hittable, for its readmission
                pool.release([s for s in [pool.new(("own", seq.req.request_id), seq.nhashed, full)] if s])
                pool.release(reversed(hashed))
            else:
                pool.give(full - seq.nhashed, cached=True)  # its own full blocks: nothing hits them again
                pool.release(reversed([s for s in hashed if type(s.key) is tuple]), dead=True)
                pool.release(reversed([s for s in hashed if type(s.key) is not tuple]))
        else:
            self.pool.give(-(-(c + la) // b))
        seq.hashed = []
        seq.nhashed = seq.computed = 0
        return seq.generated

    def preempt(self, seq: Seq) -> int:
        if seq.reported:  # async: already finished; its last token ends it while it would wait
            return self._free(seq, "finish")
        gen = self._free(seq, "preempt")
        self.waiting.appendleft(seq)
        return gen

    def finish(self, seq: Seq) -> int:
        return self._free(seq, "finish")

    def abort(self, seq: Seq) -> int:
        return self._free(seq, "abort")

    def free_all(self) -> list[Seq]:
        """Sleep: every running request's KV and the prefix cache are dropped; running requests go
        back to the front of the waiting queue in running order, keeping their tokens."""
        self.release_finishing()
        carried = list(self.running.values())
        for seq in carried:
            if seq.decoding:
                self._stop_decoding(seq)
            seq.hashed = []
            seq.nhashed = seq.computed = seq.held_la = 0
        self.running.clear()
        self.heap.clear()
        self.ctx = 0.0
        self.pool.reset(self.num_blocks)
        self.waiting.extendleft(reversed(carried))
        return carried
