"""BlockPool: vLLM v1's KV block pool and prefix cache, counted in blocks, for one instance.

vLLM (`vllm/v1/core/block_pool.py`) keeps every free block in one LRU queue: allocation pops
from the front (evicting the prefix-cache entry of a block that had one); a freed request's
blocks that never filled (no hash) go to the front, its full (hashed) blocks to the back in
reverse order (its tail is evicted first); a prefix hit on a free cached block takes it out of
the queue, and duplicates of a hash are kept, the oldest served first.

Blocks whose contents can never be hit again (never full, or holding a finished request's
output) behave alike, so the queue keeps them as run lengths. Blocks a later request can hit (the
full blocks of a prompt, keyed by its `prompt_id`, and of a preempted request, keyed
`("own", request_id)`) are kept as slabs: consecutive positions of one hash chain allocated
together, sharing one reference count, split only when a request takes part of one. A slab in
the free queue lists its positions highest first, as vLLM's reverse-order free does, so eviction
shrinks it from the top. With prefix caching off the pool is a counter.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import count


class Slab:
    """Positions [lo, hi) of one hash chain, allocated together (one copy of each block)."""

    __slots__ = ("key", "lo", "hi", "ref", "qid", "parts")

    def __init__(self, key: object, lo: int, hi: int, ref: int) -> None:
        self.key, self.lo, self.hi, self.ref, self.qid = key, lo, hi, ref, None
        self.parts: list[Slab] | None = None  # once split: its pieces, which its holders hold


class BlockPool:
    """Free-block LRU queue and hash map of one instance's KV cache."""

    __slots__ = ("free", "enable_caching", "_queue", "_cache", "_ids")

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self.free = num_blocks  # blocks in the free queue (evictable cached ones included)
        self.enable_caching = enable_caching
        self._ids = count()
        self._queue: OrderedDict = OrderedDict()  # id -> int (anonymous run) | Slab
        self._cache: dict = {}  # key -> [Slab], oldest first
        if enable_caching and num_blocks:
            self._queue[next(self._ids)] = num_blocks

    # ---- allocation ------------------------------------------------------------------------
    def take(self, n: int) -> None:
        """Allocate `n` blocks from the front of the free queue (the caller checked room),
        evicting the cached blocks among them."""
        self.free -= n
        if not self.enable_caching or n <= 0:
            return
        q = self._queue
        qid = next(iter(q))
        item = q[qid]
        if type(item) is int and item > n:  # the common case: part of the front run, in place
            q[qid] = item - n
            return
        while n > 0:
            qid, item = q.popitem(last=False)
            if type(item) is int:
                if item > n:
                    q[qid] = item - n
                    q.move_to_end(qid, last=False)
                    return
                n -= item
            else:
                size = item.hi - item.lo
                if size > n:
                    item.hi -= n
                    q[qid] = item
                    q.move_to_end(qid, last=False)
                    return
                n -= size
                item.qid = None
                self._drop(item)

    def new(self, key: object, lo: int, hi: int) -> Slab | None:
        """Blocks just allocated for positions [lo, hi) of chain `key` are full: cache them."""
        if hi <= lo:
            return None
        slab = Slab(key, lo, hi, 1)
        self._cache.setdefault(key, []).append(slab)
        return slab

    def lookup(self, prompt_id: int, prompt_blocks: int, request_id: int, limit: int) -> list[tuple]:
        """Longest cached prefix (at most `limit` blocks) of a request's hash chain, its prompt's
        full blocks then its own, as (slab, lo, hi) pieces: for each position the oldest copy."""
        pieces: list[tuple] = []
        pos = 0
        for key, end in ((prompt_id, min(prompt_blocks, limit)), (("own", request_id), limit)):
            slabs = self._cache.get(key)
            while pos < end:
                if not slabs:
                    return pieces
                s = None
                for t in slabs:
                    if t.lo <= pos < t.hi:
                        s = t
                        break
                if s is None:
                    return pieces
                stop = min(s.hi, end)
                for t in slabs:  # an older copy starting inside serves the positions after it
                    if t is s:
                        break
                    if pos < t.lo < stop:
                        stop = t.lo
                pieces.append((s, pos, stop))
                pos = stop
        return pieces

    @staticmethod
    def evictable(pieces: list[tuple]) -> int:
        """Blocks of these pieces that sit in the free queue (taking them uses free room)."""
        return sum(b - a for s, a, b in pieces if s.ref == 0)

    def acquire(self, pieces: list[tuple]) -> list[Slab]:
        """Take a reference to each piece (splitting slabs at its ends); return the slabs held."""
        held = []
        for s, a, b in pieces:
            while s.parts is not None:  # split by an earlier piece: the part holding a
                s = next(p for p in s.parts if p.lo <= a < p.hi)
            if s.ref == 0:
                self.free -= b - a
            if s.lo < a or b < s.hi:
                s = self._carve(s, a, b)
            elif s.qid is not None:
                del self._queue[s.qid]
                s.qid = None
            s.ref += 1
            held.append(s)
        return held

    def _carve(self, s: Slab, a: int, b: int) -> Slab:
        """Split `s` so that positions [a, b) form their own slab, out of the free queue (the
        caller takes it); the other parts keep `s`'s place in the queue, if it had one."""
        parts = [Slab(s.key, lo, hi, s.ref) for lo, hi in ((s.lo, a), (a, b), (b, s.hi)) if hi > lo]
        copies = self._cache[s.key]
        i = copies.index(s)
        copies[i : i + 1] = parts  # the same age as the slab they came from
        s.parts = parts  # whoever held `s` holds every part
        mid = next(p for p in parts if p.lo == a)
        if s.qid is not None:  # in the free queue: the parts keep its place, highest first
            rest = [p for p in reversed(parts) if p is not mid]
            q = self._queue
            if len(rest) == 1:
                rest[0].qid = s.qid
                q[s.qid] = rest[0]
            else:  # both ends stay free: rebuild the queue around them (rare)
                items = []
                for qid, item in q.items():
                    if item is s:
                        for p in rest:
                            p.qid = next(self._ids)
                            items.append((p.qid, p))
                    else:
                        items.append((qid, item))
                q.clear()
                q.update(items)
        return mid

    # ---- freeing ---------------------------------------------------------------------------
    def give(self, n: int, cached: bool = False) -> None:
        """Free `n` blocks nothing can hit. vLLM puts blocks that never got a hash (a request's
        partial tail) at the front of the queue, to be reused first, and hashed ones at the back
        (`cached=True`: full blocks of a finished request, which no later request matches)."""
        if n <= 0:
            return
        self.free += n
        if not self.enable_caching:
            return
        q = self._queue
        if q:
            end = next(reversed(q)) if cached else next(iter(q))
            if type(q[end]) is int:
                q[end] += n
                return
        qid = next(self._ids)
        q[qid] = n
        if not cached:
            q.move_to_end(qid, last=False)

    def release(self, slabs, dead: bool = False) -> None:  # noqa: ANN001 - slabs, freeing order
        """Drop one reference to each slab; a slab left unreferenced joins the back of the free
        queue (as anonymous blocks when `dead`: nothing can hit it again)."""
        for s in slabs:
            if s.parts is not None:
                self.release(reversed(s.parts), dead)
                continue
            s.ref -= 1
            if s.ref == 0:
                if dead:
                    self._drop(s)
                    self.give(s.hi - s.lo, cached=True)
                else:
                    s.qid = next(self._ids)
                    self._queue[s.qid] = s
                    self.free += s.hi - s.lo

    def _drop(self, s: Slab) -> None:
        copies = self._cache[s.key]
        copies.remove(s)
        if not copies:
            del self._cache[s.key]

    def reset(self, num_blocks: int) -> None:
        """Every block free and nothing cached (an engine that slept)."""
        self.free = num_blocks
        self._queue.clear()
        self._cache.clear()
        if self.enable_caching and num_blocks:
            self._queue[next(self._ids)] = num_blocks
