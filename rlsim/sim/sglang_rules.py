"""SGLang's rules for `SimEngine` from the compiled core's source: `RolloutScheduler` over the
scheduler state of `rlsim.sim.compiled.sglang`, the very rules `CompiledEngine` runs (the registry's
SGLang entry names `sglang_rules`, which builds one; numba loads only where it is asked for, so
real mode under vLLM never loads it).

Each request is the caller's `Seq`, kept beside its slot of the state's table; what the engine reads
of a `Seq` it is handed back (its folded token counts, whether it decodes, whether it was reported
under the overlap loop) is copied from the slot as it is handed back. Parallel sampling's warm-ups
are requests of the rules' own (negative ids), each given a `Seq` here when it is queued.

Compiled, each call crosses into numba's machine code (the functions load from the shipped cache);
on the pure path (`RLSIM_PURE_PYTHON=1`) the same source runs as Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlsim.config import SGLangSettings
from rlsim.errors import RlsimError
from rlsim.protocol import Request
from rlsim.sim.compiled import sglang as sg
from rlsim.sim.seq import Scheduled, Seq
from rlsim.sim.sglang_scheduler import DEFAULTS, MAX_PREFILL_TOKENS, check_settings, pool_too_small
from rlsim.sim.slot_seqs import SlotSeqs

if TYPE_CHECKING:
    from rlsim.config import EngineConfig

_REFUSED_WHY = "prompt_too_long"


def sglang_rules(engine: EngineConfig, kv_tokens: int) -> SGLangRules:
    """SGLang's scheduler of one instance (the registry's `scheduler` for SGLang)."""
    return SGLangRules(
        kv_tokens, engine.max_num_seqs, engine.max_num_batched_tokens, engine.enable_chunked_prefill,
        engine.enable_prefix_caching, schedule_policy=engine.schedule_policy or "fcfs",
        parallel_sampling=bool(engine.parallel_sampling), settings=engine.sglang_settings(),
        page_size=engine.page_size or 1,
    )  # fmt: skip


class SGLangRules(SlotSeqs):
    """One instance's SGLang scheduler (`SGLangScheduler`'s arguments), on the compiled core's state."""

    rid_row, running_row = sg.C_RID, sg.C_RUNNING

    def __init__(
        self,
        num_tokens: int,
        max_running_requests: int,
        chunked_prefill_size: int,
        enable_chunked_prefill: bool = True,
        enable_radix_cache: bool = True,
        overlap: bool = True,
        max_prefill_tokens: int = MAX_PREFILL_TOKENS,
        schedule_policy: str = "fcfs",
        parallel_sampling: bool = False,
        settings: SGLangSettings = DEFAULTS,
        page_size: int = 1,
    ) -> None:
        check_settings(schedule_policy, page_size)
        d = settings
        super().__init__(sg.new_scheduler(
            num_tokens, max_running_requests, chunked_prefill_size, enable_chunked_prefill, enable_radix_cache,
            overlap, max_prefill_tokens, schedule_policy == "lpm", d.init_ratio, d.min_ratio, d.ratio_decay,
            d.clip_max_new_tokens_estimation, d.retract_decode_steps, page_size, parallel_sampling,
        ))  # fmt: skip
        self._sent: dict[int, Request] = {}  # a refused request as it was sent (its `Seq` holds the refused form)

    # ---- requests and slots ------------------------------------------------------------------
    def _new(self, seq: Seq) -> int:
        req = seq.req
        k = int(sg.new_slot(self.s, req.request_id, req.prompt_id, req.num_prompt_tokens, req.max_tokens,
                            req.prompt_len, seq.target, seq.generated, seq.transfer))  # fmt: skip
        self._keep(k, seq)
        return k

    def _seq(self, k: int) -> Seq:
        """The request in slot k, its counts as the rules hold them."""
        seq = self._seqs[int(k)]
        gen, comp, decoding, reported, target, refused, prompt_id, max_tokens = sg.view(self.s, k)
        seq.decoding, seq.reported = bool(decoding), bool(reported)
        seq.generated, seq.computed, seq.target = int(gen), int(comp), int(target)  # (numpy's on the pure path)
        prompt_id, max_tokens = int(prompt_id), int(max_tokens)
        req = seq.req
        if refused:  # a prompt the pool cannot hold: a one-token prompt until it ends (`own_abort`)
            if req.request_id not in self._sent:
                self._sent[req.request_id] = req
                seq.req = req._replace(prompt_id=prompt_id, num_prompt_tokens=1, max_tokens=1, prompt_len=0,
                                       kept_tokens=0)  # fmt: skip
        elif req.max_tokens != max_tokens:  # (clipped at arrival to what the pool holds beside it)
            seq.req = req._replace(max_tokens=max_tokens)
        return seq

    def _seqs_of(self, slots: np.ndarray) -> list[Seq]:
        return [self._seq(k) for k in slots]

    # ---- RolloutScheduler --------------------------------------------------------------------
    @property
    def kv_capacity_tokens(self) -> int:
        return int(self.s.num_tokens)

    @property
    def groups_calls(self) -> bool:
        return bool(self.s.groups)

    @property
    def num_decoding(self) -> int:
        return int(self.s.num_decoding)

    @property
    def ctx(self) -> float:
        return float(self.s.ctx)

    @property
    def rate_sum(self) -> float:
        return float(self.s.rate_sum)

    @property
    def verify_sum(self) -> float:
        return float(self.s.verify_sum)

    @property
    def num_speculating(self) -> int:
        return 0  # (speculative decoding is modelled under vLLM's rules only)

    @property
    def max_running_requests(self) -> int:
        return int(self.s.max_running)

    @property
    def chunked_prefill_size(self) -> int | None:
        return None if self.s.chunk_size < 0 else int(self.s.chunk_size)

    @property
    def page(self) -> int:
        return int(self.s.page)

    @property
    def cache(self):  # noqa: ANN201 - the state's radix cache (`rlsim.sim.compiled.radix.RadixState`)
        """The KV pool and radix tree: `num_tokens`, `free`, `evictable` as `RadixCache` names them."""
        return self.s.cache

    @property
    def new_token_ratio(self) -> float:
        return float(self.s.new_token_ratio)

    @property
    def retractions(self) -> int:
        return int(self.s.retractions)

    @property
    def warmups_run(self) -> int:
        return int(self.s.warmups_run)

    @property
    def running(self) -> dict[int, Seq]:
        """The running batch by request id, in batch order."""
        return {seq.req.request_id: seq for seq in self._seqs_of(sg.running(self.s))}

    def _waiting_slots(self) -> np.ndarray:
        return sg.waiting(self.s)

    @property
    def waiting(self) -> list[Seq]:
        return self._seqs_of(self._waiting_slots())

    def has_work(self) -> bool:
        return bool(self.s.num_running or self.s.w_len)

    def holds_finished(self) -> bool:
        return bool(self.s.num_fin)

    def add(self, seq: Seq) -> None:
        if seq.rate != 1.0:
            raise RlsimError("speculative decoding is modelled under vLLM's rules only: use --rollout-engine vllm")
        sg.add(self.s, self._new(seq))
        self._seq(self._slot[seq.req.request_id])

    def add_call(self, seqs: list[Seq]) -> None:
        if any(seq.rate != 1.0 for seq in seqs):
            raise RlsimError("speculative decoding is modelled under vLLM's rules only: use --rollout-engine vllm")
        sent = self.s.warm_sent
        slots = np.array([self._new(seq) for seq in seqs], np.int64)
        sg.add_call(self.s, slots)
        if self.s.warm_sent > sent:  # a warm-up of the prompt, queued last: a request of the rules' own
            k, req = int(sg.waiting(self.s)[-1]), seqs[0].req
            warm = Request(-int(self.s.warm_sent), req.prompt_id, -1, req.epoch, req.num_prompt_tokens, 0, 1,
                           req.instance, req.policy_version)  # fmt: skip
            self._keep(k, Seq(warm, 1))
        for k in slots:
            self._seq(k)

    def remove_waiting(self, rids: set[int]) -> list[Seq]:
        gone = sg.remove_waiting(self.s, np.array(sorted(rids), np.int64))
        out = self._seqs_of(gone)
        for k in gone:
            sg.release_slot(self.s, k)
        return out

    def schedule(self) -> Scheduled:
        s = self.s
        sg.schedule(s)
        if s.error:
            raise pool_too_small(int(s.error), int(s.num_tokens))
        n = s.out_num_chunks
        return Scheduled(float(s.out_decode_tokens), int(s.out_prefill_tokens), int(s.out_num_decodes),
                         list(zip(self._seqs_of(s.out_chunk[:n]), s.out_take[:n].tolist(), strict=True)),
                         self._seqs_of(s.out_preempted[: s.out_num_preempted]))  # fmt: skip

    def complete(self, out: Scheduled) -> list[Seq]:
        sg.complete(self.s)
        for seq, _ in out.chunks:  # (the first token of each prefill that ended)
            self._seq(self._slot[seq.req.request_id])
        return self._seqs_of(self.s.due[: self.s.num_due])

    def finish_due(self) -> list[Seq]:
        sg.finish_due(self.s)
        return self._seqs_of(self.s.due[: self.s.num_due])

    def release_finishing(self) -> None:
        sg.release_finishing(self.s)

    def generated(self, seq: Seq) -> int:
        return int(sg.generated(self.s, self._slot[seq.req.request_id]))

    def computed(self, seq: Seq) -> int:
        return int(sg.computed(self.s, self._slot[seq.req.request_id]))

    def abort(self, seq: Seq) -> int:
        gen = int(sg.abort(self.s, self._slot[seq.req.request_id]))
        self._seq(self._slot[seq.req.request_id])
        return gen

    def own_abort(self, seq: Seq) -> str | None:
        """Why SGLang aborted this ended request of its own accord (a prompt too long), the request
        given back as it was sent; None: it did not."""
        if not sg.own_abort(self.s, self._slot[seq.req.request_id]):
            return None
        seq.req = self._sent.pop(seq.req.request_id)
        return _REFUSED_WHY

    def on_idle(self) -> None:
        sg.on_idle(self.s)

    def free_all(self) -> list[Seq]:
        return self._seqs_of(sg.free_all(self.s))

    def jump_plan(self) -> int:
        return int(sg.jump_plan(self.s))

    def advance(self, k: int) -> None:
        sg.advance(self.s, k)
