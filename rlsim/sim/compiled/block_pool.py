"""The KV block pool and prefix cache of `rlsim.sim.kv_blocks`, as arrays the compiled core runs.

The same rules as `BlockPool` (vLLM's free-block LRU queue: allocation from the front, blocks
that never filled freed to the front, hashed ones to the back, highest position first; a prefix
hit takes a free cached block out of the queue; duplicates of a hash kept, the oldest served
first), with every object turned into a row of a table:

- the free queue is a doubly linked list of nodes (row 0 its sentinel), each an anonymous run of
  `size` blocks (`slab` -1) or one slab;
- a slab (positions [lo, hi) of one hash chain, allocated together) is a row of the slab table:
  its key, positions, reference count, queue node (-1 when not free) and, once split, its up to
  three parts; a hash chain's slabs, oldest first, are a linked list through `cprev`/`cnext`
  whose ends `head`/`tail` map from the key;
- keys are ints: a prompt's chain is its `prompt_id` (>= 0), a request's own chain (the full
  blocks of a preempted request) is `own_key(request_id)` (< 0).

Prefix pieces are rows (slab, lo, hi) of an int array. Tables double when full, inside compiled
code. `tests/test_compiled_block_pool.py` drives this pool and `BlockPool` through the same
random operations and holds their queues, caches and answers equal, compiled and pure.
"""

from __future__ import annotations

import numpy as np

from rlsim.sim.compiled.jit import PURE, Record, StructType, define, grow, int_dict, njit

FIELDS = (
    "free", "caching",
    "q_prev", "q_next", "q_size", "q_slab", "q_spare", "num_spare", "num_nodes",
    "s_key", "s_lo", "s_hi", "s_ref", "s_qid", "s_parts", "s_cprev", "s_cnext", "num_slabs",
    "s_spare", "num_s_spare", "head", "tail",
)  # fmt: skip


class PoolStateType(StructType):
    """numba's type of `PoolState`."""


class PoolState(Record):
    """One instance's pool: the free count, the free queue's nodes and the slab table."""

    __slots__ = FIELDS if PURE else ()


define(PoolState, PoolStateType, FIELDS)

_NONE = -1


def own_key(request_id: int) -> int:
    """The key of a request's own hash chain (a preempted request's full blocks)."""
    return -1 - request_id


@njit
def new_pool(num_blocks: int, enable_caching: bool, capacity: int = 64) -> PoolState:
    """Every block free, nothing cached."""
    z = np.zeros
    p = PoolState(
        num_blocks, enable_caching,
        z(capacity, np.int64), z(capacity, np.int64), z(capacity, np.int64), z(capacity, np.int64),
        z(capacity, np.int64), 0, 1,
        z(capacity, np.int64), z(capacity, np.int64), z(capacity, np.int64), z(capacity, np.int64),
        z(capacity, np.int64), np.full((capacity, 3), _NONE, np.int64), z(capacity, np.int64),
        z(capacity, np.int64), 0, z(capacity, np.int64), 0, int_dict(), int_dict(),
    )  # fmt: skip
    reset(p, num_blocks)
    return p


# ---- the free queue: a circular doubly linked list through row 0 ------------------------------
@njit
def _node(p: PoolState, size: int, slab: int) -> int:
    """A queue node (reused if one is spare), not yet linked."""
    if p.num_spare > 0:
        p.num_spare -= 1
        n = p.q_spare[p.num_spare]
    else:
        n = p.num_nodes
        if n == p.q_prev.shape[0]:
            p.q_prev, p.q_next, p.q_size, p.q_slab = grow(p.q_prev), grow(p.q_next), grow(p.q_size), grow(p.q_slab)
            p.q_spare = grow(p.q_spare)
        p.num_nodes += 1
    p.q_size[n], p.q_slab[n] = size, slab
    return n


@njit
def _link(p: PoolState, n: int, after: int) -> None:
    nxt = p.q_next[after]
    p.q_prev[n], p.q_next[n] = after, nxt
    p.q_next[after] = n
    p.q_prev[nxt] = n


@njit
def _unlink(p: PoolState, n: int) -> None:
    """Take node n out of the queue and keep it spare."""
    a, b = p.q_prev[n], p.q_next[n]
    p.q_next[a], p.q_prev[b] = b, a
    p.q_spare[p.num_spare] = n
    p.num_spare += 1


# ---- slabs and their hash chains ---------------------------------------------------------------
@njit
def _slab(p: PoolState, key: int, lo: int, hi: int, ref: int) -> int:
    """A slab row: one an evicted slab left (`_drop`), or a new one."""
    if p.num_s_spare:
        p.num_s_spare -= 1
        s = p.s_spare[p.num_s_spare]
    else:
        s = p.num_slabs
        if s == p.s_key.shape[0]:
            p.s_key, p.s_lo, p.s_hi, p.s_ref = grow(p.s_key), grow(p.s_lo), grow(p.s_hi), grow(p.s_ref)
            p.s_qid, p.s_cprev, p.s_cnext = grow(p.s_qid), grow(p.s_cprev), grow(p.s_cnext)
            p.s_spare = grow(p.s_spare)
            parts = np.full((2 * s, 3), _NONE, np.int64)
            parts[:s] = p.s_parts
            p.s_parts = parts
        p.num_slabs += 1
    p.s_parts[s, 0] = p.s_parts[s, 1] = p.s_parts[s, 2] = _NONE
    p.s_key[s], p.s_lo[s], p.s_hi[s], p.s_ref[s] = key, lo, hi, ref
    p.s_qid[s] = p.s_cprev[s] = p.s_cnext[s] = _NONE
    return s


@njit
def _drop(p: PoolState, s: int) -> None:
    """Take slab s out of its chain (it is evicted, or freed as dead) and keep its row for a new
    slab: no one holds it (its count is zero), and a slab split earlier, whose parts it may be,
    is held by no one either once a part of it is (its holders hold every part)."""
    p.s_spare[p.num_s_spare] = s
    p.num_s_spare += 1
    a, b, key = p.s_cprev[s], p.s_cnext[s], p.s_key[s]
    if a == _NONE and b == _NONE:
        del p.head[key]
        del p.tail[key]
        return
    if a == _NONE:
        p.head[key] = b
    else:
        p.s_cnext[a] = b
    if b == _NONE:
        p.tail[key] = a
    else:
        p.s_cprev[b] = a


@njit
def new(p: PoolState, key: int, lo: int, hi: int) -> int:
    """Blocks just allocated for positions [lo, hi) of chain `key` are full: cache them (-1 if
    there are none)."""
    if hi <= lo:
        return _NONE
    s = _slab(p, key, lo, hi, 1)
    if key in p.tail:
        t = p.tail[key]
        p.s_cnext[t], p.s_cprev[s] = s, t
    else:
        p.head[key] = s
    p.tail[key] = s
    return s


# ---- allocation -----------------------------------------------------------------------------------
@njit
def take(p: PoolState, n: int) -> None:
    """Allocate `n` blocks from the front of the free queue (the caller checked room), evicting
    the cached blocks among them."""
    p.free -= n
    if not p.caching or n <= 0:
        return
    while n > 0:
        q = p.q_next[0]
        s = p.q_slab[q]
        if s == _NONE:
            size = p.q_size[q]
            if size > n:
                p.q_size[q] = size - n
                return
            n -= size
            _unlink(p, q)
        else:
            size = p.s_hi[s] - p.s_lo[s]
            if size > n:
                p.s_hi[s] -= n
                return
            n -= size
            _unlink(p, q)
            p.s_qid[s] = _NONE
            _drop(p, s)


@njit
def lookup(p: PoolState, prompt_id: int, prompt_blocks: int, request_id: int, limit: int) -> np.ndarray:
    """Longest cached prefix (at most `limit` blocks) of a request's hash chain, its prompt's full
    blocks then its own, as rows (slab, lo, hi): for each position the oldest copy."""
    pieces = np.empty((4, 3), np.int64)
    k = 0
    pos = 0
    for c in range(2):
        key = prompt_id if c == 0 else -1 - request_id
        end = min(prompt_blocks, limit) if c == 0 else limit
        first = p.head[key] if key in p.head else _NONE
        while pos < end:
            if first == _NONE:
                return pieces[:k]
            s = first
            while s != _NONE and not (p.s_lo[s] <= pos < p.s_hi[s]):
                s = p.s_cnext[s]
            if s == _NONE:
                return pieces[:k]
            stop = min(p.s_hi[s], end)
            t = first
            while t != s:  # an older copy starting inside serves the positions after it
                if pos < p.s_lo[t] < stop:
                    stop = p.s_lo[t]
                t = p.s_cnext[t]
            if k == pieces.shape[0]:
                pieces = grow(pieces)
            pieces[k, 0], pieces[k, 1], pieces[k, 2] = s, pos, stop
            k += 1
            pos = stop
    return pieces[:k]


@njit
def evictable(p: PoolState, pieces: np.ndarray) -> int:
    """Blocks of these pieces that sit in the free queue (taking them uses free room)."""
    n = 0
    for i in range(pieces.shape[0]):
        if p.s_ref[pieces[i, 0]] == 0:
            n += pieces[i, 2] - pieces[i, 1]
    return n


@njit
def acquire(p: PoolState, pieces: np.ndarray) -> np.ndarray:
    """Take a reference to each piece (splitting slabs at its ends); return the slabs held."""
    held = np.empty(pieces.shape[0], np.int64)
    split = np.empty(pieces.shape[0], np.int64)  # free slabs split here: no one refers to them after
    num_split = 0
    for i in range(pieces.shape[0]):
        s, a, b = pieces[i, 0], pieces[i, 1], pieces[i, 2]
        while p.s_parts[s, 0] != _NONE:  # split by an earlier piece: the part holding a
            j = 0
            while not (p.s_lo[p.s_parts[s, j]] <= a < p.s_hi[p.s_parts[s, j]]):
                j += 1
            s = p.s_parts[s, j]
        if p.s_ref[s] == 0:
            p.free -= b - a
        if p.s_lo[s] < a or b < p.s_hi[s]:
            if p.s_ref[s] == 0:
                split[num_split] = s
                num_split += 1
            s = _carve(p, s, a, b)
        elif p.s_qid[s] != _NONE:
            _unlink(p, p.s_qid[s])
            p.s_qid[s] = _NONE
        p.s_ref[s] += 1
        held[i] = s
    for i in range(num_split):  # (a later piece may have reached its part through it)
        p.s_spare[p.num_s_spare] = split[i]
        p.num_s_spare += 1
    return held


@njit
def _carve(p: PoolState, s: int, a: int, b: int) -> int:
    """Split s so that positions [a, b) form their own slab, out of the free queue (the caller
    takes it); the other parts keep s's place in its chain and in the queue, if it had one."""
    key, ref = p.s_key[s], p.s_ref[s]
    bounds = ((p.s_lo[s], a), (a, b), (b, p.s_hi[s]))
    np_ = 0
    mid = _NONE
    prev = p.s_cprev[s]
    for lo, hi in bounds:
        if hi > lo:
            t = _slab(p, key, lo, hi, ref)
            p.s_parts[s, np_] = t
            np_ += 1
            if lo == a:
                mid = t
            p.s_cprev[t] = prev  # the same age as the slab they came from
            if prev == _NONE:
                p.head[key] = t
            else:
                p.s_cnext[prev] = t
            prev = t
    nxt = p.s_cnext[s]
    p.s_cnext[prev] = nxt
    if nxt == _NONE:
        p.tail[key] = prev
    else:
        p.s_cprev[nxt] = prev
    q = p.s_qid[s]
    if q != _NONE:  # in the free queue: the parts but the middle keep its place, highest first
        after = p.q_prev[q]
        _unlink(p, q)
        for j in range(np_ - 1, -1, -1):
            t = p.s_parts[s, j]
            if t != mid:
                n = _node(p, 0, t)
                _link(p, n, after)
                p.s_qid[t] = n
                after = n
    return mid


# ---- freeing ----------------------------------------------------------------------------------------
@njit
def give(p: PoolState, n: int, cached: bool) -> None:
    """Free `n` blocks nothing can hit: to the front of the queue (a partial tail, reused
    first) or, `cached`, to the back (the full blocks of a finished request)."""
    if n <= 0:
        return
    p.free += n
    if not p.caching:
        return
    end = p.q_prev[0] if cached else p.q_next[0]
    if end != 0 and p.q_slab[end] == _NONE:
        p.q_size[end] += n
        return
    _link(p, _node(p, n, _NONE), p.q_prev[0] if cached else 0)


@njit
def release(p: PoolState, slabs: np.ndarray, dead: bool) -> None:
    """Drop one reference to each slab, in order; a slab left unreferenced joins the back of the
    free queue (as anonymous blocks when `dead`: nothing can hit it again)."""
    stack = np.empty(max(8, 3 * slabs.shape[0]), np.int64)
    top = 0
    for i in range(slabs.shape[0] - 1, -1, -1):
        stack[top] = slabs[i]
        top += 1
    while top > 0:
        top -= 1
        s = stack[top]
        if p.s_parts[s, 0] != _NONE:  # its parts, highest first
            if top + 3 > stack.shape[0]:
                stack = grow(stack)
            for j in range(3):
                if p.s_parts[s, j] != _NONE:
                    stack[top] = p.s_parts[s, j]
                    top += 1
            continue
        p.s_ref[s] -= 1
        if p.s_ref[s] == 0:
            size = p.s_hi[s] - p.s_lo[s]
            if dead:
                _drop(p, s)
                give(p, size, True)
            else:
                n = _node(p, 0, s)
                _link(p, n, p.q_prev[0])
                p.s_qid[s] = n
                p.free += size


@njit
def reset(p: PoolState, num_blocks: int) -> None:
    """Every block free and nothing cached (an engine that slept)."""
    p.free = num_blocks
    while p.q_next[0] != 0:
        _unlink(p, p.q_next[0])
    p.q_next[0] = p.q_prev[0] = 0
    p.head.clear()
    p.tail.clear()
    p.num_slabs = p.num_s_spare = 0  # no one holds a slab any more: every row is free
    if p.caching and num_blocks:
        _link(p, _node(p, num_blocks, _NONE), 0)
