"""vLLM's rules for `SimEngine` from the compiled core's source: `RolloutScheduler` over the
scheduler state of `rlsim.sim.compiled.scheduler`, the very rules `CompiledEngine` runs (the
registry's vLLM entry names `vllm_rules`, which builds one; numba loads only where it is asked
for, so real mode never loads it), and the rules `rlsim.sim.sched_parity` holds to vLLM's own
`Scheduler` iteration by iteration.

Each request is the caller's `Seq`, kept beside its slot of the state's table; what the engine reads
of a `Seq` it is handed back (its token counts, whether it decodes, whether it was reported finished
under async scheduling) is copied from the slot as it is handed back. Under speculative decoding a
request's `rate`, `verify` and `lookahead`, set before it is queued, go into its slot.

Compiled, each call crosses into numba's machine code (the functions load from the shipped cache);
on the pure path (`RLSIM_PURE_PYTHON=1`) the same source runs as Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlsim.sim.compiled import scheduler as cs
from rlsim.sim.seq import Scheduled, Seq
from rlsim.sim.slot_seqs import SlotSeqs

if TYPE_CHECKING:
    from rlsim.config import EngineConfig


def vllm_rules(engine: EngineConfig, kv_tokens: int) -> VLLMRules:
    """vLLM's scheduler of one instance holding `kv_tokens` KV tokens (whole blocks), as its `Scheduler`,
    or as its `AsyncScheduler` where the engine schedules asynchronously (vLLM's default on GPU executors):
    the registry's `scheduler` for vLLM."""
    return VLLMRules(
        kv_tokens // engine.block_size, engine.block_size, engine.max_num_seqs, engine.max_num_batched_tokens,
        engine.enable_chunked_prefill, engine.enable_prefix_caching, async_scheduling=bool(engine.async_scheduling),
    )  # fmt: skip


class VLLMRules(SlotSeqs):
    """One instance's vLLM scheduler (its `Scheduler`, or `AsyncScheduler` with `async_scheduling`), on
    the compiled core's state: its waiting queue, running list, budget, block pool and preemption."""

    rid_row, running_row = cs.C_RID, cs.C_RUNNING

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool = True,
        enable_prefix_caching: bool = True,
        async_scheduling: bool = False,
    ) -> None:
        super().__init__(cs.new_scheduler(int(num_blocks), int(block_size), int(max_num_seqs),
                                          int(max_num_batched_tokens), bool(enable_chunked_prefill),
                                          bool(enable_prefix_caching), bool(async_scheduling)))  # fmt: skip
        self._capacity = int(num_blocks) * int(block_size)
        self._sync()

    def _sync(self) -> None:
        """Read the sums and queue lengths the engine asks for, after a call that changed them."""
        dec, ctx, rate, verify, spec, running, _, finishing = cs.sums(self.s)
        self._num_decoding, self._num_spec, self._num_running = int(dec), int(spec), int(running)
        self._num_finishing = int(finishing)
        self._ctx, self._rate_sum, self._verify_sum = float(ctx), float(rate), float(verify)

    # ---- requests and slots ------------------------------------------------------------------
    def _seqs_of(self, slots: np.ndarray) -> list[Seq]:
        """The requests in these slots, their counts as the rules hold them (a decoding one's as of
        the iteration it started decoding at, from which `generated` counts on)."""
        if not len(slots):
            return []
        seqs, out = self._seqs, []
        for k, (gen, comp, decoding, reported) in zip(slots.tolist(), cs.counts(self.s, slots).tolist(), strict=True):
            seq = seqs[k]
            seq.generated, seq.computed, seq.decoding, seq.reported = gen, comp, decoding != 0, reported != 0
            out.append(seq)
        return out

    def _seq(self, k: int) -> Seq:
        return self._seqs_of(np.array([k], np.int64))[0]

    # ---- RolloutScheduler --------------------------------------------------------------------
    @property
    def kv_capacity_tokens(self) -> int:
        return self._capacity

    @property
    def groups_calls(self) -> bool:
        return False  # each sample of a call is its own request (vLLM's n > 1 fans out before the scheduler)

    @property
    def num_decoding(self) -> int:
        return self._num_decoding

    @property
    def ctx(self) -> float:
        return self._ctx

    @property
    def rate_sum(self) -> float:
        return self._rate_sum

    @property
    def verify_sum(self) -> float:
        return self._verify_sum

    @property
    def num_speculating(self) -> int:
        return self._num_spec

    @property
    def num_running(self) -> int:
        return self._num_running

    @property
    def num_waiting(self) -> int:
        return int(self.s.w_len)

    @property
    def iters(self) -> int:
        """Iterations run so far."""
        return int(self.s.iters)

    def _running_slots(self) -> np.ndarray:
        t, out = self.s.t, []
        k = int(t[cs.C_R_NEXT, 0])
        while k:
            out.append(k)
            k = int(t[cs.C_R_NEXT, k])
        return np.array(out, np.int64)

    def _waiting_slots(self) -> np.ndarray:
        s = self.s
        buf, head = s.w_buf, int(s.w_head)
        return buf[(head + np.arange(int(s.w_len))) % len(buf)].astype(np.int64)

    @property
    def running(self) -> dict[int, Seq]:
        """The running list by request id, in running order."""
        return {seq.req.request_id: seq for seq in self._seqs_of(self._running_slots())}

    @property
    def waiting(self) -> list[Seq]:
        return self._seqs_of(self._waiting_slots())

    def has_work(self) -> bool:
        return bool(self._num_running or self.s.w_len)

    def holds_finished(self) -> bool:
        return bool(self._num_finishing)

    def add_call(self, seqs: list[Seq]) -> None:
        """A call's samples, queued one by one."""
        for seq in seqs:
            self.add(seq)

    def add(self, seq: Seq) -> None:
        req = seq.req
        k = int(cs.add(self.s, int(req.request_id), int(req.prompt_id), int(req.num_prompt_tokens),
                       int(req.max_tokens), int(req.prompt_len), bool(req.more_turns), int(seq.target),
                       int(seq.generated), bool(seq.transfer), float(seq.rate), float(seq.verify),
                       int(seq.lookahead)))  # fmt: skip
        self._keep(k, seq)

    def remove_waiting(self, rids: set[int]) -> list[Seq]:
        if not self.s.w_len:
            return []
        gone = cs.remove_waiting(self.s, np.array(sorted(rids), np.int64))
        out = self._seqs_of(gone)
        for k in gone.tolist():
            cs.release_slot(self.s, k)
        return out

    def schedule(self) -> Scheduled:
        s = self.s
        cs.schedule(s)
        decode_tokens, prefill_tokens, num_decodes, blocked, chunk, take, preempted = cs.batch(s)
        self._sync()
        return Scheduled(float(decode_tokens), int(prefill_tokens), int(num_decodes),
                         list(zip(self._seqs_of(chunk), take.tolist(), strict=True)) if len(chunk) else [],
                         self._seqs_of(preempted), bool(blocked))  # fmt: skip

    def complete(self, out: Scheduled) -> list[Seq]:
        s = self.s
        cs.complete(s)
        if out.chunks:  # (the first token of each prefill that ended)
            self._seqs_of(np.array([self._slot[seq.req.request_id] for seq, _ in out.chunks], np.int64))
        self._sync()
        return self._seqs_of(cs.due_slots(s))

    def finish_due(self) -> list[Seq]:
        s = self.s
        cs.finish_due(s)
        self._sync()
        return self._seqs_of(cs.due_slots(s))

    def release_finishing(self) -> None:
        cs.release_finishing(self.s)
        self._sync()

    def generated(self, seq: Seq) -> int:
        return int(cs.generated(self.s, self._slot[seq.req.request_id]))

    def abort(self, seq: Seq) -> int:
        k = self._slot[seq.req.request_id]
        gen = int(cs.abort(self.s, k))
        self._sync()
        self._seq(k)
        return gen

    def own_abort(self, seq: Seq) -> str | None:
        """vLLM aborts nothing of its own accord here (a prompt it cannot hold is refused before the run)."""
        return None

    def on_idle(self) -> None:
        """Nothing to schedule: vLLM's scheduler keeps no state that an idle pass resets."""

    def free_all(self) -> list[Seq]:
        carried = cs.free_all(self.s)
        self._sync()
        return self._seqs_of(carried)

    def jump_plan(self) -> int:
        return int(cs.jump_plan(self.s))

    def advance(self, k: int) -> None:
        cs.advance(self.s, int(k))
        self._sync()

    def idle_until(self, it: int) -> None:
        """No request runs or waits: the iteration count moves on to `it` (an iteration-indexed driver's
        next arrival, `rlsim.sim.sched_parity`)."""
        self.s.iters = it
