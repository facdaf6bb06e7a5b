"""The compiled block pool (`rlsim.sim.compiled.block_pool`) keeps the same free queue, prefix
cache and answers as `rlsim.sim.kv_blocks.BlockPool` under the scheduler's calls, compiled and
on the pure-Python path."""

from __future__ import annotations

import numpy as np
import pytest

from rlsim.sim.compiled import block_pool as cbp
from rlsim.sim.compiled.jit import PURE
from rlsim.sim.kv_blocks import BlockPool, Slab
from tests.pure_path import run_pure


def _key(key: object) -> int:
    return cbp.own_key(key[1]) if type(key) is tuple else key


def _state_py(pool: BlockPool) -> tuple:
    queue = [item if type(item) is int else (_key(item.key), item.lo, item.hi) for item in pool._queue.values()]
    cache = {_key(k): [(s.lo, s.hi, s.ref) for s in v] for k, v in pool._cache.items()}
    return pool.free, queue, cache


def _state_c(p: cbp.PoolState) -> tuple:
    queue, n = [], p.q_next[0]
    while n != 0:
        s = p.q_slab[n]
        queue.append(int(p.q_size[n]) if s < 0 else (int(p.s_key[s]), int(p.s_lo[s]), int(p.s_hi[s])))
        n = p.q_next[n]
    cache = {}
    for key in p.head:
        chain, s = [], p.head[key]
        while s >= 0:
            chain.append((int(p.s_lo[s]), int(p.s_hi[s]), int(p.s_ref[s])))
            s = p.s_cnext[s]
        cache[int(key)] = chain
    return int(p.free), queue, cache


class _Twin:
    """One pool of each kind driven by the scheduler's calls: admissions that hit, allocate and
    hash their prompt's full blocks, and frees as a finish, an abort or a preemption does."""

    def __init__(self, num_blocks: int, block_size: int, rng: np.random.Generator) -> None:
        self.py, self.c = BlockPool(num_blocks, True), cbp.new_pool(num_blocks, True, capacity=4)
        self.num_blocks, self.b, self.rng = num_blocks, block_size, rng
        self.held: dict[int, tuple[list, list, int, int, int]] = {}  # rid -> py slabs, c slabs, computed, hashed
        self.next_rid = 0
        paths = ("admit", "hit", "split", "split_free", "split_free_both_ends", "evict", "preempt", "finish", "dead")
        self.ops = dict.fromkeys((*paths, "reset"), 0)

    def check(self) -> None:
        assert _state_c(self.c) == _state_py(self.py)

    def admit(self, prompt_id: int, prompt_tokens: int, rid: int | None = None) -> None:
        b = self.b
        rid = self.next_rid if rid is None else rid
        self.next_rid = max(self.next_rid, rid + 1)
        total = prompt_tokens + int(self.rng.integers(0, 3 * b))
        prompt_blocks, limit = prompt_tokens // b, (total - 1) // b
        hit = self.py.lookup(prompt_id, prompt_blocks, rid, limit)
        pieces = cbp.lookup(self.c, prompt_id, prompt_blocks, rid, limit)
        assert [(_key(s.key), lo, hi) for s, lo, hi in hit] == [
            (int(self.c.s_key[s]), int(lo), int(hi)) for s, lo, hi in pieces
        ]
        num_hit = sum(hi - lo for _, lo, hi in hit)
        evict = self.py.evictable(hit)
        assert cbp.evictable(self.c, pieces) == evict
        need = -(-total // b) - num_hit + evict
        if need > self.py.free:
            return
        self.ops["admit"] += 1
        self.ops["hit"] += bool(hit)
        for s, lo, hi in hit:
            while s.parts is not None:
                s = next(part for part in s.parts if part.lo <= lo < part.hi)
            if lo > s.lo or hi < s.hi:
                self.ops["split"] += 1
                self.ops["split_free"] += s.ref == 0
                self.ops["split_free_both_ends"] += s.ref == 0 and lo > s.lo and hi < s.hi
        before = len(self.py._cache)
        held_py, held_c = self.py.acquire(hit), list(cbp.acquire(self.c, pieces))
        rest = -(-total // b) - num_hit
        self.py.take(rest)
        cbp.take(self.c, rest)
        self.ops["evict"] += len(self.py._cache) < before
        hi = min(prompt_blocks, total // b)
        s_py, s_c = self.py.new(prompt_id, num_hit, hi), cbp.new(self.c, prompt_id, num_hit, hi)
        if s_py is not None:
            held_py.append(s_py)
            held_c.append(s_c)
        else:
            assert s_c == -1
        self.held[rid] = (held_py, held_c, total, max(num_hit, hi), prompt_id)

    def free(self, rid: int, how: str) -> None:
        """As `InstanceScheduler._free`: the tail given, the request's own full blocks kept hittable
        (a preemption) or given as cached, the hashed slabs released in reverse."""
        held_py, held_c, c, hashed, _ = self.held.pop(rid)
        b = self.b
        full = c // b
        self.py.give(-(-c // b) - full)
        cbp.give(self.c, -(-c // b) - full, False)
        if how == "preempt":
            own_py = self.py.new(("own", rid), hashed, full)
            own_c = cbp.new(self.c, cbp.own_key(rid), hashed, full)
            self.py.release([own_py] if own_py else [])
            cbp.release(self.c, np.array([own_c] if own_c >= 0 else [], np.int64), False)
            self.py.release(reversed(held_py))
            cbp.release(self.c, np.array(held_c[::-1], np.int64), False)
            return
        self.py.give(full - hashed, cached=True)
        cbp.give(self.c, full - hashed, True)
        own = [i for i, s in enumerate(held_py) if type(s.key) is tuple]
        if own:  # a readmitted request's own chain: dead, freed first
            self.ops["dead"] += 1
            self.py.release(reversed([held_py[i] for i in own]), dead=True)
            cbp.release(self.c, np.array([held_c[i] for i in own][::-1], np.int64), True)
            rest = [i for i in range(len(held_py)) if i not in own]
            self.py.release(reversed([held_py[i] for i in rest]))
            cbp.release(self.c, np.array([held_c[i] for i in rest][::-1], np.int64), False)
        else:
            self.py.release(reversed(held_py))
            cbp.release(self.c, np.array(held_c[::-1], np.int64), False)

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.005:
            self.ops["reset"] += 1
            self.held.clear()
            self.py.reset(self.num_blocks)
            cbp.reset(self.c, self.num_blocks)
        elif r < 0.55 or not self.held:
            prompt = int(self.rng.integers(0, 6))
            self.admit(prompt, int(self.rng.integers(1, 7 * self.b)))
        elif r < 0.7:  # a preempted request readmitted under its own id hits its own chain
            rid = int(self.rng.choice(list(self.held)))
            prompt = self.held[rid][4]
            self.free(rid, "preempt")
            self.ops["preempt"] += 1
            self.admit(prompt, int(self.rng.integers(1, 7 * self.b)), rid=rid)
        else:
            rid = int(self.rng.choice(list(self.held)))
            self.free(rid, "finish")
            self.ops["finish"] += 1
        self.check()


def test_same_queue_cache_and_answers() -> None:
    ops: dict[str, int] = {}
    for seed in range(6):
        rng = np.random.default_rng(seed)
        num_blocks = int(rng.integers(12, 80))
        twin = _Twin(num_blocks, int(rng.choice([2, 4])), rng)
        for _ in range(3000):
            twin.step()
        assert twin.c.num_slabs > 4 and twin.c.q_prev.shape[0] > 4  # the tables grew
        for k, v in twin.ops.items():
            ops[k] = ops.get(k, 0) + v
    # the workload reached every path it claims to check: prefix hits that split a held slab, a
    # free one and a free one at both ends (its two ends keep its place in the queue), evictions,
    # preemptions whose own chain is hit back, dead chains, sleeps
    assert all(v > 0 for v in ops.values()), ops


def test_a_cache_off_pool_only_counts() -> None:
    py, c = BlockPool(10, False), cbp.new_pool(10, False)
    for n, give in ((3, 0), (0, 2), (5, 1)):
        py.take(n)
        cbp.take(c, n)
        py.give(give)
        cbp.give(c, give, False)
        assert py.free == c.free
    assert c.q_next[0] == 0  # no queue kept


@pytest.mark.skipif(PURE, reason="already on the pure-Python path")
@pytest.mark.long  # (the same checks once more in pure Python)
def test_the_pure_path_agrees() -> None:
    """The same checks with `RLSIM_PURE_PYTHON=1`: the source the compiler runs, run as Python."""
    assert "3 passed" in run_pure(__file__, "-k", "not pure_path")


def test_slab_keys_match() -> None:
    assert _key(Slab(("own", 7), 0, 1, 1).key) == cbp.own_key(7) < 0 <= _key(Slab(3, 0, 1, 1).key)
