"""`rlsim.sim.scheduler.InstanceScheduler` as arrays the compiled core runs.

The same vLLM 0.32 rules, line for line, with each `Seq` a row (slot) of per-instance tables:
the running list is a linked list of slots in admission order, the waiting queue a ring of slots,
the finish heap rows of (finish_iter, request_id, slot) (`rlsim.sim.compiled.heap`), a request's
cached slabs a row of slab ids, and an iteration's batch (`Scheduled`) lives in the state's
`out_*` fields. Slots of
requests that left are reused. Decoders at one token per iteration are counted by phase, as in
`InstanceScheduler`; speculating ones (another rate) are a list of slots counted one by one.

`tests/test_compiled_scheduler.py` runs this scheduler and `InstanceScheduler` on the same random
workloads and holds every iteration's batch, preemptions, finishes and counters equal.
"""

from __future__ import annotations

import math

import numpy as np

from rlsim.sim.compiled import block_pool as bp
from rlsim.sim.compiled import heap as hp
from rlsim.sim.compiled.jit import PURE, Record, StructType, define, grow, grow_cols, njit

_SLOT_INTS = (
    "rid", "prompt_id", "npt", "max_tokens", "prompt_len", "more_turns", "target", "generated", "computed",
    "start_iter", "finish_iter", "decoding", "num_hashed_blocks", "order", "prompt_blocks", "transfer",
    "reported", "nhashed", "r_prev", "r_next", "running", "lookahead", "held_lookahead", "spec_pos",
    "p_prev", "p_next", "prefilling", "ph_prev", "ph_next", "ph",
)  # fmt: skip
_SLOT_FLOATS = ("rate", "verify", "spec_computed", "spec_start_iter")  # fmt: skip
FIELDS = (
    "num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "chunked", "caching", "async_sched",
    "pool", "t", "tf", "hashed", "spare", "num_spare", "num_slots", "num_running",
    "w_buf", "w_head", "w_len", "heap", "heap_len", "iters", "ctx", "num_decoding", "rate_sum", "verify_sum",
    "order_ctr", "prefix_hit_tokens", "turn_tokens", "turn_hit_tokens", "finishing", "finishing_rid", "num_finishing",
    "out_decode_tokens", "out_prefill_tokens", "out_num_decodes", "out_chunk", "out_take", "out_num_chunks",
    "out_preempted", "out_num_preempted", "out_blocked", "due", "num_due", "phase_counts", "ph_head",
    "num_unit_rate", "spec", "num_spec",
)  # fmt: skip
# rows of the slot table `t`, one per field of a `Seq` (and the running list's links)
C_RID, C_PROMPT_ID, C_NPT, C_MAX_TOKENS, C_PROMPT_LEN, C_MORE_TURNS, C_TARGET = 0, 1, 2, 3, 4, 5, 6
C_GENERATED, C_COMPUTED, C_START_ITER, C_FINISH_ITER, C_DECODING, C_NUM_HASHED_BLOCKS = 7, 8, 9, 10, 11, 12
C_ORDER, C_PROMPT_BLOCKS, C_TRANSFER, C_REPORTED, C_NHASHED, C_R_PREV, C_R_NEXT, C_RUNNING = (
    13, 14, 15, 16, 17, 18, 19, 20,
)
C_LOOKAHEAD, C_HELD_LOOKAHEAD, C_SPEC_POS = 21, 22, 23
# the running requests not yet decoding, in running order (linked through slot 0 too): the only ones
# an iteration's prefill chunks come from, so that it need not walk every running request
C_P_PREV, C_P_NEXT, C_PREFILLING = 24, 25, 26
# the unit-rate decoders of each phase (`InstanceScheduler.phase`), one linked list per phase
C_PH_PREV, C_PH_NEXT, C_PH = 27, 28, 29
# rows of the float table `tf`: a decoder's tokens per iteration and tokens verified per iteration
# and, while it decodes at another rate than one, its computed tokens and start iteration
F_RATE, F_VERIFY, F_SPEC_COMPUTED, F_SPEC_START_ITER = 0, 1, 2, 3


class SchedStateType(StructType):
    """numba's type of `SchedState`."""


class SchedState(Record):
    """One instance's scheduler: settings, pool, slot table, queues and the last batch."""

    __slots__ = FIELDS if PURE else ()


define(SchedState, SchedStateType, FIELDS)


@njit
def new_scheduler(
    num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
    enable_chunked_prefill: bool = True, enable_prefix_caching: bool = True, async_scheduling: bool = False,
) -> SchedState:  # fmt: skip
    cap = 16
    t = np.zeros((len(_SLOT_INTS), cap), np.int64)  # (slot 0: the running list's sentinel)
    tf = np.zeros((len(_SLOT_FLOATS), cap))
    z = np.zeros
    return SchedState(
        num_blocks, block_size, max_num_seqs, max_num_batched_tokens, enable_chunked_prefill,
        enable_prefix_caching, async_scheduling,
        bp.new_pool(num_blocks, enable_prefix_caching, 64), t, tf, np.full((cap, 4), -1, np.int64),
        z(cap, np.int64), 0, 1, 0,
        z(cap, np.int64), 0, 0, np.zeros((cap, 3), np.int64), 0, 0, 0.0, 0, 0.0, 0.0,
        0, 0, 0, 0, z(cap, np.int64), z(cap, np.int64), 0,
        0.0, 0, 0, z(cap, np.int64), z(cap, np.int64), 0,
        z(cap, np.int64), 0, False, z(cap, np.int64), 0, z(block_size, np.int64), np.full(block_size, -1, np.int64),
        0, z(cap, np.int64), 0,
    )  # fmt: skip


# ---- the slot table ----------------------------------------------------------------------------
@njit
def add(s: SchedState, rid: int, prompt_id: int, npt: int, max_tokens: int, prompt_len: int, more_turns: bool,
        target: int, generated: int, transfer: bool, rate: float = 1.0, verify: float = 1.0,
        lookahead: int = 0) -> int:  # fmt: skip
    """A request joins the waiting queue; returns its slot."""
    k = new_slot(s, rid, prompt_id, npt, max_tokens, prompt_len, more_turns, target, generated, transfer, rate,
                 verify, lookahead)  # fmt: skip
    enqueue(s, k)
    return k


@njit
def enqueue(s: SchedState, k: int) -> None:
    """The request in slot k joins the back of the waiting queue."""
    _w_push(s, k, False)


@njit
def new_slot(s: SchedState, rid: int, prompt_id: int, npt: int, max_tokens: int, prompt_len: int,
             more_turns: bool, target: int, generated: int, transfer: bool, rate: float, verify: float,
             lookahead: int) -> int:  # fmt: skip
    """A slot for a request, not yet queued. Under speculative decoding it decodes `rate` tokens and
    verifies `verify` per iteration and holds `lookahead` slots past its tokens. A slot is reused
    once its request has finished or been aborted (`_free`), or left the waiting queue aborted
    (`release_slot`)."""
    if s.num_spare > 0:
        s.num_spare -= 1
        k = s.spare[s.num_spare]
    else:
        k = s.num_slots
        if k == s.t.shape[1]:
            s.t, s.tf = grow_cols(s.t), grow_cols(s.tf)
            h = np.full((2 * k, s.hashed.shape[1]), -1, np.int64)
            h[:k] = s.hashed
            s.hashed = h
            s.spare = grow(s.spare)
        s.num_slots += 1
    t = s.t
    t[:, k] = 0
    t[C_RID, k], t[C_PROMPT_ID, k], t[C_NPT, k], t[C_MAX_TOKENS, k] = rid, prompt_id, npt, max_tokens
    t[C_PROMPT_LEN, k], t[C_MORE_TURNS, k], t[C_TARGET, k] = prompt_len, more_turns, target
    t[C_GENERATED, k], t[C_TRANSFER, k], t[C_LOOKAHEAD, k] = generated, transfer, lookahead
    s.tf[:, k] = 0.0
    s.tf[F_RATE, k], s.tf[F_VERIFY, k] = rate, verify
    t[C_PROMPT_BLOCKS, k] = (prompt_len if prompt_len else npt) // s.block_size
    return k


@njit
def release_slot(s: SchedState, k: int) -> None:
    """The request in slot k left the engine: its slot is reused by a later request (its fields
    stay readable until then)."""
    s.spare[s.num_spare] = k
    s.num_spare += 1


@njit
def _hold(s: SchedState, k: int, slab: int) -> None:
    n = s.t[C_NHASHED, k]
    if n == s.hashed.shape[1]:
        h = np.full((s.hashed.shape[0], 2 * n), -1, np.int64)
        h[:, :n] = s.hashed
        s.hashed = h
    s.hashed[k, n] = slab
    s.t[C_NHASHED, k] = n + 1


# ---- the waiting queue (a ring) and the running list (linked through slot 0) --------------------
@njit
def _w_push(s: SchedState, k: int, front: bool) -> None:
    cap = s.w_buf.shape[0]
    if s.w_len == cap:
        buf = np.zeros(2 * cap, np.int64)
        for i in range(cap):
            buf[i] = s.w_buf[(s.w_head + i) % cap]
        s.w_buf, s.w_head, cap = buf, 0, 2 * cap
    if front:
        s.w_head = (s.w_head - 1) % cap
        s.w_buf[s.w_head] = k
    else:
        s.w_buf[(s.w_head + s.w_len) % cap] = k
    s.w_len += 1


@njit
def waiting_at(s: SchedState, i: int) -> int:
    return s.w_buf[(s.w_head + i) % s.w_buf.shape[0]]


@njit
def remove_waiting(s: SchedState, rids: np.ndarray) -> np.ndarray:
    """Take these requests out of the waiting queue (one pass, order kept); return their slots."""
    gone = np.empty(s.w_len, np.int64)
    ng = 0
    keep = 0
    cap = s.w_buf.shape[0]
    for i in range(s.w_len):
        k = s.w_buf[(s.w_head + i) % cap]
        hit = False
        for r in rids:
            if r == s.t[C_RID, k]:
                hit = True
                break
        if hit:
            gone[ng] = k
            ng += 1
        else:
            s.w_buf[(s.w_head + keep) % cap] = k
            keep += 1
    s.w_len = keep
    return gone[:ng]


@njit
def _r_append(s: SchedState, k: int) -> None:
    t = s.t
    last = t[C_R_PREV, 0]
    t[C_R_PREV, k], t[C_R_NEXT, k] = last, 0
    t[C_R_NEXT, last] = k
    t[C_R_PREV, 0] = k
    t[C_RUNNING, k] = 1
    s.num_running += 1
    last = t[C_P_PREV, 0]  # (admitted: it prefills first)
    t[C_P_PREV, k], t[C_P_NEXT, k] = last, 0
    t[C_P_NEXT, last] = k
    t[C_P_PREV, 0] = k
    t[C_PREFILLING, k] = 1


@njit
def _r_remove(s: SchedState, k: int) -> None:
    t = s.t
    a, b = t[C_R_PREV, k], t[C_R_NEXT, k]
    t[C_R_NEXT, a], t[C_R_PREV, b] = b, a
    t[C_RUNNING, k] = 0
    s.num_running -= 1
    _p_remove(s, k)


@njit
def _p_remove(s: SchedState, k: int) -> None:
    t = s.t
    if t[C_PREFILLING, k]:
        a, b = t[C_P_PREV, k], t[C_P_NEXT, k]
        t[C_P_NEXT, a], t[C_P_PREV, b] = b, a
        t[C_PREFILLING, k] = 0


# ---- token positions of a decoding request -------------------------------------------------------
@njit
def computed(s: SchedState, k: int) -> float:
    t = s.t
    if not t[C_DECODING, k]:
        return t[C_COMPUTED, k]
    return t[C_COMPUTED, k] + (s.iters - t[C_START_ITER, k]) * s.tf[F_RATE, k]


@njit
def generated(s: SchedState, k: int) -> int:
    t = s.t
    if not t[C_DECODING, k]:
        return t[C_GENERATED, k]
    done = int((s.iters - t[C_START_ITER, k]) * s.tf[F_RATE, k] + 1e-9)
    return t[C_GENERATED, k] + min(done, t[C_TARGET, k] - t[C_GENERATED, k])


@njit
def _blocks(s: SchedState, tokens: float) -> int:
    return math.ceil(tokens / s.block_size - 1e-9)


@njit
def _stop_decoding(s: SchedState, k: int) -> None:
    t, tf = s.t, s.tf
    rate = tf[F_RATE, k]
    if rate != 1.0:
        gen = generated(s, k)
        t[C_COMPUTED, k] = int(round(computed(s, k)))
        t[C_GENERATED, k] = gen
    t[C_DECODING, k] = 0
    s.num_decoding -= 1
    s.rate_sum -= rate
    s.verify_sum -= tf[F_VERIFY, k]
    if rate == 1.0:
        ran = s.iters - t[C_START_ITER, k]
        t[C_GENERATED, k] += min(ran, t[C_TARGET, k] - t[C_GENERATED, k])
        t[C_COMPUTED, k] += ran
        s.num_unit_rate -= 1
        ph = t[C_PH, k]
        s.phase_counts[ph] -= 1
        a, b = t[C_PH_PREV, k], t[C_PH_NEXT, k]
        if a < 0:
            s.ph_head[ph] = b
        else:
            t[C_PH_NEXT, a] = b
        if b >= 0:
            t[C_PH_PREV, b] = a
    else:  # out of the speculating list (the last one takes its place)
        i = t[C_SPEC_POS, k]
        last = s.spec[s.num_spec - 1]
        s.spec[i] = last
        t[C_SPEC_POS, last] = i
        s.num_spec -= 1
        t[C_SPEC_POS, k] = -1
    if s.num_decoding == 0:  # no float drift left behind
        s.rate_sum = s.verify_sum = 0.0


@njit
def _start_decoding(s: SchedState, k: int, at: int) -> None:
    """Decode from iteration `at` (-1: the next one to run), one token a step."""
    t, tf = s.t, s.tf
    rate = tf[F_RATE, k]
    at = s.iters if at < 0 else at
    _p_remove(s, k)
    t[C_DECODING, k] = 1
    t[C_START_ITER, k] = at
    t[C_FINISH_ITER, k] = at + math.ceil((t[C_TARGET, k] - t[C_GENERATED, k]) / rate - 1e-9)
    s.num_decoding += 1
    s.rate_sum += rate
    s.verify_sum += tf[F_VERIFY, k]
    if rate == 1.0:
        s.num_unit_rate += 1
        ph = (t[C_COMPUTED, k] - 1 - at) % s.block_size
        s.phase_counts[ph] += 1
        head = s.ph_head[ph]
        t[C_PH, k], t[C_PH_PREV, k], t[C_PH_NEXT, k] = ph, -1, head
        if head >= 0:
            t[C_PH_PREV, head] = k
        s.ph_head[ph] = k
    else:
        if s.num_spec == s.spec.shape[0]:
            s.spec = grow(s.spec)
        s.spec[s.num_spec] = k
        t[C_SPEC_POS, k] = s.num_spec
        s.num_spec += 1
        tf[F_SPEC_COMPUTED, k] = t[C_COMPUTED, k] + t[C_HELD_LOOKAHEAD, k]
        tf[F_SPEC_START_ITER, k] = at
    s.heap = hp.push(s.heap, s.heap_len, t[C_FINISH_ITER, k], t[C_RID, k], k, 0)
    s.heap_len += 1


# ---- one iteration -------------------------------------------------------------------------------
@njit
def _chunk_blocks(s: SchedState, k: int, take: int) -> tuple[int, int]:
    """(Blocks a prefill chunk of `take` tokens allocates, lookahead held after it)."""
    t, b = s.t, s.block_size
    end = t[C_COMPUTED, k] + take
    la = t[C_LOOKAHEAD, k] if end >= t[C_NPT, k] + t[C_GENERATED, k] else 0
    return -(-(end + la) // b) + (t[C_COMPUTED, k] + t[C_HELD_LOOKAHEAD, k]) // -b, la


@njit
def _decode_need(s: SchedState, k: int) -> int:
    c = computed(s, k) + s.t[C_HELD_LOOKAHEAD, k]
    return _blocks(s, c + s.tf[F_RATE, k]) - _blocks(s, c)


@njit
def _admit_check(s: SchedState, k: int, budget: int) -> tuple:
    """(status, tokens of its first chunk, prefix pieces, blocks hit): status 0 admit, 1 its blocks
    do not fit, 2 chunked prefill is off and it exceeds the budget."""
    t, b = s.t, s.block_size
    ntok = t[C_NPT, k] + t[C_GENERATED, k]
    hit = np.empty((0, 3), np.int64)
    num_hit_blocks, evict = 0, 0
    if s.caching:
        hit = bp.lookup(s.pool, t[C_PROMPT_ID, k], t[C_PROMPT_BLOCKS, k], t[C_RID, k], (ntok - 1) // b)
        if hit.shape[0]:
            for i in range(hit.shape[0]):
                num_hit_blocks += hit[i, 2] - hit[i, 1]
            evict = bp.evictable(s.pool, hit)
    new = 1 if t[C_TRANSFER, k] else ntok - num_hit_blocks * b
    if not s.chunked and new > budget:
        return 2, 0, hit, 0
    if -(-(ntok + t[C_LOOKAHEAD, k]) // b) - num_hit_blocks + evict > s.pool.free:
        return 1, 0, hit, 0
    return 0, min(new, budget), hit, num_hit_blocks


@njit
def _out_reset(s: SchedState) -> None:
    s.out_decode_tokens, s.out_prefill_tokens, s.out_num_decodes = 0.0, 0, 0
    s.out_num_chunks = s.out_num_preempted = 0
    s.out_blocked = False


@njit
def _out_preempt(s: SchedState, k: int) -> None:
    if s.out_num_preempted == s.out_preempted.shape[0]:
        s.out_preempted = grow(s.out_preempted)
    s.out_preempted[s.out_num_preempted] = k
    s.out_num_preempted += 1


@njit
def schedule(s: SchedState) -> None:
    """vLLM's `schedule()`: the batch of this iteration in `out_*` (blocks allocated, preemptions done)."""
    _out_reset(s)
    t = s.t
    budget = s.max_num_batched_tokens
    if s.num_decoding == s.num_running and s.num_spec == 0 and s.num_decoding <= budget:
        _schedule_decodes(s)
        if s.out_num_preempted:
            return
        _admit(s, budget - s.num_decoding)
        return
    if _bulk_ok(s, budget):
        dec = decode_blocks(s, 1) if s.num_decoding else 0
        need = dec
        k = t[C_P_NEXT, 0]
        while k != 0:
            need += _chunk_blocks(s, k, t[C_NPT, k] + t[C_GENERATED, k] - t[C_COMPUTED, k])[0]
            k = t[C_P_NEXT, k]
        if need <= s.pool.free:  # nothing preempts and every running request fits the budget
            bp.take(s.pool, dec)
            budget -= math.ceil(s.verify_sum - 1e-9)
            s.out_decode_tokens, s.out_num_decodes = s.verify_sum, s.num_decoding
            s.ctx += s.rate_sum
            k = t[C_P_NEXT, 0]
            while k != 0:
                nxt = t[C_P_NEXT, k]
                take = t[C_NPT, k] + t[C_GENERATED, k] - t[C_COMPUTED, k]
                _prefill_chunk(s, k, take)
                budget -= take
                k = nxt
            _admit(s, budget)
            return
    running = np.empty(s.num_running, np.int64)
    k, n = t[C_R_NEXT, 0], 0
    while k != 0:
        running[n] = k
        n += 1
        k = t[C_R_NEXT, k]
    i = 0
    while i < n and budget > 0:
        k = running[i]
        if t[C_REPORTED, k] and not t[C_DECODING, k]:  # async: reached max_tokens, holds its blocks
            i += 1
            continue
        if t[C_DECODING, k]:
            new = math.ceil(s.tf[F_VERIFY, k] - 1e-9)
            if new > budget:
                break
            need = _decode_need(s, k)
        else:
            new = min(t[C_NPT, k] + t[C_GENERATED, k] - t[C_COMPUTED, k], budget)
            need = _chunk_blocks(s, k, new)[0]
        while need > s.pool.free:
            victim = running[n - 1]
            n -= 1
            preempt(s, victim)
            _out_preempt(s, victim)
            if victim == k:
                break
        if n <= i:  # it preempted itself
            break
        budget -= new
        if t[C_DECODING, k]:
            bp.take(s.pool, need)
            s.out_decode_tokens += s.tf[F_VERIFY, k]
            s.out_num_decodes += 1
            s.ctx += s.tf[F_RATE, k]
        else:
            _prefill_chunk(s, k, new)
        i += 1
    for j in range(i, n):  # decoders the budget left out this iteration do not advance
        k = running[j]
        if t[C_DECODING, k]:
            _stop_decoding(s, k)
            _start_decoding(s, k, s.iters + 1)
    if s.out_num_preempted:
        return
    _admit(s, budget)


@njit
def _schedule_decodes(s: SchedState) -> None:
    """The running loop when every running request decodes one token and the budget holds them
    all: only the requests whose next token opens a block allocate, in running order."""
    b = s.block_size
    ph = (b - 1 - s.iters) % b
    due = s.phase_counts[ph]
    if due <= s.pool.free:
        bp.take(s.pool, due)
    else:
        t = s.t
        needers, orders = np.empty(due, np.int64), np.empty(due, np.int64)
        k = s.ph_head[ph]
        for j in range(due):
            needers[j], orders[j] = k, t[C_ORDER, k]
            k = t[C_PH_NEXT, k]
        _take_in_order(s, needers[np.argsort(orders)])  # in running order
    s.out_decode_tokens = s.num_decoding
    s.out_num_decodes = s.num_decoding
    s.ctx += s.rate_sum


@njit
def _take_in_order(s: SchedState, needers: np.ndarray) -> None:
    t, pool = s.t, s.pool
    i, n = 0, needers.shape[0]
    while i < n:
        k = needers[i]
        if not t[C_RUNNING, k]:
            break
        if pool.free >= 1:
            m = min(pool.free, n - i)
            bp.take(pool, m)
            i += m
            continue
        while pool.free < 1:
            victim = t[C_R_PREV, 0]
            preempt(s, victim)
            _out_preempt(s, victim)
            if victim == k:
                break
        if not t[C_RUNNING, k]:
            break
        while not t[C_RUNNING, needers[n - 1]]:
            n -= 1
        bp.take(pool, 1)
        i += 1


@njit
def _bulk_ok(s: SchedState, budget: int) -> bool:
    t = s.t
    need = math.ceil(s.verify_sum - 1e-9)
    k = t[C_P_NEXT, 0]
    while k != 0:
        need += t[C_NPT, k] + t[C_GENERATED, k] - t[C_COMPUTED, k]
        k = t[C_P_NEXT, k]
    return need <= budget


@njit
def _prefill_chunk(s: SchedState, k: int, take: int) -> None:
    t = s.t
    blocks, t[C_HELD_LOOKAHEAD, k] = _chunk_blocks(s, k, take)
    bp.take(s.pool, blocks)
    if s.caching:  # hash the prompt's full blocks this chunk completes
        lo, hi = t[C_NUM_HASHED_BLOCKS, k], min(t[C_PROMPT_BLOCKS, k], (t[C_COMPUTED, k] + take) // s.block_size)
        if hi > lo:
            _hold(s, k, bp.new(s.pool, t[C_PROMPT_ID, k], lo, hi))
            t[C_NUM_HASHED_BLOCKS, k] = hi
    if s.out_num_chunks == s.out_chunk.shape[0]:
        s.out_chunk, s.out_take = grow(s.out_chunk), grow(s.out_take)
    s.out_chunk[s.out_num_chunks], s.out_take[s.out_num_chunks] = k, take
    s.out_num_chunks += 1
    s.out_prefill_tokens += take
    s.ctx += take


@njit
def _admit(s: SchedState, budget: int) -> None:
    t, b = s.t, s.block_size
    while budget > 0 and s.w_len and s.num_running < s.max_num_seqs:
        k = waiting_at(s, 0)
        status, take, hit, num_hit_blocks = _admit_check(s, k, budget)
        if status:
            s.out_blocked = status == 1
            break
        s.w_head = (s.w_head + 1) % s.w_buf.shape[0]
        s.w_len -= 1
        t[C_NHASHED, k] = 0
        if hit.shape[0]:
            held = bp.acquire(s.pool, hit)
            for i in range(held.shape[0]):
                _hold(s, k, held[i])
        t[C_NUM_HASHED_BLOCKS, k] = num_hit_blocks
        t[C_COMPUTED, k] = num_hit_blocks * b
        s.ctx += t[C_COMPUTED, k]
        s.prefix_hit_tokens += t[C_COMPUTED, k]
        if t[C_PROMPT_LEN, k] and not t[C_TRANSFER, k]:  # a later turn starting
            s.turn_tokens += t[C_NPT, k] + t[C_GENERATED, k]
            s.turn_hit_tokens += t[C_COMPUTED, k]
        if t[C_TRANSFER, k]:  # its KV was moved here: all but the last token are in place
            last = t[C_NPT, k] + t[C_GENERATED, k] - 1
            bp.take(s.pool, _blocks(s, last) - _blocks(s, t[C_COMPUTED, k]))
            s.ctx += last - t[C_COMPUTED, k]
            t[C_COMPUTED, k], t[C_TRANSFER, k] = last, 0
        _r_append(s, k)
        s.order_ctr += 1
        t[C_ORDER, k] = s.order_ctr
        _prefill_chunk(s, k, take)
        budget -= take


@njit
def complete(s: SchedState) -> None:
    """vLLM's `update_from_output()`: the iteration in `out_*` ran; its finishes go to `due`."""
    t = s.t
    s.iters += 1
    release_finishing(s)
    for i in range(s.out_num_chunks):
        k, take = s.out_chunk[i], s.out_take[i]
        t[C_COMPUTED, k] += take
        if t[C_COMPUTED, k] >= t[C_NPT, k] + t[C_GENERATED, k]:
            t[C_GENERATED, k] += 1  # the iteration that ends a prefill samples a token
            _start_decoding(s, k, -1)
    finish_due(s)


@njit
def finish_due(s: SchedState) -> None:
    """Finish the decoding requests whose last token the iterations so far sampled (into `due`,
    in running order)."""
    t, heap, it = s.t, s.heap, s.iters
    s.num_due = 0
    if not s.heap_len or heap[0, 0] > it:
        return
    while s.heap_len and heap[0, 0] <= it:
        _, rid, k, _ = hp.pop(heap, s.heap_len)
        s.heap_len -= 1
        if (not t[C_RUNNING, k] or t[C_RID, k] != rid or not t[C_DECODING, k] or t[C_FINISH_ITER, k] != it
                or t[C_REPORTED, k]):  # fmt: skip
            continue  # stale entry (aborted, preempted, postponed or already reported)
        if s.num_due == s.due.shape[0]:
            s.due = grow(s.due)
        s.due[s.num_due] = k
        s.num_due += 1
    if s.num_due > 1:  # running order
        orders = np.empty(s.num_due, np.int64)
        for i in range(s.num_due):
            orders[i] = t[C_ORDER, s.due[i]]
        s.due[: s.num_due] = s.due[: s.num_due][np.argsort(orders, kind="mergesort")]
    if s.async_sched:
        for i in range(s.num_due):  # reported now, freed after the next schedule
            k = s.due[i]
            t[C_REPORTED, k] = 1
            if t[C_TARGET, k] >= t[C_MAX_TOKENS, k]:
                _stop_decoding(s, k)
            if s.num_finishing == s.finishing.shape[0]:
                s.finishing, s.finishing_rid = grow(s.finishing), grow(s.finishing_rid)
            s.finishing[s.num_finishing], s.finishing_rid[s.num_finishing] = k, t[C_RID, k]
            s.num_finishing += 1
        return
    for i in range(s.num_due):
        _free(s, s.due[i], 1)


@njit
def release_finishing(s: SchedState) -> None:
    if s.num_finishing:
        n, s.num_finishing = s.num_finishing, 0
        done, rids = s.finishing[:n].copy(), s.finishing_rid[:n].copy()
        for i in range(n):
            k = done[i]
            if s.t[C_RUNNING, k] and s.t[C_RID, k] == rids[i]:  # not preempted meanwhile
                _free(s, k, 1)


# ---- freeing: how 0 preempt, 1 finish, 2 abort ----------------------------------------------------
@njit
def _free(s: SchedState, k: int, how: int) -> int:
    """Take a running request out, free its blocks in reverse table order; return its tokens."""
    t, b, pool = s.t, s.block_size, s.pool
    if how == 1 and t[C_MORE_TURNS, k]:
        how = 3  # a turn: its next turn hits its KV while cached
    lag = s.async_sched and t[C_DECODING, k] != 0 and s.iters > t[C_START_ITER, k]
    if t[C_DECODING, k]:
        _stop_decoding(s, k)
    _r_remove(s, k)
    c = t[C_COMPUTED, k]
    s.ctx -= c
    la = t[C_HELD_LOOKAHEAD, k]
    t[C_HELD_LOOKAHEAD, k] = 0
    nh = t[C_NHASHED, k]
    hashed = s.hashed[k, :nh].copy()
    if s.caching:
        full = c // b
        if lag:
            full = (c - 1) // b
        bp.give(pool, -(-(c + la) // b) - full, False)
        if how == 0 or how == 3:  # its own full blocks stay hittable
            own = bp.new(pool, -1 - t[C_RID, k], t[C_NUM_HASHED_BLOCKS, k], full)
            if own >= 0:
                bp.release(pool, np.array([own], np.int64), False)
            bp.release(pool, hashed[::-1].copy(), False)
        else:
            bp.give(pool, full - t[C_NUM_HASHED_BLOCKS, k], True)
            n_own = 0
            for i in range(nh):
                n_own += pool.s_key[hashed[i]] < 0
            if n_own:  # blocks of its own chain (a preempted request's): dead, freed first
                own = np.empty(n_own, np.int64)
                rest = np.empty(nh - n_own, np.int64)
                a = r = 0
                for i in range(nh - 1, -1, -1):
                    if pool.s_key[hashed[i]] < 0:
                        own[a] = hashed[i]
                        a += 1
                    else:
                        rest[r] = hashed[i]
                        r += 1
                bp.release(pool, own, True)
                bp.release(pool, rest, False)
            else:
                bp.release(pool, hashed[::-1].copy(), False)
    else:
        bp.give(pool, -(-(c + la) // b), False)
    t[C_NHASHED, k] = 0
    t[C_NUM_HASHED_BLOCKS, k] = t[C_COMPUTED, k] = 0
    if how != 0:  # it left the engine
        release_slot(s, k)
    return t[C_GENERATED, k]


@njit
def preempt(s: SchedState, k: int) -> int:
    if s.t[C_REPORTED, k]:  # async: already finished; its last token ends it while it would wait
        return _free(s, k, 1)
    gen = _free(s, k, 0)
    _w_push(s, k, True)
    return gen


@njit
def abort(s: SchedState, k: int) -> int:
    return _free(s, k, 2)


@njit
def free_all(s: SchedState) -> np.ndarray:
    """Sleep: every running request's KV and the prefix cache are dropped; running requests go
    back to the front of the waiting queue in running order, keeping their tokens."""
    release_finishing(s)
    t = s.t
    carried = np.empty(s.num_running, np.int64)
    n = 0
    k = t[C_R_NEXT, 0]
    while k != 0:
        if t[C_DECODING, k]:
            _stop_decoding(s, k)
        t[C_NHASHED, k] = 0
        t[C_NUM_HASHED_BLOCKS, k] = t[C_COMPUTED, k] = t[C_HELD_LOOKAHEAD, k] = 0
        carried[n] = k
        n += 1
        nxt = t[C_R_NEXT, k]
        t[C_RUNNING, k] = 0
        k = nxt
    t[C_R_NEXT, 0] = t[C_R_PREV, 0] = t[C_P_NEXT, 0] = t[C_P_PREV, 0] = 0
    t[C_PREFILLING, :] = 0
    s.num_running = 0
    s.heap_len = 0
    s.ctx = 0.0
    bp.reset(s.pool, s.num_blocks)
    for i in range(n - 1, -1, -1):
        _w_push(s, carried[i], True)
    return carried


# ---- event jumping --------------------------------------------------------------------------------
@njit
def decode_blocks(s: SchedState, k: int) -> int:
    """Blocks the decoding requests allocate over the next k iterations."""
    b = s.block_size
    q, r = divmod(k, b)
    n = s.num_unit_rate * q
    if r:
        lo = (b - r - s.iters) % b
        hi = lo + r
        pc = s.phase_counts
        if hi <= b:
            n += pc[lo:hi].sum()
        else:
            n += pc[lo:].sum() + pc[: hi - b].sum()
    if s.num_spec:  # as computed(), for every speculating decoder
        tf = s.tf
        for i in range(s.num_spec):
            j = s.spec[i]
            rate = tf[F_RATE, j]
            c = tf[F_SPEC_COMPUTED, j] + (s.iters - tf[F_SPEC_START_ITER, j]) * rate
            n += int(math.ceil((c + k * rate) / b - 1e-9) - math.ceil(c / b - 1e-9))
    return n


@njit
def jump_plan(s: SchedState) -> int:
    """Iterations that can run as a fixed decode batch before the next event (0: run one)."""
    if not s.heap_len or s.num_decoding != s.num_running or s.num_finishing:
        return 0
    if math.ceil(s.verify_sum - 1e-9) > s.max_num_batched_tokens:
        return 0
    if s.w_len and s.num_running < s.max_num_seqs:
        budget = s.max_num_batched_tokens - math.ceil(s.verify_sum - 1e-9)
        if budget > 0 and _admit_check(s, waiting_at(s, 0), budget)[0] == 0:
            return 0
    k_finish = s.heap[0, 0] - s.iters
    if k_finish <= 0:
        return 0
    free = s.pool.free
    if decode_blocks(s, k_finish) <= free:
        return k_finish
    lo, hi = 0, k_finish
    guess = int(free * s.block_size / max(s.rate_sum, 1e-9))
    if 0 < guess < hi:
        if decode_blocks(s, guess) <= free:
            lo = guess
        else:
            hi = guess
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if decode_blocks(s, mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


@njit
def advance(s: SchedState, k: int) -> None:
    """Commit k decode iterations (`jump_plan` said they fit)."""
    bp.take(s.pool, decode_blocks(s, k))
    s.iters += k
    s.ctx += k * s.rate_sum


# ---- what a Python caller reads (`rlsim.sim.vllm_rules`): one call, not one per field --------------
@njit
def sums(s: SchedState) -> tuple:
    """(Decoding requests, KV context, their tokens and verified tokens a step, those speculating,
    running requests, waiting ones, finished ones holding their place)."""
    return (s.num_decoding, s.ctx, s.rate_sum, s.verify_sum, s.num_spec, s.num_running, s.w_len,
            s.num_finishing)  # fmt: skip


@njit
def batch(s: SchedState) -> tuple:
    """The last schedule's batch: (decode tokens, prefill tokens, decodes, whether KV blocked an
    admission, its chunks' slots and tokens, the slots it preempted)."""
    n, m = s.out_num_chunks, s.out_num_preempted
    return (s.out_decode_tokens, s.out_prefill_tokens, s.out_num_decodes, s.out_blocked, s.out_chunk[:n].copy(),
            s.out_take[:n].copy(), s.out_preempted[:m].copy())  # fmt: skip


@njit
def due_slots(s: SchedState) -> np.ndarray:
    """The slots the last `complete` or `finish_due` finished, in running order."""
    return s.due[: s.num_due].copy()


@njit
def counts(s: SchedState, slots: np.ndarray) -> np.ndarray:
    """Each slot's (generated, computed, decoding, reported), as its `Seq` holds them: a row a slot."""
    t = s.t
    out = np.empty((slots.shape[0], 4), np.int64)
    for i in range(slots.shape[0]):
        k = slots[i]
        out[i, 0], out[i, 1], out[i, 2], out[i, 3] = t[C_GENERATED, k], t[C_COMPUTED, k], t[C_DECODING, k], \
            t[C_REPORTED, k]  # fmt: skip
    return out

