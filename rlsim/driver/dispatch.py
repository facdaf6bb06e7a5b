"""Dispatch: which rollout instance serves each sample a policy launches without placing it.

`least_loaded` (the default) sends every sample, as its own request, to the instance with the
fewest requests assigned and not yet ended, counting the ones assigned earlier in the same batch;
ties go to the lowest index. This is what veRL's agent loop, slime and AReaL do (each sample is a
request to the least-loaded server), and the baseline any placement policy must beat.
`round_robin` rotates sample by sample; `per_prompt` keeps all samples of one launch together
and rotates launch by launch (the placement rlsim used before per-sample dispatch).
"""

from __future__ import annotations

import numpy as np


def least_loaded(counts: list[int], k: int) -> list[int]:
    """Instances for k samples, one at a time to the least-loaded (ties: lowest index), counting
    each assignment before the next. `counts` is updated in place.

    Greedy one-at-a-time assignment takes the k lowest (load level, instance) slots, where instance
    i offers slots at levels counts[i], counts[i] + 1, ...; so the result is computed in one sort.
    """
    if k <= 0:
        return []
    c = np.asarray(counts, dtype=np.int64)
    n = len(c)
    top = int(c.min()) + k // n + 1  # every instance has a slot below this level ...
    while int(np.maximum(top - c, 0).sum()) < k:  # ... unless the loads are uneven
        top += max(1, (k - int(np.maximum(top - c, 0).sum())) // n)
    per = np.maximum(top - c, 0)
    inst = np.repeat(np.arange(n), per)
    level = np.concatenate([np.arange(lo, top) for lo in c[per > 0]]) if len(inst) else inst
    order = np.lexsort((inst, level))[:k]
    chosen = inst[order]
    for i, m in zip(*np.unique(chosen, return_counts=True), strict=True):
        counts[int(i)] += int(m)
    return [int(i) for i in chosen]
