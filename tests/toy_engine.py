"""A third rollout engine, registered from this one module: static batching.

The rules of a server without continuous batching (as a plain `generate()` loop serves): a batch
is admitted only once the last one has wholly left, each request reserving its prompt and its
`max_tokens` of KV up front, so nothing is ever preempted; the batch prefills in one iteration,
then decodes one token an iteration until its last request finishes. No prefix cache, no chunked
prefill. It exists to show that an engine is one registry entry and its rules: every command and
layer asks its entry what it does (`rlsim.rollout_engines`), and nothing else of rlsim names it
(`tests/test_toy_engine.py`). Its rules are here twice: a `RolloutScheduler` that SimEngine drives,
and the same rules as arrays that the compiled core drives (`rlsim.sim.compiled.rules`: a state
record and its answer to each of the seam's questions).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from rlsim.config import EngineConfig
from rlsim.rollout_engines import RolloutEngine
from rlsim.sim.compiled.jit import PURE, Record, StructType, define, grow, grow_cols, njit
from rlsim.sim.compiled.rules import add_rules
from rlsim.sim.seq import QueueQueries, Scheduled, Seq

# its rules for SimEngine (`static_rules`) and for the compiled core (`toy_states`), both below
TOY = RolloutEngine("static", "Static batching", "1", "tests.toy_engine:static_rules",
                    compiled="tests.toy_engine:toy_states")  # fmt: skip


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


# ---- the same rules as arrays, for the compiled core ------------------------------------------------
# (`rlsim.sim.compiled.rules`: a state record and its answer to each of the seam's questions, added with
# `add_rules`; the registry entry `TOY_COMPILED` names `toy_states`, which builds the instances' states)
_ROWS = ("rid", "prompt_id", "npt", "max_tokens", "target", "generated", "computed", "running")
T_RID, T_PROMPT_ID, T_NPT, T_MAX_TOKENS, T_TARGET, T_GENERATED, T_COMPUTED, T_RUNNING = range(len(_ROWS))
TOY_FIELDS = (
    "kv_tokens", "max_num_seqs", "t", "num_slots", "spare", "num_spare", "w", "w_len", "run", "num_running",
    "reserved", "prefilled", "ctx", "num_decoding", "rate_sum", "verify_sum", "num_spec", "prefix_hit_tokens",
    "turn_tokens", "turn_hit_tokens", "out_chunk", "out_take", "out_num_chunks", "out_prefill_tokens",
    "out_decode_tokens", "out_num_decodes", "out_preempted", "out_num_preempted", "due", "num_due",
)  # fmt: skip


class ToyStateType(StructType):
    """numba's type of `ToyState`."""


class ToyState(Record):
    """One instance's static-batching state: the slot table, the queue, the batch, the last iteration."""

    __slots__ = TOY_FIELDS if PURE else ()


define(ToyState, ToyStateType, TOY_FIELDS)


@njit
def new_toy(kv_tokens: int, max_num_seqs: int) -> ToyState:
    z = np.zeros
    return ToyState(kv_tokens, max_num_seqs, z((len(_ROWS), 16), np.int64), 0, z(16, np.int64), 0,
                    z(16, np.int64), 0, z(16, np.int64), 0, 0, False, 0.0, 0, 0.0, 0.0, 0, 0, 0, 0,
                    z(16, np.int64), z(16, np.int64), 0, 0, 0.0, 0, z(1, np.int64), 0, z(16, np.int64), 0)  # fmt: skip


@njit
def _set_decoding(s: ToyState) -> None:
    n = s.num_running if s.prefilled else 0
    s.num_decoding, s.rate_sum, s.verify_sum = n, float(n), float(n)


@njit
def _leave(s: ToyState, k: int) -> None:
    j = 0
    for i in range(s.num_running):
        if s.run[i] != k:
            s.run[j] = s.run[i]
            j += 1
    s.num_running = j
    s.t[T_RUNNING, k] = 0
    s.ctx -= s.t[T_COMPUTED, k]
    if not s.num_running:
        s.reserved, s.ctx, s.prefilled = 0, 0.0, False
    _set_decoding(s)


@njit
def toy_has_work(s: ToyState) -> bool:
    return s.num_running > 0 or s.w_len > 0


@njit
def toy_none(s: ToyState) -> int:
    """(Nothing fails, nothing is held finished.)"""
    return 0


@njit
def toy_nothing(s: ToyState) -> None:
    """(Nothing to do when idle, no finished request holds its place.)"""


@njit
def toy_jump_plan(s: ToyState) -> int:
    if not s.prefilled or not s.num_running:
        return 0
    k = 2**62
    for i in range(s.num_running):
        j = s.run[i]
        k = min(k, s.t[T_TARGET, j] - s.t[T_GENERATED, j])
    return k


@njit
def toy_schedule(s: ToyState) -> None:
    t = s.t
    s.out_num_chunks = s.out_prefill_tokens = s.out_num_decodes = 0
    s.out_decode_tokens = 0.0
    if not s.num_running:  # admit the next batch, in order, while its reservations fit
        while s.w_len and s.num_running < s.max_num_seqs:
            k = s.w[0]
            need = t[T_NPT, k] + t[T_MAX_TOKENS, k]
            if s.reserved + need > s.kv_tokens:
                break
            s.w[: s.w_len - 1] = s.w[1 : s.w_len].copy()
            s.w_len -= 1
            s.reserved += need
            if s.num_running == s.run.shape[0]:
                s.run = grow(s.run)
            s.run[s.num_running] = k
            s.num_running += 1
            t[T_RUNNING, k] = 1
        s.prefilled = False
        _set_decoding(s)
        for i in range(s.num_running):  # prompt and tokens kept from before, all in one iteration
            k = s.run[i]
            tokens = t[T_NPT, k] + t[T_GENERATED, k]
            if s.out_num_chunks == s.out_chunk.shape[0]:
                s.out_chunk, s.out_take = grow(s.out_chunk), grow(s.out_take)
            s.out_chunk[s.out_num_chunks], s.out_take[s.out_num_chunks] = k, tokens
            s.out_num_chunks += 1
            s.out_prefill_tokens += tokens
            s.ctx += tokens
    else:
        s.out_num_decodes = s.num_running
        s.out_decode_tokens = float(s.num_running)
        s.ctx += s.num_running


@njit
def toy_finish_due(s: ToyState) -> None:
    s.num_due = 0
    for i in range(s.num_running):
        k = s.run[i]
        if s.t[T_GENERATED, k] >= s.t[T_TARGET, k]:
            if s.num_due == s.due.shape[0]:
                s.due = grow(s.due)
            s.due[s.num_due] = k
            s.num_due += 1
    for i in range(s.num_due):
        _leave(s, s.due[i])


@njit
def toy_complete(s: ToyState) -> None:
    t = s.t
    for i in range(s.out_num_chunks):  # a prefill samples each request's first token
        k = s.out_chunk[i]
        t[T_COMPUTED, k], t[T_GENERATED, k] = s.out_take[i], t[T_GENERATED, k] + 1
    if s.out_num_decodes:
        for i in range(s.num_running):  # a decode step its next
            k = s.run[i]
            t[T_COMPUTED, k], t[T_GENERATED, k] = t[T_COMPUTED, k] + 1, t[T_GENERATED, k] + 1
    s.prefilled = s.num_running > 0
    _set_decoding(s)
    toy_finish_due(s)


@njit
def toy_advance(s: ToyState, k: int) -> None:
    for i in range(s.num_running):
        j = s.run[i]
        s.t[T_GENERATED, j] += k
        s.t[T_COMPUTED, j] += k
    s.ctx += k * s.num_running


@njit
def toy_free_all(s: ToyState) -> np.ndarray:
    back = s.run[: s.num_running].copy()
    for k in back:
        s.t[T_RUNNING, k] = 0
    s.num_running = 0
    s.reserved, s.ctx, s.prefilled = 0, 0.0, False
    _set_decoding(s)
    rest = s.w[: s.w_len].copy()
    n = back.shape[0] + rest.shape[0]
    if n > s.w.shape[0]:
        s.w = np.zeros(2 * n, np.int64)
    s.w[: back.shape[0]], s.w[back.shape[0] : n] = back, rest
    s.w_len = n
    return back


@njit
def toy_abort(s: ToyState, k: int) -> int:
    _leave(s, k)
    return s.t[T_GENERATED, k]


@njit
def toy_generated(s: ToyState, k: int) -> int:
    return s.t[T_GENERATED, k]


@njit
def toy_enqueue(s: ToyState, k: int) -> None:
    if s.w_len == s.w.shape[0]:
        s.w = grow(s.w)
    s.w[s.w_len] = k
    s.w_len += 1


@njit
def toy_own_abort(s: ToyState, k: int) -> bool:
    return False


@njit
def toy_release_slot(s: ToyState, k: int) -> None:
    if s.num_spare == s.spare.shape[0]:
        s.spare = grow(s.spare)
    s.spare[s.num_spare] = k
    s.num_spare += 1


@njit
def toy_fields(s: ToyState, k: int) -> tuple:
    t = s.t
    return t[T_RID, k], t[T_PROMPT_ID, k], t[T_NPT, k], t[T_MAX_TOKENS, k], t[T_GENERATED, k], 0


@njit
def toy_remove_waiting(s: ToyState, rids: np.ndarray) -> np.ndarray:
    q = s.w[: s.w_len].copy()
    gone = np.zeros(q.shape[0], np.bool_)
    for j in range(q.shape[0]):
        for r in rids:
            if r == s.t[T_RID, q[j]]:
                gone[j] = True
    kept = q[~gone]
    s.w[: kept.shape[0]] = kept
    s.w_len = kept.shape[0]
    return q[gone]


@njit
def toy_can_abort(s: ToyState, k: int, rid: int) -> bool:
    return s.t[T_RUNNING, k] != 0 and s.t[T_RID, k] == rid


@njit
def toy_new_slot(s: ToyState, rid: int, prompt_id: int, npt: int, max_tokens: int, prompt_len: int,
                 more_turns: bool, target: int, kept: int, rate: float, verify: float,
                 lookahead: int) -> int:  # fmt: skip
    if s.num_spare:
        s.num_spare -= 1
        k = s.spare[s.num_spare]
    else:
        k = s.num_slots
        if k == s.t.shape[1]:
            s.t = grow_cols(s.t)
        s.num_slots += 1
    t = s.t
    t[:, k] = 0
    t[T_RID, k], t[T_PROMPT_ID, k], t[T_NPT, k], t[T_MAX_TOKENS, k] = rid, prompt_id, npt, max_tokens
    t[T_TARGET, k], t[T_GENERATED, k] = target, kept
    return k


@njit
def toy_groups_calls(s: ToyState) -> bool:
    return False


@njit
def toy_add_call(s: ToyState, slots: np.ndarray) -> None:
    for k in slots:
        toy_enqueue(s, k)


add_rules(ToyState, ToyStateType, {
    "has_work": toy_has_work, "failed": toy_none, "holds_finished": toy_none, "jump_plan": toy_jump_plan,
    "schedule": toy_schedule, "complete": toy_complete, "finish_due": toy_finish_due,
    "release_finishing": toy_nothing, "free_all": toy_free_all, "on_idle": toy_nothing, "advance": toy_advance,
    "abort": toy_abort, "generated": toy_generated, "enqueue": toy_enqueue, "own_abort": toy_own_abort,
    "release_slot": toy_release_slot, "fields": toy_fields, "remove_waiting": toy_remove_waiting,
    "can_abort": toy_can_abort, "new_slot": toy_new_slot, "groups_calls": toy_groups_calls,
    "add_call": toy_add_call,
})  # fmt: skip


def toy_states(engine: EngineConfig, kv_tokens: int, n: int) -> tuple[list, int, int]:
    """Each of `n` instances' static-batching state (the registry entry's `compiled`); a submit takes a
    request of at most the KV, which its errors name."""
    if PURE:
        return [new_toy(kv_tokens, engine.max_num_seqs) for _ in range(n)], kv_tokens, kv_tokens
    from numba.typed import List

    states = List()
    for _ in range(n):
        states.append(new_toy(kv_tokens, engine.max_num_seqs))
    return states, kv_tokens, kv_tokens

