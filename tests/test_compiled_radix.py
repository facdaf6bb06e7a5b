"""The compiled radix cache (`rlsim.sim.compiled.radix`) keeps the same tree, counts and eviction
order as `rlsim.sim.radix_cache.RadixCache` under the calls SGLang's scheduler makes, compiled and
on the pure-Python path."""

from __future__ import annotations

import numpy as np
import pytest

from rlsim.sim.compiled import radix as cr
from rlsim.sim.compiled.jit import PURE
from rlsim.sim.radix_cache import RadixCache
from tests.pure_path import run_pure


def _tree_py(cache: RadixCache) -> list:
    """Every live node below the root, depth first in key order: (key, lo, hi, lock, last access, depth)."""
    out = []

    def walk(node, depth: int) -> None:  # noqa: ANN001
        for child in sorted(node.children.values(), key=lambda c: (_key_py(c.key), c.lo)):
            out.append((_key_py(child.key), child.lo, child.hi, child.lock, child.last_access, depth))
            walk(child, depth + 1)

    walk(cache.root, 0)
    return out


def _key_py(key: object) -> tuple[int, int]:
    return (cr.OWN, key[1]) if type(key) is tuple else (cr.SHARED, key)


def _tree_c(r: cr.RadixState) -> list:
    nd = r.nd
    kids: dict[int, list[int]] = {}
    for (parent, _, _, _), child in dict(r.children).items():
        kids.setdefault(int(parent), []).append(int(child))
    out = []

    def walk(node: int, depth: int) -> None:
        by_key = sorted(kids.get(node, []), key=lambda c: (nd[cr.N_KIND, c], nd[cr.N_KEY, c], nd[cr.N_LO, c]))
        for c in by_key:
            assert nd[cr.N_ALIVE, c] and nd[cr.N_PARENT, c] == node
            out.append(((int(nd[cr.N_KIND, c]), int(nd[cr.N_KEY, c])), int(nd[cr.N_LO, c]), int(nd[cr.N_HI, c]),
                        int(nd[cr.N_LOCK, c]), int(nd[cr.N_ACCESS, c]), depth))  # fmt: skip
            walk(c, depth + 1)

    walk(cr.ROOT, 0)
    for node, children in kids.items():  # each node's child count is what the mapping holds
        assert nd[cr.N_CHILDREN, node] == len(children)
    return out


def _describe_py(cache: RadixCache, node) -> tuple:  # noqa: ANN001
    return (0, 0, 0) if node is cache.root else (*_key_py(node.key), node.lo, node.hi)


def _describe_c(r: cr.RadixState, node: int) -> tuple:
    nd = r.nd
    return (0, 0, 0) if node == cr.ROOT else (int(nd[cr.N_KIND, node]), int(nd[cr.N_KEY, node]),
                                              int(nd[cr.N_LO, node]), int(nd[cr.N_HI, node]))  # fmt: skip


class _Twin:
    """One cache of each kind, driven as `SGLangScheduler` drives its cache: admissions match and
    lock a request's path, prefills insert and move the lock down, finishes insert unlocked and
    unlock, retractions unlock; decode steps allocate, admissions evict for room."""

    def __init__(self, num_tokens: int, page: int, enabled: bool, rng: np.random.Generator) -> None:
        self.py, self.c = RadixCache(num_tokens, enabled), cr.new_radix(num_tokens, enabled)
        self.page, self.rng = page, rng
        self.held: dict[int, tuple] = {}  # rid -> (py node, c node, covered, prompt_id, shared, computed)
        self.next_rid = 0
        self.ops = dict.fromkeys(("admit", "hit", "split", "prefill", "finish", "retract", "touch", "evicted",
                                  "alloc", "reset"), 0)  # fmt: skip

    def floor(self, n: int) -> int:
        return n // self.page * self.page

    def check(self) -> None:
        assert (self.c.free, self.c.evictable) == (self.py.free, self.py.evictable)
        assert _tree_c(self.c) == _tree_py(self.py)

    def admit(self) -> None:
        rng = self.rng
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        prompt_id = int(rng.integers(0, 6))
        shared = self.floor(int(rng.integers(1, 200)))
        ntok = shared + int(rng.integers(0, 60))
        limit = self.floor(ntok - 1)
        node_py, hit_py = self.py.match(prompt_id, shared, rid, limit, lock=True)
        node_c, hit_c = cr.match(self.c, prompt_id, shared, rid, limit, True)
        assert hit_c == hit_py and _describe_c(self.c, node_c) == _describe_py(self.py, node_py)
        self.ops["admit"] += 1
        self.ops["hit"] += hit_py > 0
        self.ops["split"] += 0 < hit_py < limit
        self.held[rid] = (node_py, node_c, hit_py, prompt_id, shared, ntok)

    def prefill(self, rid: int) -> None:
        node_py, node_c, covered, prompt_id, shared, ntok = self.held[rid]
        c = self.floor(int(self.rng.integers(covered, ntok + 1)))
        if c - covered <= self.py.free + self.py.evictable:  # its slots, evicting as needed (as a prefill takes them)
            self.py.alloc(c - covered)
            cr.alloc(self.c, c - covered)
        new_py, dup_py = self.py.insert(node_py, covered, prompt_id, shared, rid, c, lock=True)
        new_c, dup_c = cr.insert(self.c, node_c, covered, prompt_id, shared, rid, c, True)
        assert dup_c == dup_py and _describe_c(self.c, new_c) == _describe_py(self.py, new_py)
        self.py.unlock(node_py)
        cr.unlock(self.c, node_c)
        self.held[rid] = (new_py, new_c, c if self.py.enabled else 0, prompt_id, shared, ntok)
        self.ops["prefill"] += 1

    def leave(self, rid: int, insert: bool) -> None:
        node_py, node_c, covered, prompt_id, shared, ntok = self.held.pop(rid)
        if insert and self.py.enabled:
            end = self.floor(ntok + int(self.rng.integers(0, 40)))
            got_py = self.py.insert(node_py, covered, prompt_id, shared, rid, end)
            got_c = cr.insert(self.c, node_c, covered, prompt_id, shared, rid, end, False)
            assert got_c[1] == got_py[1] and _describe_c(self.c, got_c[0]) == _describe_py(self.py, got_py[0])
        self.py.unlock(node_py)
        cr.unlock(self.c, node_c)
        self.ops["finish" if insert else "retract"] += 1

    def touch(self) -> None:
        prompt_id, shared = int(self.rng.integers(0, 6)), self.floor(int(self.rng.integers(1, 200)))
        rid = int(self.rng.integers(0, self.next_rid + 1))
        got_py = self.py.match(prompt_id, shared, rid, self.floor(shared + 30))
        got_c = cr.match(self.c, prompt_id, shared, rid, self.floor(shared + 30), False)
        assert got_c[1] == got_py[1] and _describe_c(self.c, got_c[0]) == _describe_py(self.py, got_py[0])
        self.ops["touch"] += 1

    def evict(self) -> None:
        n = int(self.rng.integers(1, 300))
        if self.rng.random() < 0.5:
            freed = self.py.evict(n)
            assert cr.evict(self.c, n) == freed
            self.ops["evicted"] += freed > 0
        else:
            assert cr.evict_to_free(self.c, n) == self.py.evict_to_free(n)

    def alloc(self) -> None:
        n = int(self.rng.integers(0, max(1, min(64, self.py.free + self.py.evictable))))
        self.py.alloc(n)
        cr.alloc(self.c, n)
        self.ops["alloc"] += 1

    def reset(self) -> None:
        self.py.reset()
        cr.reset(self.c)
        self.held.clear()
        self.ops["reset"] += 1


@pytest.mark.parametrize(("page", "enabled"), [(1, True), (16, True), (1, False)])
def test_compiled_radix_matches_python(page: int, enabled: bool) -> None:
    """Random admissions, prefills, finishes, retractions, touches, evictions, allocations and the
    odd reset hold the two caches' trees (keys, positions, locks, last accesses), free and
    evictable counts and every answer equal, operation by operation."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        twin = _Twin(4000, page, enabled, rng)
        for _ in range(1500):
            u = rng.random()
            if u < 0.3 or not twin.held:
                twin.admit()
            elif u < 0.45:
                twin.prefill(int(rng.choice(list(twin.held))))
            elif u < 0.65:
                twin.leave(int(rng.choice(list(twin.held))), insert=rng.random() < 0.8)
            elif u < 0.75:
                twin.touch()
            elif u < 0.87:
                twin.evict()
            elif u < 0.995:
                twin.alloc()
            else:
                twin.reset()
            twin.check()
        ops = twin.ops
        # the workload exercised what it claims: hits, splits, evictions, both ways of leaving
        assert ops["admit"] and ops["prefill"] and ops["finish"] and ops["retract"] and ops["alloc"]
        if enabled:
            assert ops["hit"] > 20 and ops["split"] > 5 and ops["evicted"] > 5, ops
        else:
            assert ops["hit"] == 0 and not _tree_py(twin.py)


@pytest.mark.skipif(PURE, reason="already on the pure path")
@pytest.mark.long  # (the same checks once more in pure Python)
def test_compiled_radix_pure_path() -> None:
    """The same source run as plain Python passes the same check."""
    run_pure(f"{__file__}::test_compiled_radix_matches_python")
