"""A third rollout engine, registered from this one module: static batching.

The rules of a server without continuous batching (as a plain `generate()` loop serves): a batch
is admitted only once the last one has wholly left, each request reserving its prompt and its
`max_tokens` of KV up front, so nothing is ever preempted; the batch prefills in one iteration,
then decodes one token an iteration until its last request finishes. No prefix cache, no chunked
prefill. It exists to show that an engine is one registry entry and one `RolloutScheduler`: every
command and layer asks its entry what it does (`rlsim.rollout_engines`), and nothing else of rlsim
names it (`tests/test_toy_engine.py`).
"""

from __future__ import annotations

from collections import deque

from rlsim.config import EngineConfig
from rlsim.rollout_engines import RolloutEngine
from rlsim.sim.seq import QueueQueries, Scheduled, Seq

TOY = RolloutEngine("static", "Static batching", "1", "tests.toy_engine:static_rules")


class StaticBatching(QueueQueries):
    """One instance's static-batching rules (a `rlsim.sim.rollout_scheduler.RolloutScheduler`)."""

    def __init__(self, kv_tokens: int, max_num_seqs: int) -> None:
        self._kv_tokens, self._max_num_seqs = kv_tokens, max_num_seqs
        self.waiting: deque[Seq] = deque()
        self.running: dict[int, Seq] = {}  # request id -> request, admitted together
        self.finishing: list[Seq] = []  # (never: a finished request leaves at once)
        self.spec: list[Seq] = []  # (never: it does not speculate)
        self._reserved = 0  # KV tokens the batch reserved
        self._prefilled = False  # the batch's one prefill has run
        self._ctx = 0

    # ---- what the engine asks -------------------------------------------------------------
    @property
    def kv_capacity_tokens(self) -> int:
        return self._kv_tokens

    @property
    def groups_calls(self) -> bool:
        return False

    @property
    def num_decoding(self) -> int:
        return len(self.running) if self._prefilled else 0

    @property
    def ctx(self) -> float:
        return self._ctx

    @property
    def rate_sum(self) -> float:
        return self.num_decoding

    @property
    def verify_sum(self) -> float:
        return self.num_decoding

    prefix_hit_tokens = turn_tokens = turn_hit_tokens = 0  # (no prefix cache)

    def add(self, seq: Seq) -> None:
        self.waiting.append(seq)

    def add_call(self, seqs: list[Seq]) -> None:
        self.waiting.extend(seqs)

    def remove_waiting(self, rids: set[int]) -> list[Seq]:
        out = [q for q in self.waiting if q.req.request_id in rids]
        self.waiting = deque(q for q in self.waiting if q.req.request_id not in rids)
        return out

    def generated(self, seq: Seq) -> int:
        return seq.generated

    def own_abort(self, seq: Seq) -> str | None:
        return None

    def on_idle(self) -> None:
        pass

    def release_finishing(self) -> None:
        pass

    # ---- the rules ------------------------------------------------------------------------
    def _need(self, seq: Seq) -> int:
        return seq.req.num_prompt_tokens + seq.req.max_tokens

    def schedule(self) -> Scheduled:
        out = Scheduled()
        if not self.running:  # admit the next batch, in order, while its reservations fit
            while (self.waiting and len(self.running) < self._max_num_seqs
                   and self._reserved + self._need(self.waiting[0]) <= self._kv_tokens):  # fmt: skip
                seq = self.waiting.popleft()
                self._reserved += self._need(seq)
                self.running[seq.req.request_id] = seq
            out.blocked_by_kv = bool(self.waiting)
            self._prefilled = False
            for seq in self.running.values():  # prompt and tokens kept from before, all in one iteration
                tokens = seq.req.num_prompt_tokens + seq.generated
                out.chunks.append((seq, tokens))
                out.prefill_tokens += tokens
                self._ctx += tokens  # (the context an iteration is priced at holds what it computes)
        else:
            out.num_decodes = len(self.running)
            out.decode_tokens = float(out.num_decodes)
            self._ctx += out.num_decodes
        return out

    def complete(self, out: Scheduled) -> list[Seq]:
        for seq, tokens in out.chunks:  # a prefill samples each request's first token
            seq.computed, seq.generated = tokens, seq.generated + 1
        for seq in self.running.values() if out.num_decodes else ():  # a decode step its next
            seq.computed, seq.generated = seq.computed + 1, seq.generated + 1
        self._prefilled = bool(self.running)
        return self.finish_due()

    def jump_plan(self) -> int:
        if not self._prefilled or not self.running:
            return 0
        return min(seq.target - seq.generated for seq in self.running.values())

    def advance(self, k: int) -> None:
        """k decode steps at once: the context a step is priced at holds the token it adds
        (`rlsim.sim.jump.jump_cost`)."""
        for seq in self.running.values():
            seq.generated += k
            seq.computed += k
        self._ctx += k * len(self.running)

    def finish_due(self) -> list[Seq]:
        done = [seq for seq in self.running.values() if seq.generated >= seq.target]
        for seq in done:
            self._leave(seq)
        return done

    def _leave(self, seq: Seq) -> None:
        del self.running[seq.req.request_id]
        self._ctx -= seq.computed
        if not self.running:
            self._reserved, self._ctx, self._prefilled = 0, 0, False

    def abort(self, seq: Seq) -> int:
        self._leave(seq)
        return seq.generated

    def free_all(self) -> list[Seq]:
        back = list(self.running.values())
        self.running.clear()
        self._reserved, self._ctx, self._prefilled = 0, 0, False
        self.waiting.extendleft(reversed(back))
        return back


def static_rules(engine: EngineConfig, kv_tokens: int) -> StaticBatching:
    """The static-batching scheduler of one instance (the registry entry's `scheduler`)."""
    return StaticBatching(kv_tokens, engine.max_num_seqs)
