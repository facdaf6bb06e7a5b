"""A binary min-heap of int rows in a numpy array, for the compiled core's queues.

`heapq` over a numba typed list pays a reference count and a copy on every item it touches; the
finish heap and the event queue are touched on every iteration, so they are rows of an int64
array instead, ordered by their first three columns (a fourth rides along). Pushing and popping
allocate nothing: they run on every event. The same keys come
out in the same order as from `heapq`: every key the core pushes is unique (a request's finish
iteration and id; an event's time, priority and number), so any correct heap pops the same
sequence. A float time is stored by its bits (`time_key`): for times >= 0, the order of the bits
is the order of the times.
"""

from __future__ import annotations

import numpy as np

from rlsim.sim.compiled.jit import grow, njit


@njit
def _le(h: np.ndarray, i: int, k0: int, k1: int, k2: int) -> bool:
    """h[i] <= (k0, k1, k2) on the key columns."""
    if h[i, 0] != k0:
        return h[i, 0] < k0
    if h[i, 1] != k1:
        return h[i, 1] < k1
    return h[i, 2] <= k2


@njit
def _lt_rows(h: np.ndarray, i: int, j: int) -> bool:
    """h[i] < h[j] on the key columns."""
    if h[i, 0] != h[j, 0]:
        return h[i, 0] < h[j, 0]
    if h[i, 1] != h[j, 1]:
        return h[i, 1] < h[j, 1]
    return h[i, 2] < h[j, 2]


@njit
def _move(h: np.ndarray, src: int, dst: int) -> None:
    for c in range(h.shape[1]):
        h[dst, c] = h[src, c]


@njit
def push(h: np.ndarray, n: int, k0: int, k1: int, k2: int, v: int) -> np.ndarray:
    """Add the row (k0, k1, k2, v) to the heap of the first n rows of h (grown if full; `v` only
    where h has a fourth column); returns h. Nothing is allocated unless h grows."""
    if n == h.shape[0]:
        h = grow(h)
    i = n
    while i > 0:
        parent = (i - 1) >> 1
        if _le(h, parent, k0, k1, k2):
            break
        _move(h, parent, i)
        i = parent
    h[i, 0], h[i, 1], h[i, 2] = k0, k1, k2
    if h.shape[1] > 3:
        h[i, 3] = v
    return h


@njit
def pop(h: np.ndarray, n: int) -> tuple[int, int, int, int]:
    """Remove the smallest of the first n rows (n >= 1) and return it (its fourth column 0 where h
    has none); the heap is then n - 1 rows. Nothing is allocated."""
    wide = h.shape[1] > 3
    top = (h[0, 0], h[0, 1], h[0, 2], h[0, 3] if wide else 0)
    n -= 1
    if n == 0:
        return top
    # the last row sifts down from the root: held in row n (now outside the heap) as it goes
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _lt_rows(h, c + 1, c):
            c += 1
        if _lt_rows(h, c, n):
            _move(h, c, i)
            i = c
        else:
            break
    _move(h, n, i)
    return top


@njit
def time_key(t: float) -> int:
    """An int with the order of the float time t >= 0 (its IEEE bits)."""
    return np.float64(t).view(np.int64)


@njit
def key_time(k: int) -> float:
    return np.int64(k).view(np.float64)
