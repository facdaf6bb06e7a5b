"""The compiled core's array heap (`rlsim.sim.compiled.heap`) pops the rows `heapq` pops, with the
fourth column riding along, through growth from one row, compiled and on the pure-Python path."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from rlsim.sim.compiled import heap as hp
from rlsim.sim.compiled.jit import PURE
from tests.pure_path import run_pure


@pytest.mark.parametrize("columns", [3, 4])
def test_heap_pops_what_heapq_pops(columns: int) -> None:
    rng = np.random.default_rng(7)
    h, n, ref, popped, grown = np.zeros((1, columns), np.int64), 0, [], 0, 0
    for step in range(20_000):
        if n and (rng.random() < 0.45 or step > 15_000):
            got = hp.pop(h, n)
            n -= 1
            want = heapq.heappop(ref)
            assert tuple(int(x) for x in got) == (want if columns == 4 else (*want[:3], 0))
            popped += 1
        else:
            # few distinct first keys: ties broken by the second and third columns, as the core's are
            row = (int(rng.integers(0, 5)), int(rng.integers(0, 3)), step, int(rng.integers(0, 1000)))
            before = h.shape[0]
            h = hp.push(h, n, *row)
            grown += h.shape[0] > before
            n += 1
            heapq.heappush(ref, row if columns == 4 else row[:3])
    assert popped > 5_000 and grown >= 10  # the workload pops thousands and grows the array often


def test_time_key_orders_as_times() -> None:
    times = np.sort(np.random.default_rng(1).exponential(100.0, 1000))
    keys = [hp.time_key(float(t)) for t in times]
    assert keys == sorted(keys) and all(hp.key_time(k) == t for k, t in zip(keys, times, strict=True))


@pytest.mark.skipif(PURE, reason="already on the pure path")
def test_the_pure_path_gives_the_same_heap() -> None:
    run_pure(f"{__file__}::test_heap_pops_what_heapq_pops", f"{__file__}::test_time_key_orders_as_times")
