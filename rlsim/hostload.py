"""The machine's load beside a measurement: how much CPU other processes took meanwhile.

A profile calibrated while the machine was quiet and a run measured beside a busy neighbour
disagree for a reason that is neither the simulator's scheduling nor its time model. A
`LoadMeter` reads `/proc/stat` (every CPU's busy time, steal included) and the CPU time of this
process and its descendants (vLLM's engine core, Ray's actors when Ray runs here) at the start
and end of a window:

    host/others_cpus = (machine busy time - this process tree's CPU time) / window wall time

in cores (0 on an idle machine, 1 when a neighbour keeps one core busy), beside the 1-minute load
average (`os.getloadavg`, which counts this process tree too). Where `/proc` is absent (not
Linux) the share is NaN and only the load average is reported.

Neither sees a virtual machine's host taking cycles (this 2-core VM reports no steal time, yet
two identical back-to-back runs differ by 10%), so `speed_probe()` times a fixed piece of work,
Python bytecode and a small matrix product, as a small model's engine spends its time: taken
while a profile is calibrated and around a run, the ratio of the two says how much slower or
faster the machine itself was.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np

_PROC = Path("/proc")


def _machine_busy_s() -> float | None:
    """Seconds of CPU time the whole machine has spent busy since boot (all CPUs)."""
    try:
        first = (_PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, *rest = (int(v) for v in first[1:])
    steal = rest[0] if rest else 0
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of `root`, every live descendant and the descendants they
    have reaped."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        fields = raw[raw.rindex(")") + 2 :].split()  # the command name may hold spaces
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        # utime + stime, and cutime + cstime: the children it has reaped (ended ones count too)
        cpu[pid] = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


class LoadMeter:
    """Others' CPU use over a window; `read()` ends one window and starts the next."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._start = self._sample()

    def _sample(self) -> tuple[float, float | None, float]:
        busy = _machine_busy_s()
        own = _tree_cpu_s(self._pid) if busy is not None else 0.0
        return time.perf_counter(), busy, own

    def read(self) -> dict[str, float]:
        """`host/others_cpus` over the window since the last read, `host/load_1m` now."""
        end = self._sample()
        (t0, busy0, own0), (t1, busy1, own1) = self._start, end
        self._start = end
        others = math.nan
        if busy0 is not None and busy1 is not None and t1 > t0:
            others = max(0.0, ((busy1 - busy0) - max(0.0, own1 - own0)) / (t1 - t0))
        return {"host/others_cpus": round(others, 3), "host/load_1m": round(os.getloadavg()[0], 2)}


def describe(load: dict[str, float] | None) -> str:
    """One phrase for a table footer: `others used 0.12 CPUs (load average 1.3)`."""
    if not load:
        return "not recorded"
    others = load.get("host/others_cpus", math.nan)
    share = "unknown" if others is None or math.isnan(others) else f"{others:.2f}"
    probe, engine = load.get("host/probe_ms"), load.get("host/engine_probe_ms")
    speed = "" if probe is None else f", speed probe {probe:.2f} ms"
    speed += "" if engine is None else f", engine probe {engine:.1f} ms"
    return f"others used {share} CPUs (load average {load.get('host/load_1m', math.nan):.1f}{speed})"


def _probe_once(mat: np.ndarray) -> float:
    t0 = time.perf_counter()
    acc: dict[int, int] = {}
    for i in range(20_000):  # interpreter work: a scheduler's and a sampler's bookkeeping
        acc[i & 255] = acc.get(i & 255, 0) + i
    for _ in range(20):  # a small dense product, as a tiny model's layers
        mat = np.tanh(mat @ mat * 0.01)
    return time.perf_counter() - t0


def speed_probe(repeats: int = 9) -> float:
    """Milliseconds a fixed piece of work takes on this machine now (median of `repeats`,
    about 10 ms each): a slower machine gives a larger figure."""
    mat = np.random.default_rng(0).standard_normal((96, 96)).astype(np.float32)
    return round(1e3 * float(np.median([_probe_once(mat) for _ in range(repeats)])), 3)
