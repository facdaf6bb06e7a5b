"""SGLang's token pool and radix prefix cache of `rlsim.sim.radix_cache`, as arrays the compiled core runs.

The same rules as `RadixCache` (a port of sglang 0.5.23's `RadixCache`, counted in tokens), with
every object turned into a row of a table:

- a node is a column of the node table `nd`: its key (`N_KIND` 0, the prompt's shared tokens keyed
  by `prompt_id`; 1, a request's own tokens keyed by its request id), its positions `[lo, hi)`,
  its parent, lock count, last access, whether it is alive, and how many children it has;
  node 0 is the root, locked once so never evicted. Nodes are not reused until `reset`, as
  `RadixCache` keeps every node it made until then: a stale eviction candidate can then never
  name a later node;
- a node's children are the entries `(parent, kind, key, lo) -> child` of one mapping;
- the eviction candidates are rows `(last access, push number, node)` of a heap
  (`rlsim.sim.compiled.heap`), checked when popped, as `RadixCache._leaves` is.

`tests/test_compiled_radix.py` drives this cache and `RadixCache` through the same random
operations (matches, inserts, locks, evictions, allocations, resets; pages of one token and of
more) and holds their trees, counts and answers equal, compiled and pure.
"""

from __future__ import annotations

import numpy as np

from rlsim.sim.compiled import heap as hp
from rlsim.sim.compiled.jit import PURE, Record, StructType, define, njit, quad_dict

FIELDS = ("num_tokens", "enabled", "free", "evictable", "clock", "pushes", "nd", "num_nodes", "children",
          "leaves", "num_leaves")  # fmt: skip
# rows of the node table `nd`
N_KIND, N_KEY, N_LO, N_HI, N_PARENT, N_LOCK, N_ACCESS, N_ALIVE, N_CHILDREN = 0, 1, 2, 3, 4, 5, 6, 7, 8
_ROWS = 9
ROOT = 0
SHARED, OWN = 0, 1  # a node's key kind: the prompt's shared tokens, a request's own


class RadixStateType(StructType):
    """numba's type of `RadixState`."""


class RadixState(Record):
    """One instance's KV token slots and the radix tree that caches them."""

    __slots__ = FIELDS if PURE else ()


define(RadixState, RadixStateType, FIELDS)


@njit
def new_radix(num_tokens: int, enabled: bool) -> RadixState:
    """Every slot free, the tree empty."""
    r = RadixState(num_tokens, enabled, 0, 0, 0, 0, np.zeros((_ROWS, 64), np.int64), 0, quad_dict(),
                   np.zeros((64, 3), np.int64), 0)  # fmt: skip
    reset(r)
    return r


@njit
def reset(r: RadixState) -> None:
    """Every slot free, the tree empty (a flush, or sleep)."""
    r.free = r.num_tokens
    r.evictable = 0
    r.clock = 0  # (the next access is 1, as `itertools.count(1)` gives)
    r.pushes = 0
    r.children = quad_dict()
    r.num_leaves = 0
    r.num_nodes = 0
    root = _new_node(r, -1, 0, 0, 0, -1)
    r.nd[N_LOCK, root] = 1  # never evicted


@njit
def _new_node(r: RadixState, kind: int, key: int, lo: int, hi: int, parent: int) -> int:
    k = r.num_nodes
    if k == r.nd.shape[1]:
        nd = np.zeros((_ROWS, 2 * k), np.int64)
        nd[:, :k] = r.nd
        r.nd = nd
    r.num_nodes = k + 1
    nd = r.nd
    nd[N_KIND, k], nd[N_KEY, k], nd[N_LO, k], nd[N_HI, k], nd[N_PARENT, k] = kind, key, lo, hi, parent
    nd[N_LOCK, k], nd[N_ACCESS, k], nd[N_ALIVE, k], nd[N_CHILDREN, k] = 0, 0, 1, 0
    return k


@njit
def _tick(r: RadixState) -> int:
    r.clock += 1
    return r.clock


@njit
def _push_leaf(r: RadixState, node: int) -> None:
    """Queue `node` as an eviction candidate at its last access."""
    r.leaves = hp.push(r.leaves, r.num_leaves, r.nd[N_ACCESS, node], r.pushes, node, 0)
    r.num_leaves += 1
    r.pushes += 1


# ---- a request's path --------------------------------------------------------------------------------
@njit
def match(r: RadixState, prompt_id: int, shared: int, rid: int, limit: int, lock: bool) -> tuple[int, int]:
    """(Deepest node of the longest cached prefix of at most `limit` tokens, its length); with
    `lock`, that node is locked too."""
    node, pos = ROOT, 0
    if not r.enabled:
        return node, 0
    nd = r.nd
    while pos < limit:
        if pos < shared:  # the prompt's shared tokens, then its own: a node never spans the boundary
            kind, key, end = SHARED, prompt_id, min(limit, shared)
        else:
            kind, key, end = OWN, rid, limit
        at = (node, kind, key, pos)
        if at not in r.children:
            break
        child = r.children[at]
        if nd[N_HI, child] > end:
            child = _split(r, child, end)
            nd = r.nd
        node, pos = child, nd[N_HI, child]
        nd[N_ACCESS, node] = _tick(r)
        if not lock and not nd[N_CHILDREN, node] and not nd[N_LOCK, node]:  # (it may be a leaf now: a candidate)
            _push_leaf(r, node)
    if lock:
        lock_path(r, node)
    return node, pos


@njit
def _split(r: RadixState, child: int, at: int) -> int:
    """Cut `child` at position `at`; return the new upper part [lo, at) (its old tail below it)."""
    nd = r.nd
    kind, key, lo, parent = nd[N_KIND, child], nd[N_KEY, child], nd[N_LO, child], nd[N_PARENT, child]
    top = _new_node(r, kind, key, lo, at, parent)
    nd = r.nd
    nd[N_LOCK, top], nd[N_ACCESS, top] = nd[N_LOCK, child], nd[N_ACCESS, child]
    r.children[(parent, kind, key, lo)] = top  # (in the child's place)
    nd[N_LO, child], nd[N_PARENT, child] = at, top
    r.children[(top, kind, key, at)] = child
    nd[N_CHILDREN, top] = 1
    return top


@njit
def insert(r: RadixState, node: int, pos: int, prompt_id: int, shared: int, rid: int, end: int,
           lock: bool) -> tuple[int, int]:  # fmt: skip
    """Cache positions [pos, end) below `node` (the request's path so far); return (its new deepest
    node, tokens the tree already held, whose slots the request gives back); with `lock`, the new
    deepest node is locked too."""
    dup = 0
    if not r.enabled:
        return node, 0
    while pos < end:
        if pos < shared:  # (the shared tokens' key, then the request's own)
            kind, key, stop = SHARED, prompt_id, min(end, shared)
        else:
            kind, key, stop = OWN, rid, end
        at = (node, kind, key, pos)
        if at not in r.children:
            child = _new_node(r, kind, key, pos, stop, node)
            r.children[at] = child
            r.nd[N_CHILDREN, node] += 1
            r.nd[N_ACCESS, child] = _tick(r)
            r.evictable += stop - pos  # unlocked until the caller locks it
            if not lock:
                _push_leaf(r, child)  # a new node is an unlocked leaf
            node, pos = child, stop
            continue
        child = r.children[at]
        if r.nd[N_HI, child] > stop:
            child = _split(r, child, stop)
        nd = r.nd
        dup += nd[N_HI, child] - nd[N_LO, child]
        nd[N_ACCESS, child] = _tick(r)
        if not lock and not nd[N_CHILDREN, child] and not nd[N_LOCK, child]:  # (it may be a leaf now)
            _push_leaf(r, child)
        node, pos = child, nd[N_HI, child]
    if lock:
        lock_path(r, node)
    return node, dup


# ---- locks and eviction ------------------------------------------------------------------------------
@njit
def lock_path(r: RadixState, node: int) -> None:
    """Lock `node`'s path (`RadixCache.lock`: a path locked as soon as it is matched or inserted
    needs none of its nodes queued meanwhile)."""
    nd = r.nd
    while node != ROOT:
        if not nd[N_LOCK, node]:
            r.evictable -= nd[N_HI, node] - nd[N_LO, node]
        nd[N_LOCK, node] += 1
        node = nd[N_PARENT, node]


@njit
def unlock(r: RadixState, node: int) -> None:
    nd = r.nd
    while node != ROOT:
        nd[N_LOCK, node] -= 1
        if not nd[N_LOCK, node]:
            r.evictable += nd[N_HI, node] - nd[N_LO, node]
            if not nd[N_CHILDREN, node]:  # (it may be a leaf now: an eviction candidate)
                _push_leaf(r, node)
        node = nd[N_PARENT, node]


@njit
def evict(r: RadixState, num_tokens: int) -> int:
    """Free least recently used unlocked leaves until `num_tokens` are freed; return the freed."""
    freed = 0
    nd = r.nd
    while freed < num_tokens and r.num_leaves:
        at, _, node, _ = hp.pop(r.leaves, r.num_leaves)
        r.num_leaves -= 1
        if not nd[N_ALIVE, node] or nd[N_CHILDREN, node] or nd[N_LOCK, node] or at != nd[N_ACCESS, node]:
            continue  # stale: evicted, grown, locked or touched since it was pushed
        nd[N_ALIVE, node] = 0
        size = nd[N_HI, node] - nd[N_LO, node]
        freed += size
        r.evictable -= size
        r.free += size
        parent = nd[N_PARENT, node]
        del r.children[(parent, nd[N_KIND, node], nd[N_KEY, node], nd[N_LO, node])]
        nd[N_CHILDREN, parent] -= 1
        if not nd[N_CHILDREN, parent] and not nd[N_LOCK, parent] and parent != ROOT:  # (a leaf now: a candidate)
            _push_leaf(r, parent)
    return freed


@njit
def evict_to_free(r: RadixState, num_tokens: int) -> bool:
    """The allocator's `evict_to_free_tokens`: evict so `num_tokens` slots are free, if it can."""
    if r.free < num_tokens:
        evict(r, num_tokens - r.free)
    return r.free >= num_tokens


@njit
def alloc(r: RadixState, n: int) -> None:
    """Take n slots (the caller checked they fit after eviction), evicting as needed."""
    if r.free < n:
        evict(r, n - r.free)
    r.free -= n
