"""RadixCache: SGLang's token pool and radix prefix cache, counted in tokens (with pages of more
than one token, `SGLangScheduler` hands it whole pages only: positions, boundaries and lengths).

A port of `sglang.srt.mem_cache.radix_cache.RadixCache` (sglang 0.5.23) for what a trace knows of
its tokens: a request's sequence is its prompt's shared tokens (keyed by `prompt_id`, the first
`prompt_len or num_prompt_tokens` positions) and then its own (keyed by its request id: a later
turn's context, its output). A node holds positions `[lo, hi)` of one key and the KV slots of
those tokens; nodes are split where a match ends, as SGLang splits them, and never span the
shared/own boundary (SGLang's can, when a request inserts prompt and output in one piece and no
other request shares the prompt: only which leaf eviction frees first differs).

- `match` walks a request's sequence from the root (at most all its tokens but the last, as
  `Req.init_next_round_input` asks) and touches the nodes it passes (`last_access`);
- `lock`/`unlock` count the requests a node's path serves (`inc_lock_ref`, `dec_lock_ref`): an
  unlocked node is evictable;
- `insert` adds a request's computed tokens past what the tree holds; the tokens the tree already
  held are duplicates its slots give back (`cache_unfinished_req`, `cache_finished_req`);
- `evict(n)` frees the least recently used unlocked leaves, whole, until `n` tokens are freed
  (`RadixCache.evict`: a parent left childless and unlocked becomes a leaf in turn);
- `free` is the allocator's free slots; `available()` plus `evictable` is what admission counts.
"""

from __future__ import annotations

import heapq
from itertools import count


class Node:
    __slots__ = ("key", "lo", "hi", "parent", "children", "lock", "last_access", "alive")

    def __init__(self, key: object, lo: int, hi: int, parent: Node | None) -> None:
        self.key, self.lo, self.hi, self.parent = key, lo, hi, parent
        self.children: dict[tuple, Node] = {}  # (key, lo) of the child's first token -> child
        self.lock = 0
        self.last_access = 0
        self.alive = True

    @property
    def size(self) -> int:
        return self.hi - self.lo


class RadixCache:
    """One instance's KV token slots and the radix tree that caches them."""

    def __init__(self, num_tokens: int, enabled: bool = True) -> None:
        self.num_tokens = num_tokens
        self.enabled = enabled
        self._nodes: list[Node] = []  # every node made since the last reset (`drop_tree`)
        self.reset()

    def reset(self) -> None:
        """Every slot free, the tree empty (a flush, or sleep)."""
        self.drop_tree()
        self.free = self.num_tokens
        self.root = Node(None, 0, 0, None)
        self.root.lock = 1  # never evicted
        self.evictable = 0  # tokens in unlocked nodes
        self._clock = count(1)
        self._seq = count()

    def drop_tree(self) -> None:
        """Unlink the tree's nodes from their parents, so reference counting frees the tree as soon
        as it is dropped: parent and child links make every tree a cycle, which only a garbage
        collection would free, at a pause that grows with every node the run made (seconds over a
        long run). Every node made since the last reset is listed (`_nodes`, evicted ones too until
        then) for this."""
        for node in self._nodes:
            node.parent = None
        self._nodes = []
        self._leaves: list = []  # (last_access, seq, node): candidates, checked when popped

    # ---- a request's path --------------------------------------------------------------------
    def match(self, prompt_id: int, shared: int, rid: int, limit: int, lock: bool = False) -> tuple[Node, int]:
        """(Deepest node of the longest cached prefix of at most `limit` tokens, its length); with
        `lock`, that node is locked too (`lock`: see there why none of its path is queued)."""
        node, pos = self.root, 0
        if not self.enabled:
            return node, 0
        clock = self._clock
        while pos < limit:
            if pos < shared:  # the prompt's shared tokens, then its own: a node never spans the boundary
                key, end = prompt_id, min(limit, shared)
            else:
                key, end = ("own", rid), limit
            child = node.children.get((key, pos))
            if child is None:
                break
            if child.hi > end:
                child = self._split(child, end)
            node, pos = child, child.hi
            node.last_access = next(clock)
            if not lock and not node.children and not node.lock:  # (it may be a leaf now: a candidate)
                heapq.heappush(self._leaves, (node.last_access, next(self._seq), node))
        if lock:
            self.lock(node)
        return node, pos

    def _split(self, child: Node, at: int) -> Node:
        """Cut `child` at position `at`; return the new upper part [lo, at) (its old tail below it)."""
        top = Node(child.key, child.lo, at, child.parent)
        self._nodes.append(top)
        top.lock, top.last_access = child.lock, child.last_access
        del child.parent.children[(child.key, child.lo)]
        child.parent.children[(top.key, top.lo)] = top
        child.lo, child.parent = at, top
        top.children[(child.key, child.lo)] = child
        return top

    def insert(
        self, node: Node, pos: int, prompt_id: int, shared: int, rid: int, end: int, lock: bool = False
    ) -> tuple[Node, int]:
        """Cache positions [pos, end) below `node` (the request's path so far); return (its new
        deepest node, tokens the tree already held, whose slots the request gives back); with
        `lock`, the new deepest node is locked too (`lock`: see there why none of its path is queued)."""
        dup = 0
        if not self.enabled:
            return node, 0
        clock, leaves, seq = self._clock, self._leaves, self._seq
        while pos < end:
            if pos < shared:  # (the shared tokens' key, then the request's own)
                key, stop = prompt_id, min(end, shared)
            else:
                key, stop = ("own", rid), end
            children = node.children
            child = children.get((key, pos))
            if child is None:
                child = Node(key, pos, stop, node)
                self._nodes.append(child)
                children[(key, pos)] = child
                at = child.last_access = next(clock)
                self.evictable += stop - pos  # unlocked until the caller locks it
                if not lock:
                    heapq.heappush(leaves, (at, next(seq), child))  # a new node is an unlocked leaf
                node, pos = child, stop
                continue
            if child.hi > stop:
                child = self._split(child, stop)
            dup += child.hi - child.lo
            at = child.last_access = next(clock)
            if not lock and not child.children and not child.lock:  # (it may be a leaf now: a candidate)
                heapq.heappush(leaves, (at, next(seq), child))
            node, pos = child, child.hi
        if lock:
            self.lock(node)
        return node, dup

    # ---- locks and eviction ------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """Lock `node`'s path. A locked node is no eviction candidate, and every node becomes one
        again only through `unlock` or `evict`, which queue it then: so a path locked as soon as it
        is matched or inserted (`lock=True` there) needs none of its nodes queued meanwhile. (The
        queue is ordered by last access, which no two live candidates share, so entries left out
        change no eviction.)"""
        root = self.root
        while node is not root:
            if not node.lock:
                self.evictable -= node.hi - node.lo
            node.lock += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        root = self.root
        while node is not root:
            node.lock -= 1
            if not node.lock:
                self.evictable += node.hi - node.lo
                if not node.children:  # (it may be a leaf now: an eviction candidate)
                    heapq.heappush(self._leaves, (node.last_access, next(self._seq), node))
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free least recently used unlocked leaves until `num_tokens` are freed; return the freed."""
        freed, leaves, pop, root = 0, self._leaves, heapq.heappop, self.root
        while freed < num_tokens and leaves:
            at, _, node = pop(leaves)
            if not node.alive or node.children or node.lock or at != node.last_access:
                continue  # stale: evicted, grown, locked or touched since it was pushed
            node.alive = False
            size = node.hi - node.lo
            freed += size
            self.evictable -= size
            self.free += size
            parent = node.parent
            del parent.children[(node.key, node.lo)]
            if not parent.children and not parent.lock and parent is not root:  # (a leaf now: a candidate)
                heapq.heappush(leaves, (parent.last_access, next(self._seq), parent))
        return freed

    def evict_to_free(self, num_tokens: int) -> bool:
        """The allocator's `evict_to_free_tokens`: evict so `num_tokens` slots are free, if it can."""
        if self.free < num_tokens:
            self.evict(num_tokens - self.free)
        return self.free >= num_tokens

    def alloc(self, n: int) -> None:
        """Take n slots (the caller checked they fit after eviction), evicting as needed."""
        if self.free < n:
            self.evict(n - self.free)
        self.free -= n
