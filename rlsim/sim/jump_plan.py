"""JumpPlan: how many iterations a fixed decode batch can run before its next event, and committing them.

Between events the batch is fixed, so the blocks its decoders allocate over k iterations are
counted from each one's position in its last block (unit-rate decoders by phase, speculating ones
in numpy), not iterated: `jump_plan` finds the next finish or block shortage, `advance` commits.
"""

from __future__ import annotations

import math

import numpy as np


class JumpPlan:
    """`InstanceScheduler`'s event-jumping methods (a mixin over its state)."""

    def decode_blocks(self, k: int) -> int:
        """Blocks the decoding requests allocate over the next k iterations."""
        b = self.block_size
        q, s = divmod(k, b)
        n = self.n_unit * q
        if s:
            # a unit-rate decoder at phase p allocates in this iteration when (p + iters) % b == 0,
            # i.e. once in the first s iterations when (p + iters) % b >= b - s
            lo = (b - s - self.iters) % b  # phases (j - iters) % b for j in [b - s, b): a circular slice
            pc, hi = self._pc, lo + s
            n += sum(pc[lo:hi]) if hi <= b else sum(pc[lo:]) + sum(pc[: hi - b])
        if self.spec:
            r = self._sr
            c = self._sc + (self.iters - self._sst) * r  # as computed(), for every speculative decoder
            n += int((np.ceil((c + k * r) / b - 1e-9) - np.ceil(c / b - 1e-9)).sum())
        return n

    def jump_plan(self) -> int:
        """Iterations that can run as a fixed decode batch before the next event (0: run one)."""
        if not self.heap or self.n_dec != len(self.running) or self.finishing:
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
