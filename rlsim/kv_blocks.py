"""BlockPool: vLLM v1's KV block pool and prefix cache, counted in blocks, for one instance.

vLLM (`vllm/v1/core/block_pool.py`) keeps every free block in one LRU queue: allocation pops from
the front (evicting the prefix-cache entry of a block that had one); a freed request's blocks
that never filled (no hash) go to the front, its full (hashed) blocks to the back in reverse
order (its tail is evicted first); a prefix hit on a free cached block takes it out of the queue. Blocks whose contents can never be hit again (anonymous: never full,
or holding a finished request's output) behave alike, so they are kept as run lengths; only
blocks a later request can hit (the full blocks of a prompt, keyed `(prompt_id, index)`, and of a
preempted request, keyed `(("own", request_id), index)`) are tracked one by one. With prefix
caching off the pool is a counter.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import count


class BlockPool:
    """Free-block LRU queue and hash map of one instance's KV cache."""

    __slots__ = ("free", "caching", "_queue", "_cache", "_ref", "_key", "_ids")

    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.free = num_blocks  # blocks in the free queue (evictable cached ones included)
        self.caching = caching
        self._ids = count()
        self._queue: OrderedDict = OrderedDict()  # id -> int (anonymous run) | block id (hashed)
        self._cache: dict = {}  # key -> [block ids], oldest copy first (vLLM keeps duplicates)
        self._ref: dict[int, int] = {}  # hashed block id -> reference count
        self._key: dict[int, object] = {}  # hashed block id -> key
        if caching and num_blocks:
            self._queue[next(self._ids)] = num_blocks

    # ---- allocation ------------------------------------------------------------------------
    def take(self, n: int) -> None:
        """Allocate `n` anonymous blocks from the front of the free queue (caller checked room)."""
        self.free -= n
        if not self.caching:
            return
        q = self._queue
        while n > 0:
            qid, item = q.popitem(last=False)
            if item < 0:  # a hashed block (stored as -1 - block id): evict its cache entry
                self._evict(-1 - item)
                n -= 1
            elif item > n:
                q[qid] = item - n
                q.move_to_end(qid, last=False)
                n = 0
            else:
                n -= item

    def cache_new(self, key: object) -> int:
        """A block just allocated becomes full and hashed under `key`; return its id."""
        bid = next(self._ids)
        self._ref[bid] = 1
        self._key[bid] = key
        self._cache.setdefault(key, []).append(bid)
        return bid

    def lookup(self, keys) -> list[int]:  # noqa: ANN001 - an iterable of chain keys
        """Longest cached prefix of a chain: the oldest copy of each block, in chain order."""
        hit = []
        cache = self._cache
        for key in keys:
            copies = cache.get(key)
            if not copies:
                break
            hit.append(copies[0])
        return hit

    def evictable(self, blocks: list[int]) -> int:
        """How many of these hashed blocks sit in the free queue (touching them uses room)."""
        ref = self._ref
        return sum(1 for b in blocks if ref[b] == 0)

    def touch(self, blocks: list[int]) -> None:
        ref, q = self._ref, self._queue
        for b in blocks:
            if ref[b] == 0:
                del q[("h", b)]
                self.free -= 1
            ref[b] += 1

    # ---- freeing ---------------------------------------------------------------------------
    def give(self, n: int, cached: bool = False) -> None:
        """Free `n` blocks nothing can hit. vLLM puts blocks that never got a hash (a request's
        partial tail) at the front of the queue, to be reused first, and hashed ones at the back
        (`cached=True`: full blocks of a finished request, which no later request matches)."""
        if n <= 0:
            return
        self.free += n
        if not self.caching:
            return
        q = self._queue
        if q:
            end = next(reversed(q)) if cached else next(iter(q))
            if q[end] > 0:
                q[end] += n
                return
        qid = next(self._ids)
        q[qid] = n
        if not cached:
            q.move_to_end(qid, last=False)

    def release(self, blocks, dead: bool = False) -> None:  # noqa: ANN001 - ids, freeing order
        """Drop one reference to each hashed block; a block left unreferenced joins the free queue
        (at the back, as anonymous when `dead`: nothing can hit it again)."""
        ref = self._ref
        for b in blocks:
            ref[b] -= 1
            if ref[b] == 0:
                if dead:
                    self._evict(b)
                    self.give(1, cached=True)
                else:
                    self._queue[("h", b)] = -1 - b
                    self.free += 1

    def _evict(self, bid: int) -> None:
        key = self._key.pop(bid)
        del self._ref[bid]
        copies = self._cache[key]
        copies.remove(bid)
        if not copies:
            del self._cache[key]

    def reset(self, num_blocks: int) -> None:
        """Every block free and nothing cached (an engine that slept)."""
        self.free = num_blocks
        self._queue.clear()
        self._cache.clear()
        self._ref.clear()
        self._key.clear()
        if self.caching and num_blocks:
            self._queue[next(self._ids)] = num_blocks
