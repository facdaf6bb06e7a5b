"""Benchmark: each default policy's epoch split into the compiled engine's own work and the rest.

    python benchmarks/engine_floor.py [--policies sync,sortedrl] [--markdown | --readme]

In one process, after the engine's compiled code is loaded: the heap loop of
`benchmarks/simulate_epoch.py` (best of three), then one epoch of the bundled trace per policy
(default: every policy `rlsim compare` runs) with the compiled core's entry points timed
(`rlsim.sim.compiled.engine`: `step`, `submit`, `abort`, `take_outbox`, each call timed from
Python, about 0.1 us a call) and `CompiledEngine`'s methods around them (the core, plus turning
the protocol's calls into arrays and the core's outbox into events). The rest of the epoch is
the driver, the policy and the records. Each part is given in seconds and as a ratio to the heap
loop: the core's ratio is what a policy's epoch would cost if everything else were free.

Then `rlsim compare`'s floor: the compare defaults' two epochs of every default policy, run
here one after the other with the core timed, and the core's seconds summed over them and
divided over this machine's cores (`rlsim compare` runs one process per core): what
`rlsim compare` would take if the driver, the policies, the records, process start-up and
trace loading were all free and the policies shared the cores perfectly; and the same of the
driver, the policies and the records (the run less `CompiledEngine`'s time), with the engine free.

With `--markdown` it prints, and with `--readme` also writes into docs/speed.md, the table
`engine_floor`, with the machine and its load during the run.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time

from simulate_epoch import heap_loop_epoch

from policies.registry import COMPARE_DEFAULT
from rlsim.config import ClusterConfig, RLConfig
from rlsim.hostload import LoadMeter
from rlsim.package_data.markers import emit, machine_note
from rlsim.paths import default_trace
from rlsim.sim.compiled import engine as ce
from rlsim.sim.compiled import sim_engine
from rlsim.sim.simulate import simulate
from rlsim.trace.format import load

_CORE = ("step", "submit", "abort", "take_outbox")  # the compiled core's entry points the wrapper calls
_WRAPPER = ("step", "submit", "abort")  # CompiledEngine's methods around them


def _timed(owner: object, names: tuple[str, ...], acc: dict, key: str) -> None:
    """Time every call of these attributes of `owner` into `acc[key]`."""
    for name in names:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args: object, _fn=fn, **kw: object) -> object:  # noqa: ANN001
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kw)
            finally:
                acc[key] += time.perf_counter() - t0

        setattr(owner, name, timed)


def _run(trace, policy: str, cluster: ClusterConfig, rl: RLConfig, acc: dict) -> tuple[float, float, float]:  # noqa: ANN001
    """One simulation of `policy`: its wall seconds, the core's and `CompiledEngine`'s in it."""
    acc.update(core=0.0, engine=0.0)
    t0 = time.perf_counter()
    simulate(trace, policy, cluster=cluster, rl=rl, tables=False)
    return time.perf_counter() - t0, acc["core"], acc["engine"]


def _against_targets(rows: list, ref: float, core2: float, rest2: float, cores: int) -> str:
    """The issue's targets beside the parts that would each have to meet them alone."""
    rest = [(wall - engine) / ref for _, wall, _, engine in rows]
    over = sum(core / ref > 5 for _, _, core, _ in rows)
    sync = next((r for r in rows if r[0] == "sync"), None)
    first = (
        f"sync's core alone is {sync[2] / ref:.1f}x the heap loop and its driver, policy and records "
        f"{(sync[1] - sync[3]) / ref:.1f}x (target 3x); "
        if sync
        else ""
    )
    return (
        f"Against the targets: {first}the driver, policy and records alone are {min(rest):.1f}-{max(rest):.1f}x "
        f"for the {len(rows)} policies, and the core alone above 5x for {over} of them (target 5x); "
        f"`rlsim compare` over {cores} cores, {core2 / cores:.1f} s for the core alone and {rest2 / cores:.1f} s "
        "for the driver, policies and records alone (target 15 s)."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default=",".join(COMPARE_DEFAULT))
    ap.add_argument("--markdown", action="store_true", help="print the table it writes")
    ap.add_argument("--readme", action="store_true", help="print the table and write it into docs/speed.md")
    a = ap.parse_args()
    policies = a.policies.split(",")
    trace = load(default_trace(), columns=[])
    cluster, one_epoch, defaults = ClusterConfig(), RLConfig(epochs=1), RLConfig()
    simulate(trace, "sync", cluster=cluster, rl=RLConfig(epochs=1, max_steps=1), tables=False)  # load the compiled code
    meter = LoadMeter()
    ref = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        heap_loop_epoch(trace, cluster, one_epoch)
        ref = min(ref, time.perf_counter() - t0)
    acc = {"core": 0.0, "engine": 0.0}
    _timed(ce, _CORE, acc, "core")
    _timed(sim_engine.CompiledEngine, _WRAPPER, acc, "engine")
    rows = []
    for policy in policies:
        wall, core, engine = _run(trace, policy, cluster, one_epoch, acc)
        rows.append((policy, wall, core, engine))
        print(f"{policy:24s} epoch {wall:6.2f} s  core {core:5.2f} s ({core / ref:4.1f}x the heap loop)  "
              f"engine {engine:5.2f} s  rest {wall - engine:5.2f} s", flush=True)  # fmt: skip
    runs = [_run(trace, policy, cluster, defaults, acc) for policy in policies]  # rlsim compare's two epochs
    wall2, core2, engine2 = (sum(run[k] for run in runs) for k in range(3))
    cores = os.cpu_count() or 1
    note = machine_note(meter, "engine_floor.py")
    table = [
        "| policy (one epoch) | epoch (s) | compiled core (s) | core / heap loop | `CompiledEngine` (s) "
        "| driver, policy, records (s) | the rest / heap loop |",
        "|---|---|---|---|---|---|---|",
    ]
    for policy, wall, core, engine in rows:
        table.append(f"| {policy} | {wall:.2f} | {core:.2f} | {core / ref:.1f}x | {engine:.2f} | {wall - engine:.2f} | "
                     f"{(wall - engine) / ref:.1f}x |")  # fmt: skip
    total = [sum(r[k] for r in rows) for k in (1, 2, 3)]
    table.append(f"| all {len(rows)}, summed | {total[0]:.2f} | {total[1]:.2f} | | {total[2]:.2f} | "
                 f"{total[0] - total[2]:.2f} | |")  # fmt: skip
    floor = (
        f"The heap loop: {ref:.2f} s. `rlsim compare`'s defaults ({defaults.epochs} epochs of each of the "
        f"{len(rows)} policies) took {wall2:.1f} s here one after the other, {core2:.1f} s of it in the compiled "
        f"core: over {cores} cores, a floor of {core2 / cores:.1f} s for `rlsim compare` with everything but the "
        f"core free. The driver, policies and records took {wall2 - engine2:.1f} s of it: over {cores} cores, "
        f"{(wall2 - engine2) / cores:.1f} s with the engine free."
    )
    targets = _against_targets(rows, ref, core2, wall2 - engine2, cores)
    print(floor)
    print(targets)
    print(note)
    emit("engine_floor", "\n".join(table) + "\n\n" + floor + "\n\n" + targets + "\n\n" + note, sys.argv)


if __name__ == "__main__":
    main()
