"""The requests of rules that hold them as slots of a compiled state (`rlsim.sim.vllm_rules.VLLMRules`,
`rlsim.sim.sglang_rules.SGLangRules`): each request is the caller's `Seq`, kept beside the slot the
rules hold it in, and the counters a run reports are read off the state."""

from __future__ import annotations

import numpy as np

from rlsim.sim.seq import Seq


class SlotSeqs:
    """The `Seq` in each slot, the slot of each request id, and the state's counters; `s` is the
    rules' state (its slot table `t`, whose row `rid_row` holds each slot's request id and row
    `running_row` whether the slot runs). A subclass reads a slot's request (`_seq`) and the
    waiting queue's slots (`_waiting_slots`) off its state."""

    rid_row: int
    running_row: int

    def __init__(self, state: object) -> None:
        self.s = state
        self._seqs: dict[int, Seq] = {}  # slot -> the request in it now
        self._slot: dict[int, int] = {}  # request id -> its slot (one entry per slot: a reused slot's last goes)

    def _keep(self, k: int, seq: Seq) -> None:
        """This request is in slot k now (the slot's last request is forgotten)."""
        old = self._seqs.get(k)
        if old is not None and self._slot.get(old.req.request_id) == k:
            del self._slot[old.req.request_id]
        self._seqs[k] = seq
        self._slot[seq.req.request_id] = k

    def _live(self, rid: int) -> int | None:
        """The slot of this request while its slot holds it (running, waiting, or ended until the slot
        is reused), else None."""
        k = self._slot.get(rid)
        return k if k is not None and self.s.t[self.rid_row, k] == rid else None

    def _seq(self, k: int) -> Seq:
        raise NotImplementedError

    def _waiting_slots(self) -> np.ndarray:
        raise NotImplementedError

    def running_seq(self, rid: int) -> Seq | None:
        """The running request of this id, else None."""
        k = self._live(rid)
        return self._seq(k) if k is not None and self.s.t[self.running_row, k] else None

    def find(self, rid: int) -> Seq | None:
        """The request of this id, running or waiting, else None."""
        seq = self.running_seq(rid)
        if seq is not None:
            return seq
        k = self._live(rid)
        return self._seq(k) if k is not None and k in self._waiting_slots().tolist() else None

    @property
    def prefix_hit_tokens(self) -> int:
        """Prompt tokens the prefix cache saved."""
        return int(self.s.prefix_hit_tokens)

    @property
    def turn_tokens(self) -> int:
        """Later turns' context tokens (multi-turn)."""
        return int(self.s.turn_tokens)

    @property
    def turn_hit_tokens(self) -> int:
        """Of which the prefix cache held."""
        return int(self.s.turn_hit_tokens)
