"""RunningOffsets: the running batch's output reservations of SGLang's `PrefillAdder`, summed fast.

At every prefill pass SGLang reserves, for each request of the running batch, in batch order,
`min(max_new_tokens - len(output_ids), 4096) * new_token_ratio`, and sums the products
(`PrefillAdder.__init__`, `_get_running_request_total_token_offset`). A pass comes each time a
request leaves a full batch, so a step of thousands of requests sums a batch of hundreds thousands
of times. This keeps each member's counts in numpy slots, in batch order (a leaving member's slot
is left dead and the slots compacted when half are), and sums the products with `np.cumsum`: one
addition after another in batch order, as Python's `sum` does, so the float is SGLang's to the bit.

A member's output count is `generated` when it is not decoding, else
`min(generated + steps since it started, target)`, less one where the overlap scheduler has not
processed the batch in flight (`lag`: every decoding member after a decode step; after a prefill,
the members that prefill admitted, which joined at its iteration).

Each slot holds what its reservation needs as two bounds: `max_tokens - output` (before the lag)
is `max(a - decode steps, b)`. A decoding member's `a` is `max_tokens - generated + start_iter`
and its `b` is `max_tokens - target`; one not decoding has `a` out of reach below and `b` its
`max_tokens - generated`; a dead slot reserves nothing (`b` 0, so it adds 0.0 to the sum, which
leaves every partial sum as it was). Every value that is kept is a whole number well below 2**53,
so the floats are exact and equal to `max_tokens - min(generated + steps, target)` to the bit.

The sum runs compiled where numba is (`_sum_loop`, one pass over the slots: about a seventh of the
numpy passes' time at a batch of hundreds, where their per-call cost dominates), the same IEEE
operations in the same order, so the same float to the bit; with `RLSIM_PURE_PYTHON=1`, or
without numba, the numpy passes run (`_sum_numpy`). Tests hold the two and SGLang's own
request-by-request sum equal.
"""

from __future__ import annotations

import functools

import numpy as np

from rlsim.sim.compile_switch import pure_python, use_generic_cpu
from rlsim.sim.seq import Seq

_OUT_OF_REACH = -(2.0**60)  # an `a` far below every `b`: the bound is `b`
_LAG = {"none": 0, "decoding": 1, "joined": 2}  # `total`'s lag, as `_sum_loop` takes it


def _sum_loop(a, b, dec, joined, k, ratio, dsteps, lag, joined_at, clip):  # noqa: ANN001, ANN202 - compiled
    """The batch-order sum of `min(max(a - dsteps, b) (+ dec where it lags), clip) * ratio` over the
    first `k` slots, one slot after another: `_sum_numpy`'s operations, element by element."""
    s = 0.0
    for i in range(k):
        x = a[i] - dsteps
        if b[i] > x:  # (np.maximum)
            x = b[i]
        if lag == 1 or (lag == 2 and joined[i] == joined_at):
            x += dec[i]
        if x > clip:  # (np.minimum)
            x = clip
        s += x * ratio
    return s


@functools.cache
def _compiled_sum():  # noqa: ANN202 - a numba dispatcher, or None
    """`_sum_loop` compiled (cached on disk as numba caches), or None on the pure path (numba
    missing, or `RLSIM_PURE_PYTHON=1`). numba is imported when the first `RunningOffsets` is built
    (an SGLang scheduler), never at import: its llvmlite breaks vLLM's kernel scan in a process
    that later starts a real engine (see `rlsim.sim.simulate`). The switch and the CPU its machine
    code is for are the compiled core's (`rlsim.sim.compile_switch`, which it reads too), read without numba, so that
    importing numba here leaves the core's shipped machine code usable in the same process."""
    if pure_python():
        return None
    use_generic_cpu()
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency
        return None
    return numba.njit(cache=True, fastmath=False, nogil=True)(_sum_loop)


class RunningOffsets:
    """Slots of the running batch's members, in batch order."""

    def __init__(self) -> None:
        """Sums with `_sum_loop` compiled where numba is; on the pure path, in numpy passes."""
        self._sum = _compiled_sum()
        self.reset()

    def reset(self) -> None:
        self._slot: dict[int, int] = {}  # request id -> slot
        self._n = 0  # slots used, dead ones included
        self._alloc(64)

    def _alloc(self, cap: int) -> None:
        self._dec = np.zeros(cap)  # 1.0 for a decoding member, else 0.0
        self._a = np.full(cap, _OUT_OF_REACH)
        self._b = np.zeros(cap)
        self._joined = np.zeros(cap)

    def join(self, seq: Seq, joined: int) -> None:
        """A member joins at the end of the batch (its prefill done at iteration count `joined`)."""
        rid = seq.req.request_id
        if rid in self._slot:
            self.drop(rid)
        if self._n == len(self._dec):
            self._grow()
        j = self._n
        self._n += 1
        self._slot[rid] = j
        self._joined[j] = joined
        self._set(j, seq)

    def update(self, seq: Seq) -> None:
        """The member's counts changed (it started or stopped decoding, or its target did)."""
        j = self._slot.get(seq.req.request_id)
        if j is not None:
            self._set(j, seq)

    def _set(self, j: int, seq: Seq) -> None:
        m = seq.req.max_tokens
        if seq.decoding:
            self._dec[j] = 1.0
            self._a[j] = m - seq.generated + seq.start_iter
            self._b[j] = m - seq.target
        else:
            self._dec[j] = 0.0
            self._a[j] = _OUT_OF_REACH
            self._b[j] = m - seq.generated

    def drop(self, rid: int) -> None:
        j = self._slot.pop(rid, None)
        if j is None:
            return
        self._dec[j], self._a[j], self._b[j] = 0.0, _OUT_OF_REACH, 0.0  # reserves nothing
        dead = self._n - len(self._slot)
        if dead > 64 and 2 * dead > self._n:
            self._compact()

    def total(self, ratio: float, dsteps: int, lag: str, joined: int, clip: int) -> float:
        """The sum, in batch order, of `min(max_tokens - output, clip) * ratio`. `lag`: "none",
        "decoding" (every decoding member lags one token), or "joined" (the decoding members that
        joined at iteration count `joined`)."""
        k = self._n
        if not self._slot:
            return 0
        if self._sum is None:
            return self._sum_numpy(ratio, dsteps, lag, joined, clip)
        return self._sum(self._a, self._b, self._dec, self._joined, k, ratio, dsteps, _LAG[lag], joined, clip)

    def _sum_numpy(self, ratio: float, dsteps: int, lag: str, joined: int, clip: int) -> float:
        """`total` in numpy passes over the slots (the pure path), of a batch of one member or more."""
        k = self._n
        out = np.subtract(self._a[:k], dsteps)
        np.maximum(out, self._b[:k], out=out)  # max_tokens - min(generated + steps, target)
        if lag == "decoding":
            out += self._dec[:k]
        elif lag == "joined":
            np.add(out, self._dec[:k], out=out, where=self._joined[:k] == joined)
        np.minimum(out, clip, out=out)
        out *= ratio
        return float(np.add.accumulate(out, out=out)[k - 1])  # (`np.cumsum`, in place)

    def _grow(self) -> None:
        n, old = self._n, (self._dec, self._a, self._b, self._joined)
        self._alloc(2 * len(self._dec))
        for a, b in zip(old, (self._dec, self._a, self._b, self._joined), strict=True):
            b[:n] = a[:n]

    def _compact(self) -> None:
        order = sorted(self._slot, key=self._slot.__getitem__)  # batch order
        keep = np.array([self._slot[rid] for rid in order], dtype=np.int64)
        m, n = len(keep), self._n
        for a in (self._dec, self._a, self._b, self._joined):
            a[:m] = a[keep]
        self._dec[m:n], self._a[m:n], self._b[m:n] = 0.0, _OUT_OF_REACH, 0.0
        self._slot = {rid: i for i, rid in enumerate(order)}
        self._n = m
