"""`rlsim.sim.sglang_scheduler.SGLangScheduler` as arrays the compiled core runs.

The same SGLang 0.5.23 rules, line for line (see that module for each rule and where it sits in
SGLang), with each `Seq` a column (slot) of one table and every container an array:

- the running batch (a dict in insertion order, a request moved to its end when its prefill ends)
  is a doubly linked list of slots through `C_R_PREV`/`C_R_NEXT`, slot 0 its sentinel;
- the waiting queue is the slots `w[w_head : w_head + w_len]`;
- the finish heap is rows (finish decode step, request id, slot) (`rlsim.sim.compiled.heap`),
  ordered as the Python heap's one-int keys are;
- the radix cache is `rlsim.sim.compiled.radix`, a request's locked node and the tokens its path
  covers are its slot's `C_NODE`, `C_COVERED`;
- the running batch's reservations (`RunningOffsets`: each member's bounds kept in its slot, set
  when it joins or its counts change) are summed over the running list in its order, one product
  after another, as SGLang sums them (the same float to the bit);
- the requests the last iteration prefilled (`_last_prefill`) are the slots stamped with the
  current `lp_stamp` (`lp_none`: it decoded); the aborting set is a flag and a count;
- an iteration's batch (`Scheduled`) lives in the state's `out_*` fields, the requests a finish
  pass reports in `due`.

The compiled engine drives it through the seam of `rlsim.sim.compiled.rules`, as it drives vLLM's.
Parallel sampling (`add_call`) sends a warm-up of the prompt alone in a slot of its own (a negative
request id) and holds the call's samples back in `hold` (each with its warm-up's id, in the order
they came) until the warm-up's result is processed. A slot is reused once its request has left
for good and no list can name it any more (`release_slot`, `_recycle`).

`tests/test_compiled_sglang.py` runs this scheduler and `SGLangScheduler` on the same random
workloads and holds every iteration's batch, retractions, finishes, radix tree and counters equal;
`tests/test_compiled_engine.py` holds the compiled engine's runs under it equal to SimEngine's.
"""

from __future__ import annotations

import numpy as np

from rlsim.sim.compiled import heap as hp
from rlsim.sim.compiled import radix as rx
from rlsim.sim.compiled.jit import PURE, Record, StructType, define, grow, grow_cols, njit

_SLOT_INTS = (
    "rid", "prompt_id", "npt", "max_tokens", "prompt_len", "target", "generated", "computed", "start_iter",
    "finish_iter", "decoding", "order", "transfer", "reported", "node", "covered", "r_prev", "r_next", "running",
    "aborting", "lp", "refused", "o_prompt_id", "o_npt", "o_max_tokens", "o_prompt_len", "off_in", "off_a", "off_b",
    "off_dec", "off_joined",
)  # fmt: skip
C_RID, C_PROMPT_ID, C_NPT, C_MAX_TOKENS, C_PROMPT_LEN, C_TARGET, C_GENERATED, C_COMPUTED = 0, 1, 2, 3, 4, 5, 6, 7
C_START_ITER, C_FINISH_ITER, C_DECODING, C_ORDER, C_TRANSFER, C_REPORTED, C_NODE, C_COVERED = (
    8, 9, 10, 11, 12, 13, 14, 15,
)
C_R_PREV, C_R_NEXT, C_RUNNING, C_ABORTING, C_LP, C_REFUSED = 16, 17, 18, 19, 20, 21
# a refused request's fields as it was sent (`own_abort` gives them back)
C_O_PROMPT_ID, C_O_NPT, C_O_MAX_TOKENS, C_O_PROMPT_LEN = 22, 23, 24, 25
# its reservation as `RunningOffsets` keeps it: whether it is a member (joined at its prefill's end,
# at iteration count `C_OFF_JOINED`), and the bounds set when it joined or its counts last changed
# (`max_tokens - output` is `max(a - decode steps, b)` while it decodes, else `b`)
C_OFF_IN, C_OFF_A, C_OFF_B, C_OFF_DEC, C_OFF_JOINED = 26, 27, 28, 29, 30

FIELDS = (
    # settings
    "num_tokens", "page", "max_running", "chunk_size", "max_prefill", "overlap", "lpm", "init_ratio", "min_ratio",
    "decay", "clip", "retract_steps", "groups",
    # the pool and radix cache, the slot table, the queues
    "cache", "t", "num_slots", "spare", "num_spare", "limbo", "num_limbo", "w", "w_head", "w_len", "num_running",
    "chunked", "fin", "fin_rid", "num_fin", "pend", "num_pend", "stash", "heap", "heap_len", "num_aborting",
    # parallel sampling: the samples held back (slot, its warm-up's request id), warm-ups not yet processed
    "hold", "hold_warm", "num_hold", "num_warm", "warm_sent",
    # the scheduler's state
    "batch_is_full", "new_token_ratio", "iters", "dsteps", "num_decoding", "ctx", "rate_sum", "verify_sum", "num_spec",
    "refresh_calls", "takes_last_batch", "lp_none", "lp_stamp", "order_ctr",
    # counters
    "prefix_hit_tokens", "turn_tokens", "turn_hit_tokens", "retractions", "warmups_run",
    # the last iteration's batch, and the finishes a pass reports
    "out_chunk", "out_take", "out_num_chunks", "out_prefill_tokens", "out_decode_tokens", "out_num_decodes",
    "out_preempted", "out_num_preempted", "due", "num_due", "error",
)  # fmt: skip
WAITING_PREFIX_REFRESH_INTERVAL = 32
WAITING_QUEUE_PREFIX_MATCH_MAX = 128
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32
REFUSED_PROMPT = -(2**62)  # the one-token prompt SGLang gives a refused request (shared by all)
_NONE = -1


class SGStateType(StructType):
    """numba's type of `SGState`."""


class SGState(Record):
    """One instance's SGLang scheduler: settings, radix cache, slot table, queues and the last batch."""

    __slots__ = FIELDS if PURE else ()


define(SGState, SGStateType, FIELDS)


@njit
def new_scheduler(num_tokens: int, max_running_requests: int, chunked_prefill_size: int,
                  enable_chunked_prefill: bool, enable_radix_cache: bool, overlap: bool, max_prefill_tokens: int,
                  lpm: bool, init_ratio: float, min_ratio: float, decay: float, clip: int, retract_steps: int,
                  page_size: int, parallel_sampling: bool = False) -> SGState:  # fmt: skip
    """`SGLangScheduler(...)`'s state (a schedule policy of `lpm` or fcfs; the settings' values given)."""
    num_tokens = num_tokens // page_size * page_size  # (SGLang's pool holds whole pages)
    cap = 16
    z = np.zeros
    t = z((len(_SLOT_INTS), cap), np.int64)
    t[C_R_PREV, 0] = t[C_R_NEXT, 0] = 0  # (slot 0: the running list's sentinel)
    chunk = chunked_prefill_size if enable_chunked_prefill else _NONE
    return SGState(
        num_tokens, page_size, max_running_requests, chunk,
        max_prefill_tokens, overlap, lpm, init_ratio, min_ratio, decay, clip, retract_steps, parallel_sampling,
        rx.new_radix(num_tokens, enable_radix_cache), t, 1, z(cap, np.int64), 0, z(cap, np.int64), 0,
        z(cap, np.int64), 0, 0, 0, _NONE, z(cap, np.int64), z(cap, np.int64), 0,
        z(cap, np.int64), 0, _NONE, z((cap, 4), np.int64), 0, 0,
        z(cap, np.int64), z(cap, np.int64), 0, 0, 0,
        False, init_ratio, 0, 0, 0, 0.0, 0.0, 0.0, 0, 0, False, False, 1, 0,
        0, 0, 0, 0, 0,
        z(cap, np.int64), z(cap, np.int64), 0, 0, 0.0, 0, z(cap, np.int64), 0, z(cap, np.int64), 0, 0,
    )  # fmt: skip


# ---- slots and queues ------------------------------------------------------------------------------
@njit
def new_slot(s: SGState, rid: int, prompt_id: int, npt: int, max_tokens: int, prompt_len: int, target: int,
             generated: int, transfer: bool) -> int:  # fmt: skip
    """A slot for a request (`Seq(req, target, generated, transfer=...)`), not yet queued: a slot
    handed back (`release_slot`) once no list can name it any more, else a new one."""
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
    t[C_RID, k], t[C_PROMPT_ID, k], t[C_NPT, k], t[C_MAX_TOKENS, k] = rid, prompt_id, npt, max_tokens
    t[C_PROMPT_LEN, k], t[C_TARGET, k], t[C_GENERATED, k], t[C_TRANSFER, k] = prompt_len, target, generated, transfer
    t[C_NODE, k] = rx.ROOT
    t[C_LP, k] = -1
    return k


@njit
def release_slot(s: SGState, k: int) -> None:
    """The request in slot k left for good (finished, aborted, or taken out of the queue): its slot
    is reused once the lists that may still name it have moved on (`_recycle`); its fields stay
    readable until a later request takes it."""
    if s.num_limbo == s.limbo.shape[0]:
        s.limbo = grow(s.limbo)
    s.limbo[s.num_limbo] = k
    s.num_limbo += 1


@njit
def _recycle(s: SGState) -> None:
    """At the end of an iteration (the overlap loop's pending inserts and held finishes processed):
    the slots released so far are free for new requests."""
    while s.num_limbo:
        s.num_limbo -= 1
        if s.num_spare == s.spare.shape[0]:
            s.spare = grow(s.spare)
        s.spare[s.num_spare] = s.limbo[s.num_limbo]
        s.num_spare += 1


@njit
def _w_append(s: SGState, k: int) -> None:
    end = s.w_head + s.w_len
    if end == s.w.shape[0]:
        if s.w_head > s.w.shape[0] // 2:  # (the front half is spent: slide the queue down)
            s.w[: s.w_len] = s.w[s.w_head : end].copy()
            s.w_head, end = 0, s.w_len
        else:
            s.w = grow(s.w)
    s.w[end] = k
    s.w_len += 1


@njit
def _w_set(s: SGState, slots: np.ndarray) -> None:
    """The waiting queue becomes these slots, in order."""
    n = slots.shape[0]
    if n > s.w.shape[0]:
        s.w = np.zeros(2 * n, np.int64)
    s.w[:n] = slots
    s.w_head, s.w_len = 0, n


@njit
def waiting(s: SGState) -> np.ndarray:
    """The waiting queue's slots, in order (a copy)."""
    return s.w[s.w_head : s.w_head + s.w_len].copy()


@njit
def _r_append(s: SGState, k: int) -> None:
    """The request joins the running batch at its end."""
    t = s.t
    last = t[C_R_PREV, 0]
    t[C_R_NEXT, last], t[C_R_PREV, k], t[C_R_NEXT, k], t[C_R_PREV, 0] = k, last, 0, k
    t[C_RUNNING, k] = 1
    s.num_running += 1


@njit
def _r_remove(s: SGState, k: int) -> None:
    t = s.t
    p, n = t[C_R_PREV, k], t[C_R_NEXT, k]
    t[C_R_NEXT, p], t[C_R_PREV, n] = n, p
    t[C_RUNNING, k] = 0
    s.num_running -= 1


@njit
def running(s: SGState) -> np.ndarray:
    """The running batch's slots, in batch order."""
    out = np.empty(s.num_running, np.int64)
    k, j = s.t[C_R_NEXT, 0], 0
    while k != 0:
        out[j] = k
        j += 1
        k = s.t[C_R_NEXT, k]
    return out


@njit
def _too_long(s: SGState, ntok: int) -> bool:
    """`validate_input_length`: an input of `max_req_len - 5` tokens or more (`max_req_len = kv - 1`)."""
    return ntok >= s.num_tokens - 1 - 5


@njit
def add(s: SGState, k: int) -> None:
    """The request in slot k arrives (`_arrive`: clipped, or refused) and joins the back of the queue."""
    _arrive(s, k)
    _w_append(s, k)


@njit
def add_call(s: SGState, slots: np.ndarray) -> None:
    """One request with `n = len(slots)` samples of one prompt (`SGLangScheduler.add_call`, sent where
    `groups`): a warm-up of the prompt alone (`max_new_tokens` 0) is queued in a slot of its own and
    the samples wait until its result is processed; one sample, or a prompt too long, is queued as is."""
    t = s.t
    k0 = slots[0]
    if slots.shape[0] == 1 or _too_long(s, t[C_NPT, k0] + t[C_GENERATED, k0]):
        for k in slots:
            add(s, k)
        return
    for k in slots:
        _arrive(s, k)
    s.warm_sent += 1
    rid = -s.warm_sent
    w = new_slot(s, rid, t[C_PROMPT_ID, k0], t[C_NPT, k0], 0, 0, 1, 0, False)
    _w_append(s, w)
    s.num_warm += 1
    for k in slots:
        if s.num_hold == s.hold.shape[0]:
            s.hold, s.hold_warm = grow(s.hold), grow(s.hold_warm)
        s.hold[s.num_hold], s.hold_warm[s.num_hold] = k, rid
        s.num_hold += 1


@njit
def _send_held(s: SGState, rid: int) -> None:
    """A warm-up's result is processed: the samples it held back join the queue, in order."""
    s.warmups_run += 1
    s.num_warm -= 1
    m = 0
    for j in range(s.num_hold):
        k = s.hold[j]
        if s.hold_warm[j] == rid:
            _w_append(s, k)
        else:
            s.hold[m], s.hold_warm[m] = k, s.hold_warm[j]
            m += 1
    s.num_hold = m


@njit
def _arrive(s: SGState, k: int) -> None:
    """SGLang's checks as a request arrives (`SGLangScheduler._arrive`): its output clipped to what
    the pool holds beside it, or a prompt too long refused."""
    t = s.t
    ntok = t[C_NPT, k] + t[C_GENERATED, k]
    if _too_long(s, ntok):
        t[C_REFUSED, k] = 1
        t[C_O_PROMPT_ID, k], t[C_O_NPT, k], t[C_O_MAX_TOKENS, k] = t[C_PROMPT_ID, k], t[C_NPT, k], t[C_MAX_TOKENS, k]
        t[C_O_PROMPT_LEN, k] = t[C_PROMPT_LEN, k]
        t[C_PROMPT_ID, k], t[C_NPT, k], t[C_MAX_TOKENS, k], t[C_PROMPT_LEN, k] = REFUSED_PROMPT, 1, 1, 0
        t[C_GENERATED, k], t[C_TARGET, k] = 0, 1
    else:
        max_req_len = s.num_tokens - 1
        p = s.page
        paged = -(-ntok // p) * p
        room = max(0, min(max_req_len - ntok - 1, s.num_tokens - paged - p - 1))
        if t[C_MAX_TOKENS, k] - t[C_GENERATED, k] > room:  # (finishes at "length" there)
            t[C_MAX_TOKENS, k] = t[C_GENERATED, k] + room
            t[C_TARGET, k] = min(t[C_TARGET, k], t[C_GENERATED, k] + room)


@njit
def own_abort(s: SGState, k: int) -> bool:
    """Whether SGLang aborted this ended request of its own accord (a prompt too long); its request's
    fields are given back as it was sent (its token counts stay)."""
    t = s.t
    if not t[C_REFUSED, k]:
        return False
    t[C_REFUSED, k] = 0
    t[C_PROMPT_ID, k], t[C_NPT, k], t[C_MAX_TOKENS, k] = t[C_O_PROMPT_ID, k], t[C_O_NPT, k], t[C_O_MAX_TOKENS, k]
    t[C_PROMPT_LEN, k] = t[C_O_PROMPT_LEN, k]
    return True


@njit
def remove_waiting(s: SGState, rids: np.ndarray) -> np.ndarray:
    """Take these requests out of the waiting queue, and out of the samples warm-ups hold back;
    return their slots, in queue order, then in the order they were held."""
    q = waiting(s)
    gone = _named(s, q, rids)
    out = q[gone]
    if gone.any():
        _w_set(s, q[~gone])
    if s.num_hold:
        held, warm = s.hold[: s.num_hold].copy(), s.hold_warm[: s.num_hold].copy()
        took = _named(s, held, rids)
        if took.any():
            out = np.concatenate((out, held[took]))
            keep = ~took
            m = int(keep.sum())
            s.hold[:m], s.hold_warm[:m] = held[keep], warm[keep]
            s.num_hold = m
    return out


@njit
def _named(s: SGState, slots: np.ndarray, rids: np.ndarray) -> np.ndarray:
    """Which of these slots hold one of these request ids."""
    hit = np.zeros(slots.shape[0], np.bool_)
    for j in range(slots.shape[0]):
        rid = s.t[C_RID, slots[j]]
        for r in rids:
            if r == rid:
                hit[j] = True
                break
    return hit


@njit
def view(s: SGState, k: int) -> tuple:
    """What a caller's record of the request in slot k mirrors: (generated and computed as of its last
    fold, decoding, reported, target, refused, prompt id, max tokens)."""
    t = s.t
    return t[C_GENERATED, k], t[C_COMPUTED, k], t[C_DECODING, k] != 0, t[C_REPORTED, k] != 0, t[C_TARGET, k], \
        t[C_REFUSED, k] != 0, t[C_PROMPT_ID, k], t[C_MAX_TOKENS, k]  # fmt: skip


# ---- token counts ------------------------------------------------------------------------------------
@njit
def generated(s: SGState, k: int) -> int:
    t = s.t
    if not t[C_DECODING, k]:
        return t[C_GENERATED, k]
    return t[C_GENERATED, k] + min(s.dsteps - t[C_START_ITER, k], t[C_TARGET, k] - t[C_GENERATED, k])


@njit
def computed(s: SGState, k: int) -> int:
    return s.t[C_COMPUTED, k] + (s.dsteps - s.t[C_START_ITER, k] if s.t[C_DECODING, k] else 0)


@njit
def _in_last_prefill(s: SGState, k: int) -> bool:
    return not s.lp_none and s.t[C_LP, k] == s.lp_stamp


@njit
def _lag(s: SGState, k: int) -> int:
    """1 where the overlap scheduler has not processed the batch in flight for this request."""
    if not s.overlap or not s.t[C_DECODING, k]:
        return 0
    return 1 if s.lp_none or s.t[C_LP, k] == s.lp_stamp else 0


@njit
def _output_len(s: SGState, k: int) -> int:
    return generated(s, k) - _lag(s, k)


@njit
def _ceil(s: SGState, tokens: int) -> int:
    p = s.page
    return tokens if p == 1 else -(-tokens // p) * p


@njit
def _floor(s: SGState, tokens: int) -> int:
    p = s.page
    return tokens if p == 1 else tokens // p * p


@njit
def _shared(s: SGState, k: int) -> int:
    """The prompt's shared tokens, whole pages."""
    pl = s.t[C_PROMPT_LEN, k]
    return _floor(s, pl if pl else s.t[C_NPT, k])


@njit
def _batch_size(s: SGState) -> int:
    return s.num_running - (s.chunked != _NONE)


# ---- one iteration -------------------------------------------------------------------------------------
@njit
def schedule(s: SGState) -> None:
    """The next iteration's batch, into the `out_*` fields."""
    s.out_num_chunks = s.out_prefill_tokens = s.out_num_decodes = s.out_num_preempted = 0
    s.out_decode_tokens = 0.0
    if s.stash != _NONE:  # `stash_chunked_request`: the last chunk enters the tree now
        k = s.stash
        s.stash = _NONE
        if s.t[C_RUNNING, k]:
            _insert_prefix(s, k)
    if s.takes_last_batch:
        s.takes_last_batch = False
        s.batch_is_full = False
    if not _batch_size(s):
        s.batch_is_full = False
    if s.chunked != _NONE or (s.w_len and not s.batch_is_full):
        _prefill(s)
    if not s.out_num_chunks:
        _decode(s)
    if s.out_num_chunks:
        s.lp_none = False
        s.lp_stamp += 1
        for j in range(s.out_num_chunks):
            s.t[C_LP, s.out_chunk[j]] = s.lp_stamp
    elif s.out_num_decodes:
        s.lp_none = True


@njit
def _offsets_total(s: SGState, ratio: float) -> float:
    """`PrefillAdder`'s offset for the running batch (`RunningOffsets.total`): each member's
    `min(max_new_tokens - output, clip) * ratio`, summed in batch order."""
    t = s.t
    total = 0.0
    lag = 0 if not s.overlap else (1 if s.lp_none else 2)  # every decoding member lags, or those joined last
    k = t[C_R_NEXT, 0]
    while k != 0:
        if t[C_OFF_IN, k]:
            x = t[C_OFF_B, k]
            if t[C_OFF_DEC, k]:
                x = max(t[C_OFF_A, k] - s.dsteps, x)
                if lag == 1 or (lag == 2 and t[C_OFF_JOINED, k] == s.iters):
                    x += 1
            total += min(x, s.clip) * ratio
        k = t[C_R_NEXT, k]
    return total


@njit
def _off_set(s: SGState, k: int) -> None:
    """`RunningOffsets.update`: a member's bounds from its counts now."""
    t = s.t
    if not t[C_OFF_IN, k]:
        return
    m = t[C_MAX_TOKENS, k]
    if t[C_DECODING, k]:
        t[C_OFF_DEC, k], t[C_OFF_B, k] = 1, m - t[C_TARGET, k]
        t[C_OFF_A, k] = m - t[C_GENERATED, k] + t[C_START_ITER, k]
    else:
        t[C_OFF_DEC, k], t[C_OFF_B, k] = 0, m - t[C_GENERATED, k]


@njit
def _out_chunk(s: SGState, k: int, take: int) -> None:
    n = s.out_num_chunks
    if n == s.out_chunk.shape[0]:
        s.out_chunk, s.out_take = grow(s.out_chunk), grow(s.out_take)
    s.out_chunk[n], s.out_take[n] = k, take
    s.out_num_chunks = n + 1


@njit
def _prefill(s: SGState) -> None:
    t, cache = s.t, s.cache
    size = _batch_size(s)
    allocatable = s.max_running - size
    if allocatable <= 0 and s.chunked == _NONE:
        s.batch_is_full = True
        return
    _calc_priority(s)
    ratio = s.new_token_ratio
    # the running batch's reservations, summed when first needed: a head that does not fit even with
    # none (they are never negative without warm-ups) is refused without the sum
    lazy = s.chunked == _NONE and not s.num_warm
    clip, page = s.clip, s.page
    total = 0.0 if lazy else _offsets_total(s, ratio)
    current = 0.0
    rem_input, rem_chunk = s.max_prefill, s.chunk_size
    chunking = rem_chunk != _NONE
    num_admitted = 0
    if s.chunked != _NONE:  # the chunked request continues first
        k = s.chunked
        cand = t[C_NPT, k] + t[C_GENERATED, k] - t[C_COMPUTED, k]
        room = min(rem_chunk, int(cache.free + cache.evictable - total)) if chunking else cand
        take = min(cand, room if room > 0 else rem_chunk)
        done = take >= cand
        res = min(t[C_MAX_TOKENS, k], clip) if done else 0
        paged = _ceil(s, take)
        total += paged + page + res
        current += paged + page
        rem_input -= paged
        if chunking:
            rem_chunk -= paged
        _out_chunk(s, k, take)
        num_admitted += 1
        if done:
            s.chunked = _NONE
    while s.w_len:  # (in queue order, stopping at the first refusal: the admitted are its head)
        k = s.w[s.w_head]
        if rem_input <= 0 or (chunking and rem_chunk <= 0):
            room_all = cache.free + cache.evictable
            if not (room_all - total <= 0 or room_all - current <= 0):
                break  # `budget_state() == OTHER`: the continuing chunk spent the pass
        if num_admitted >= allocatable:
            s.batch_is_full = True
            break
        rid = t[C_RID, k]
        ntok = t[C_NPT, k] + t[C_GENERATED, k]
        node, hit = rx.match(cache, t[C_PROMPT_ID, k], _shared(s, k), rid, _floor(s, ntok - 1), True)
        max_new = min(max(t[C_MAX_TOKENS, k] - t[C_GENERATED, k], 0), clip)
        extend = 1 if t[C_TRANSFER, k] else ntok - hit
        if lazy:
            lazy = False
            if extend + max_new + page < cache.free + cache.evictable:
                total = _offsets_total(s, ratio)
        if not extend + max_new + page < cache.free + cache.evictable - total:  # (a page of overhead)
            rx.unlock(cache, node)
            s.batch_is_full = num_admitted > 0 or size > 0  # NO_TOKEN
            break
        if not chunking and num_admitted and _ceil(s, extend) >= rem_input:
            rx.unlock(cache, node)
            break
        res = min(t[C_MAX_TOKENS, k], clip)
        cut = chunking and _ceil(s, extend) > rem_chunk
        if cut:  # cut at a page boundary (its matched prefix is whole pages)
            extend, res = _floor(s, rem_chunk), 0
            if extend <= 0:
                rx.unlock(cache, node)
                break
        paged = _ceil(s, extend)
        total += paged + page + res
        current += paged + page
        rem_input -= paged
        if chunking:
            rem_chunk -= paged
        s.w_head += 1
        s.w_len -= 1
        _admit(s, k, node, hit)
        _out_chunk(s, k, extend)
        num_admitted += 1
        if cut:
            s.chunked = k
        room_all = cache.free + cache.evictable
        if room_all - total <= 0 or room_all - current <= 0:  # the verdict `add_one_req` returns
            s.batch_is_full = True
            break
        if rem_input <= 0 or (chunking and rem_chunk <= 0):
            break
    s.takes_last_batch = False
    if not size:
        for j in range(s.out_num_chunks):
            if s.out_chunk[j] != s.chunked:
                s.takes_last_batch = True
                break
    n = s.out_num_chunks
    if page > 1 and n:  # `alloc_paged_token_slots_extend` first evicts for a new page a request
        need = 0
        for j in range(n):
            need += s.out_take[j]
        rx.evict_to_free(cache, need + n * page)  # (over-estimated)
    for j in range(n):  # `prepare_for_extend`: their slots (whole pages), evicting as needed
        k, take = s.out_chunk[j], s.out_take[j]
        c = t[C_COMPUTED, k]
        rx.alloc(cache, _ceil(s, c + take) - _ceil(s, c))
        s.out_prefill_tokens += take
        s.ctx += take


@njit
def _calc_priority(s: SGState) -> None:
    """`SchedulePolicy.calc_priority`: `lpm` over a queue of at most 128 sorts it by the longest
    cached prefix, else the order stays and the waiting prefixes are refreshed."""
    if s.lpm and s.cache.enabled and s.w_len <= WAITING_QUEUE_PREFIX_MATCH_MAX:
        _sort_by_longest_prefix(s)
    else:
        _touch_waiting_prefixes(s)


@njit
def _sort_by_longest_prefix(s: SGState) -> None:
    t = s.t
    q = waiting(s)
    keys = np.empty(q.shape[0])
    seen = np.empty(q.shape[0], np.int64)  # prompts of the requests checked in so far
    num_seen = 0
    for j in range(q.shape[0]):
        k = q[j]
        ntok = t[C_NPT, k] + t[C_GENERATED, k]
        shared = _shared(s, k)
        _, hit = rx.match(s.cache, t[C_PROMPT_ID, k], shared, t[C_RID, k], _floor(s, ntok), False)
        key = -float(min(hit, ntok - 1))
        if hit <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
            pid = t[C_PROMPT_ID, k]
            found = False
            for i in range(num_seen):
                if seen[i] == pid:
                    found = True
                    break
            if found and shared >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                key = np.inf  # deprioritized (its own tokens shared with no one)
            elif not found:
                seen[num_seen] = pid
                num_seen += 1
        keys[j] = key
    _w_set(s, q[np.argsort(keys, kind="mergesort")])


@njit
def _touch_waiting_prefixes(s: SGState) -> None:
    if not s.w_len or not s.cache.enabled:
        return
    refresh = s.refresh_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0
    s.refresh_calls += 1
    if not refresh:
        return
    t = s.t
    for j in range(min(s.w_len, WAITING_QUEUE_PREFIX_MATCH_MAX) - 1, -1, -1):
        k = s.w[s.w_head + j]
        rx.match(s.cache, t[C_PROMPT_ID, k], _shared(s, k), t[C_RID, k], _floor(s, t[C_NPT, k] + t[C_GENERATED, k]),
                 False)  # fmt: skip


@njit
def _admit(s: SGState, k: int, node: int, hit: int) -> None:
    """A waiting request joins, holding its matched prefix (locked)."""
    t = s.t
    t[C_NODE, k], t[C_COVERED, k] = node, hit
    t[C_COMPUTED, k] = hit
    t[C_ORDER, k] = s.order_ctr
    s.order_ctr += 1
    _r_append(s, k)
    # `count_hits`
    s.ctx += hit
    s.prefix_hit_tokens += hit
    if t[C_PROMPT_LEN, k] and not t[C_TRANSFER, k]:
        s.turn_tokens += t[C_NPT, k] + t[C_GENERATED, k]
        s.turn_hit_tokens += hit
    if t[C_TRANSFER, k]:  # its KV was moved here: all but the last token are in place
        last = t[C_NPT, k] + t[C_GENERATED, k] - 1
        rx.alloc(s.cache, _ceil(s, last) - _ceil(s, t[C_COMPUTED, k]))
        s.ctx += last - t[C_COMPUTED, k]
        t[C_COMPUTED, k], t[C_TRANSFER, k] = last, 0


@njit
def _decoding(s: SGState) -> np.ndarray:
    """The decoding requests' slots, in batch order."""
    out = np.empty(s.num_decoding, np.int64)
    k, j = s.t[C_R_NEXT, 0], 0
    while k != 0:
        if s.t[C_DECODING, k]:
            out[j] = k
            j += 1
        k = s.t[C_R_NEXT, k]
    return out[:j]


@njit
def _new_pages(s: SGState, batch: np.ndarray) -> int:
    """`new_tokens_required_next_decode`: a page for each request whose next token starts one."""
    p = s.page
    if p == 1:
        return batch.shape[0]
    n = 0
    for k in batch:
        if computed(s, k) % p == 0:
            n += 1
    return p * n


@njit
def _decode(s: SGState) -> None:
    """`update_running_batch`: one token for every decoding request, retracting on shortage."""
    n = s.num_decoding
    if not n:
        s.batch_is_full = False
        return
    holding = n < _batch_size(s)  # overlap: finished at max tokens, slots still held
    need = n if s.page == 1 else _new_pages(s, _decoding(s))
    if not rx.evict_to_free(s.cache, need):
        if holding:
            s.batch_is_full = False
            return
        if not _retract(s, _decoding(s)):
            return
        n = s.num_decoding
        need = n if s.page == 1 else _new_pages(s, _decoding(s))
    else:
        s.new_token_ratio = max(s.new_token_ratio - s.decay, s.min_ratio)
    if s.page > 1:
        rx.evict_to_free(s.cache, n * s.page)
    rx.alloc(s.cache, need)
    s.out_decode_tokens = float(n)
    s.out_num_decodes = n
    s.ctx += n


@njit
def _retract(s: SGState, batch: np.ndarray) -> bool:
    """Retract requests until the rest fit; False (with `error` set) where even one cannot decode."""
    t = s.t
    m = batch.shape[0]
    key = np.empty(m, np.int64)
    for j in range(m):  # sorted by (output, -prompt) descending, stable: the last one goes first
        key[j] = -(_output_len(s, batch[j]) * (2**32) - t[C_NPT, batch[j]])
    keep = batch[np.argsort(key, kind="mergesort")]
    n = m
    first = True
    while first or not rx.evict_to_free(s.cache, _new_pages(s, keep[:n])):
        if n == 1:
            break
        first = False
        n -= 1
        k = keep[n]
        lag, aborting = _lag(s, k), t[C_ABORTING, k] != 0
        _release(s, k, False)
        if t[C_REPORTED, k]:  # (ended in flight: no longer freed after this schedule)
            _fin_remove(s, k)
        t[C_GENERATED, k] -= lag  # the batch in flight's token is dropped with it
        rx.evict_to_free(s.cache, n * s.retract_steps)
        if not aborting:
            _w_append(s, k)
        else:  # (gone for good: the engine reported it when it aborted it)
            release_slot(s, k)
        if s.out_num_preempted == s.out_preempted.shape[0]:
            s.out_preempted = grow(s.out_preempted)
        s.out_preempted[s.out_num_preempted] = k
        s.out_num_preempted += 1
        s.retractions += 1
    if not rx.evict_to_free(s.cache, _new_pages(s, keep[:n])):
        s.error = computed(s, keep[0])  # a request that cannot decode in the whole pool: its KV tokens
        return False
    out_sum, max_sum = 0, 0
    for j in range(n):
        out_sum += _output_len(s, keep[j])
        max_sum += t[C_MAX_TOKENS, keep[j]]
    s.new_token_ratio = min(1.0, (out_sum + s.retract_steps * n) / (max_sum + 1))
    s.batch_is_full = False
    return True


@njit
def _fin_remove(s: SGState, k: int) -> None:
    """`finishing.remove(seq)`: its first place in the list, if any (a place is a slot and the
    request id it held then, so a reused slot is not its old request)."""
    rid = s.t[C_RID, k]
    for j in range(s.num_fin):
        if s.fin[j] == k and s.fin_rid[j] == rid:
            s.fin[j : s.num_fin - 1] = s.fin[j + 1 : s.num_fin].copy()
            s.fin_rid[j : s.num_fin - 1] = s.fin_rid[j + 1 : s.num_fin].copy()
            s.num_fin -= 1
            return


@njit
def _fin_append(s: SGState, k: int) -> None:
    if s.num_fin == s.fin.shape[0]:
        s.fin, s.fin_rid = grow(s.fin), grow(s.fin_rid)
    s.fin[s.num_fin], s.fin_rid[s.num_fin] = k, s.t[C_RID, k]
    s.num_fin += 1


@njit
def complete(s: SGState) -> None:
    """The iteration the `out_*` fields hold ran: apply its tokens; the requests it finished into `due`."""
    t = s.t
    s.iters += 1
    if s.out_num_decodes:
        s.dsteps += 1
    if s.num_fin:
        release_finishing(s)
    if s.num_pend:
        pend = s.pend[: s.num_pend].copy()
        s.num_pend = 0
        for k in pend:  # overlap: the last batch's prefills, processed after this one launched
            if t[C_RUNNING, k]:
                _insert_prefix(s, k)
    for j in range(s.out_num_chunks):
        k, take = s.out_chunk[j], s.out_take[j]
        t[C_COMPUTED, k] += take
        if t[C_COMPUTED, k] >= t[C_NPT, k] + t[C_GENERATED, k]:
            t[C_GENERATED, k] += 1  # the prefill samples the first token
            _start_decoding(s, k)
            _r_remove(s, k)  # it joins the running batch at its end, in the prefill batch's order
            _r_append(s, k)
            t[C_ORDER, k] = s.order_ctr
            s.order_ctr += 1
            t[C_OFF_IN, k], t[C_OFF_JOINED, k] = 1, s.iters  # `RunningOffsets.join`
            _off_set(s, k)
            if s.overlap:  # its result, and the tree insert with it, come after the next schedule
                if s.num_pend == s.pend.shape[0]:
                    s.pend = grow(s.pend)
                s.pend[s.num_pend] = k
                s.num_pend += 1
                continue
        if k == s.chunked:  # a chunk is stashed into the tree when the next batch is scheduled
            s.stash = k
        else:
            _insert_prefix(s, k)
    finish_due(s)
    _recycle(s)


@njit
def _insert_prefix(s: SGState, k: int) -> None:
    """`cache_unfinished_req`: the request's prefilled tokens enter the tree, its lock moves to their node."""
    t, cache = s.t, s.cache
    node, covered = t[C_NODE, k], t[C_COVERED, k]
    c = _floor(s, t[C_COMPUTED, k])
    new_node, dup = rx.insert(cache, node, covered, t[C_PROMPT_ID, k], _shared(s, k), t[C_RID, k], c, True)
    cache.free += dup
    rx.unlock(cache, node)
    t[C_NODE, k], t[C_COVERED, k] = new_node, c if cache.enabled else 0


@njit
def finish_due(s: SGState) -> None:
    """The requests whose last token the decode steps so far sampled, into `due` (those to report)."""
    t = s.t
    s.num_due = 0
    now = s.dsteps
    if not s.heap_len or s.heap[0, 0] > now:
        return
    ended = np.empty(8, np.int64)
    ne = 0
    last_f = last_rid = _NONE
    while s.heap_len and s.heap[0, 0] <= now:
        f, rid, k, _ = hp.pop(s.heap, s.heap_len)
        s.heap_len -= 1
        if f == last_f and rid == last_rid:  # the same finish pushed twice: ended once
            continue
        last_f, last_rid = f, rid
        if not t[C_RUNNING, k] or t[C_RID, k] != rid or not t[C_DECODING, k] or t[C_FINISH_ITER, k] != now:
            continue
        if ne == ended.shape[0]:
            ended = grow(ended)
        if t[C_ABORTING, k]:
            ended[ne] = k
        elif not t[C_REPORTED, k]:
            if rid >= 0:  # (a warm-up's finish goes to the tokenizer manager, not the engine's caller)
                _due(s, k)
            ended[ne] = k
        else:  # overlap: reported, then retracted while its last step was in flight, re-prefilled and ended again
            ended[ne] = k
        ne += 1
    ended = ended[:ne]
    if ne > 1:
        orders = np.empty(ne, np.int64)
        for j in range(ne):
            orders[j] = t[C_ORDER, ended[j]]
        ended = ended[np.argsort(orders, kind="mergesort")]
    if not s.overlap:
        for k in ended:  # freed in batch order as their results are processed
            _release(s, k, True)
            release_slot(s, k)
        return
    for k in ended:  # reported now, their slots freed after the next schedule
        t[C_REPORTED, k] = 1
        if t[C_TARGET, k] >= t[C_MAX_TOKENS, k] and not t[C_ABORTING, k]:
            _stop_decoding(s, k)  # known finished: left out of the next batch
        _fin_append(s, k)


@njit
def _due(s: SGState, k: int) -> None:
    if s.num_due == s.due.shape[0]:
        s.due = grow(s.due)
    s.due[s.num_due] = k
    s.num_due += 1


@njit
def release_finishing(s: SGState) -> None:
    if s.num_fin:
        n, s.num_fin = s.num_fin, 0
        done, rids = s.fin[:n].copy(), s.fin_rid[:n].copy()
        for j in range(n):
            k = done[j]
            if s.t[C_RUNNING, k] and s.t[C_RID, k] == rids[j]:
                _release(s, k, True)
                release_slot(s, k)


# ---- decoding and freeing --------------------------------------------------------------------------
@njit
def _start_decoding(s: SGState, k: int) -> None:
    t = s.t
    t[C_DECODING, k] = 1
    t[C_START_ITER, k] = s.dsteps
    t[C_FINISH_ITER, k] = s.dsteps + t[C_TARGET, k] - t[C_GENERATED, k]
    s.num_decoding += 1
    s.rate_sum += 1.0
    s.verify_sum += 1.0
    s.heap = hp.push(s.heap, s.heap_len, t[C_FINISH_ITER, k], t[C_RID, k], k, 0)
    s.heap_len += 1
    _off_set(s, k)


@njit
def _stop_decoding(s: SGState, k: int, leaving: bool = False) -> None:
    """Fold the decode steps it ran into its counts (`leaving`: its reservation is dropped next, not updated)."""
    t = s.t
    ran = s.dsteps - t[C_START_ITER, k]
    t[C_GENERATED, k] += min(ran, t[C_TARGET, k] - t[C_GENERATED, k])
    t[C_COMPUTED, k] += ran
    t[C_DECODING, k] = 0
    s.num_decoding -= 1
    s.rate_sum -= 1.0
    s.verify_sum -= 1.0
    if not leaving:
        _off_set(s, k)


@njit
def _release(s: SGState, k: int, insert: bool) -> int:
    """Take a running request out: with `insert` its sequence enters the tree, else its uncached
    tokens are freed outright."""
    t, cache = s.t, s.cache
    if t[C_DECODING, k]:
        _stop_decoding(s, k, True)
    _r_remove(s, k)
    t[C_OFF_IN, k] = 0
    if t[C_ABORTING, k]:
        t[C_ABORTING, k] = 0
        s.num_aborting -= 1
    if k == s.chunked:
        s.chunked = _NONE
    node, covered = t[C_NODE, k], t[C_COVERED, k]
    t[C_NODE, k], t[C_COVERED, k] = rx.ROOT, 0
    c = t[C_COMPUTED, k]
    s.ctx -= c
    if insert and cache.enabled:  # its whole pages enter the tree, its partial last page is freed
        end = _floor(s, c)
        _, dup = rx.insert(cache, node, covered, t[C_PROMPT_ID, k], _shared(s, k), t[C_RID, k], end, False)
        cache.free += dup + _ceil(s, c) - end
    else:
        cache.free += _ceil(s, c) - covered
    rx.unlock(cache, node)
    s.batch_is_full = False
    t[C_COMPUTED, k] = 0
    if insert and t[C_RID, k] < 0:  # a warm-up's result is processed: its samples are sent
        _send_held(s, t[C_RID, k])
    return t[C_GENERATED, k]


@njit
def abort(s: SGState, k: int) -> int:
    """`abort_request` (`SGLangScheduler.abort`); returns the tokens it had."""
    t = s.t
    gen = generated(s, k)
    if not t[C_DECODING, k]:  # in chunked prefill: freed at once, the last chunk's slots freed
        if s.stash == k:
            s.stash = _NONE
        _release(s, k, False)
        release_slot(s, k)
        return gen
    if s.overlap and _lag(s, k):  # its result in flight finishes it
        t[C_REPORTED, k] = 1
        _fin_append(s, k)
        return gen
    _stop_decoding(s, k)  # its next decode step's result finishes it
    t[C_TARGET, k] = t[C_GENERATED, k] + 1
    t[C_REPORTED, k] = 1
    if not t[C_ABORTING, k]:
        t[C_ABORTING, k] = 1
        s.num_aborting += 1
    _start_decoding(s, k)
    return gen


@njit
def on_idle(s: SGState) -> None:
    """`Scheduler.on_idle`: a fully idle engine's new-token ratio goes back to its initial value."""
    if not (s.num_running or s.w_len or s.num_fin) and s.chunked == _NONE:
        s.new_token_ratio = s.init_ratio


@njit
def free_all(s: SGState) -> np.ndarray:
    """Sleep (the radix cache flushed): running requests wait again, first, with their tokens;
    returns their slots."""
    t = s.t
    release_finishing(s)
    run = running(s)
    for k in run:
        if t[C_DECODING, k]:
            _stop_decoding(s, k)
    keep = np.zeros(run.shape[0], np.bool_)
    for j in range(run.shape[0]):
        k = run[j]
        keep[j] = not t[C_ABORTING, k]
        t[C_ABORTING, k] = 0
        t[C_RUNNING, k] = t[C_OFF_IN, k] = 0
        t[C_NODE, k], t[C_COVERED, k] = rx.ROOT, 0
    carried = run[keep]
    for k in carried:
        t[C_COMPUTED, k] = 0
    for k in run[~keep]:  # (aborted, gone for good)
        release_slot(s, k)
    s.num_aborting = 0
    t[C_R_PREV, 0] = t[C_R_NEXT, 0] = 0
    s.num_running = 0
    s.num_pend = 0
    s.stash = _NONE
    s.heap_len = 0
    s.chunked = _NONE
    s.ctx = 0.0
    rx.reset(s.cache)
    s.batch_is_full = False
    _w_set(s, np.concatenate((carried, waiting(s))))
    return carried


# ---- event jumping ---------------------------------------------------------------------------------
@njit
def jump_plan(s: SGState) -> int:
    """Decode steps the fixed batch runs before its next finish or slot shortage (0: run one)."""
    if not s.heap_len or s.chunked != _NONE or s.num_fin or s.stash != _NONE:
        return 0
    if s.takes_last_batch:
        return 0
    if s.w_len and not s.batch_is_full:
        return 0
    n = s.num_decoding
    if n != s.num_running:
        return 0
    k_finish = s.heap[0, 0] - s.dsteps
    if s.page > 1:
        return max(0, _paged_steps(s, k_finish))
    k_kv = (s.cache.free + s.cache.evictable) // n
    if s.num_pend:  # no eviction before the tree inserts its first step processes
        k_kv = min(k_kv, s.cache.free // n)
    return max(0, min(k_finish, k_kv))


@njit
def _page_starts(s: SGState) -> np.ndarray:
    """Each decoding request's steps until its next token starts a page (0: the next one does)."""
    batch = _decoding(s)
    out = np.empty(batch.shape[0], np.int64)
    for j in range(batch.shape[0]):
        out[j] = (-computed(s, batch[j])) % s.page
    return out


@njit
def _pages_in(s: SGState, starts: np.ndarray, k: int) -> int:
    """Slots the decoding requests take over their next k steps: a page each time a token starts one."""
    n = 0
    for x in starts:
        n += max(0, (k - x - 1) // s.page + 1)
    return s.page * n


@njit
def _paged_steps(s: SGState, k_finish: int) -> int:
    starts = _page_starts(s)
    room = s.cache.free if s.num_pend else s.cache.free + s.cache.evictable
    lo, hi = 0, k_finish
    while lo < hi:  # the most steps whose pages fit
        mid = (lo + hi + 1) // 2
        if _pages_in(s, starts, mid) <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


@njit
def advance(s: SGState, k: int) -> None:
    """Commit k decode steps of the fixed batch (`jump_plan` said they fit)."""
    n = s.num_decoding
    if s.page == 1:
        rx.alloc(s.cache, k * n)
    else:  # each step first evicts for a new page a request: all k steps' evictions, then their pages
        starts = _page_starts(s)
        rx.evict_to_free(s.cache, n * s.page + _pages_in(s, starts, k - 1))
        rx.alloc(s.cache, _pages_in(s, starts, k))
    if s.num_pend:
        pend = s.pend[: s.num_pend].copy()
        s.num_pend = 0
        for j in pend:  # overlap: the last prefills' inserts, processed at the first step's end
            if s.t[C_RUNNING, j]:
                _insert_prefix(s, j)
    s.iters += k
    s.dsteps += k
    s.ctx += k * n
    s.lp_none = True
    r, decay, floor = s.new_token_ratio, s.decay, s.min_ratio
    for _ in range(k):
        r = max(r - decay, floor)
        if r == floor:
            break
    s.new_token_ratio = r
    _recycle(s)
