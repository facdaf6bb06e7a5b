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
"""

from __future__ import annotations

import numpy as np

from rlsim.sim.seq import Seq

_FIELDS = ("max_tokens", "generated", "start", "target", "joined")


class RunningOffsets:
    """Slots of the running batch's members, in batch order."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._slot: dict[int, int] = {}  # request id -> slot
        self._n = 0  # slots used, dead ones included
        cap = 64
        self._alive = np.zeros(cap, dtype=bool)
        self._dec = np.zeros(cap, dtype=bool)
        self._vals = {f: np.zeros(cap) for f in _FIELDS}

    def join(self, seq: Seq, joined: int) -> None:
        """A member joins at the end of the batch (its prefill done at iteration count `joined`)."""
        self.drop(seq.req.request_id)
        if self._n == len(self._alive):
            self._grow()
        j = self._n
        self._n += 1
        self._slot[seq.req.request_id] = j
        self._alive[j] = True
        self._vals["max_tokens"][j] = seq.req.max_tokens
        self._vals["joined"][j] = joined
        self.update(seq)

    def update(self, seq: Seq) -> None:
        """The member's counts changed (it started or stopped decoding, or its target did)."""
        j = self._slot.get(seq.req.request_id)
        if j is None:
            return
        self._dec[j] = seq.decoding
        self._vals["generated"][j] = seq.generated
        self._vals["start"][j] = seq.start_iter
        self._vals["target"][j] = seq.target

    def drop(self, rid: int) -> None:
        j = self._slot.pop(rid, None)
        if j is None:
            return
        self._alive[j] = False
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
        v, dec = self._vals, self._dec[:k]
        gen = v["generated"][:k]
        out = np.where(dec, np.minimum(gen + (dsteps - v["start"][:k]), v["target"][:k]), gen)
        if lag == "decoding":
            out -= dec
        elif lag == "joined":
            out -= dec & (v["joined"][:k] == joined)
        vals = np.minimum(v["max_tokens"][:k] - out, clip)[self._alive[:k]] * ratio
        return float(np.cumsum(vals)[-1])

    def _grow(self) -> None:
        cap = 2 * len(self._alive)
        for name in ("_alive", "_dec"):
            a = np.zeros(cap, dtype=bool)
            a[: self._n] = getattr(self, name)[: self._n]
            setattr(self, name, a)
        for f, a in self._vals.items():
            b = np.zeros(cap)
            b[: self._n] = a[: self._n]
            self._vals[f] = b

    def _compact(self) -> None:
        keep = np.flatnonzero(self._alive[: self._n])
        m = len(keep)
        self._dec[:m] = self._dec[keep]
        for a in self._vals.values():
            a[:m] = a[keep]
        self._alive[:m] = True
        self._alive[m : self._n] = False
        order = sorted(self._slot, key=self._slot.__getitem__)  # batch order
        self._slot = {rid: i for i, rid in enumerate(order)}
        self._n = m
