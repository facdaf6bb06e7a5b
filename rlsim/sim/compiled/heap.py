"""A binary min-heap of int rows in a numpy array, for the compiled core's queues.

`heapq` over a numba typed list pays a reference count and a copy on every item it touches; the
finish heap and the event queue are touched on every iteration, so they are rows of an int64
array instead, ordered by their first `width` columns (the rest ride along). The same keys come
out in the same order as from `heapq`: every key the core pushes is unique (a request's finish
iteration and id; an event's time, priority and number), so any correct heap pops the same
sequence. A float time is stored by its bits (`time_key`): for times >= 0, the order of the bits
is the order of the times.
"""

from __future__ import annotations

import numpy as np

from rlsim.sim.compiled.jit import grow, njit


@njit
def _less(h: np.ndarray, i: int, row: np.ndarray, width: int) -> bool:
    """h[i] < row on the first `width` columns."""
    for c in range(width):
        if h[i, c] != row[c]:
            return h[i, c] < row[c]
    return False


@njit
def push(h: np.ndarray, n: int, row: np.ndarray, width: int) -> np.ndarray:
    """Add `row` to the heap of the first n rows of h (grown if full); returns h."""
    if n == h.shape[0]:
        h = grow(h)
    i = n
    while i > 0:
        parent = (i - 1) >> 1
        if not _less(h, parent, row, width) and not _equal(h, parent, row, width):
            h[i] = h[parent]
            i = parent
        else:
            break
    h[i] = row
    return h


@njit
def _equal(h: np.ndarray, i: int, row: np.ndarray, width: int) -> bool:
    for c in range(width):
        if h[i, c] != row[c]:
            return False
    return True


@njit
def pop(h: np.ndarray, n: int, width: int) -> np.ndarray:
    """Remove the smallest of the first n rows (n >= 1) and return it; the heap is then n - 1 rows."""
    top = h[0].copy()
    n -= 1
    if n == 0:
        return top
    last = h[n].copy()
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _less(h, c + 1, h[c], width):
            c += 1
        if _less(h, c, last, width):
            h[i] = h[c]
            i = c
        else:
            break
    h[i] = last
    return top


@njit
def time_key(t: float) -> int:
    """An int with the order of the float time t >= 0 (its IEEE bits)."""
    return np.float64(t).view(np.int64)


@njit
def key_time(k: int) -> float:
    return np.int64(k).view(np.float64)
