"""Event jumping: the closed form of a fixed decode batch.

Between events the decode batch is fixed (B sequences, KV context C growing by B
per iteration), so k iterations cost `k*(t_w + (alpha+gamma)*B + beta*C1) + beta*B*k*(k-1)/2`
(C1 the context of the first). An instance runs iterations one at a time only while a prefill or
an admission is pending, and otherwise jumps straight to the next finish or block shortage (the
scheduler counts the blocks each request allocates from its position in its last block). A
submit or abort arriving mid-jump interrupts it: the iterations already done (and the one in
progress) are committed, and the instance re-plans at the next iteration boundary; `pause()`
(colocated training takes the GPUs) interrupts a jump the same way, so no token is generated
during training. `exact=True` runs every iteration one at a time: the reference that proves the
fast path.
"""

from __future__ import annotations

import math

from rlsim.profile import Profile
from rlsim.sim.rollout_scheduler import RolloutScheduler


def jump_cost(p: Profile, s: RolloutScheduler, draft_s: float, k: int) -> tuple[float, float]:
    """(Seconds of the next k decode iterations of `s`'s fixed batch, the per-iteration increment)."""
    a = p.t_w_s + p.alpha_s * s.num_decoding + p.gamma_s * s.verify_sum + p.beta_s * (s.ctx + s.rate_sum)
    a += p.compute_excess_s(s.verify_sum) + draft_s * s.num_speculating
    q = p.beta_s * s.rate_sum
    return a * k + q * k * (k - 1) / 2, q  # (total, per-iteration increment)


def iters_done(p: Profile, s: RolloutScheduler, draft_s: float, elapsed: float, k: int) -> int:
    """Whole iterations of a jump completed after `elapsed` seconds (at most k)."""
    a, q = jump_cost(p, s, draft_s, 1)
    if q == 0:
        n = int(elapsed / a)
    else:  # q/2 n^2 + (a - q/2) n - elapsed = 0
        bq = a - q / 2
        n = int((-bq + math.sqrt(bq * bq + 2 * q * elapsed)) / q)
    while n > 0 and jump_cost(p, s, draft_s, n)[0] > elapsed + 1e-12:
        n -= 1
    while n + 1 <= k and jump_cost(p, s, draft_s, n + 1)[0] <= elapsed:
        n += 1
    return min(n, k)
