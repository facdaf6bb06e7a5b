"""A fresh clone's first run against its second, side by side: the first loads the simulator's
core from the machine code the package ships (`rlsim/sim/compiled/shipped/`), or compiles it where
that does not fit (numba, cached on disk after); the second loads it from the cache.

    python benchmarks/first_run.py [--compare] [--markdown | --readme]

For each command, copies the checkout's tracked files into a temporary folder of its own (a fresh
clone: no compiled cache) and runs the command there twice, each time as its own process, timing
wall and CPU seconds: `rlsim simulate --max-steps 1`, the same with numba set to this machine's
own CPU (`NUMBA_CPU_NAME`, so that the shipped generic code does not fit and the core compiles, as
on a platform it is not shipped for), and with `--compare` the README's `rlsim compare`.
`--readme` writes the `first_run` table into docs/speed.md with the machine and its load.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import llvmlite.binding as ll

from rlsim.hostload import LoadMeter
from rlsim.package_data import fresh_clone
from rlsim.package_data.markers import emit, machine_note

REPO = Path(__file__).resolve().parents[1]


def timed(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of `python -m rlsim.cli ARGS` in `cwd`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rlsim.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **env})  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"rlsim {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    meter = LoadMeter()
    simulate = ["simulate", "--max-steps", "1", "-o", "out/first", "--force"]
    cpu = ll.get_host_cpu_name()
    commands = [("`rlsim simulate --max-steps 1`", simulate, {}),
                (f"`rlsim simulate --max-steps 1`, compiling (`NUMBA_CPU_NAME={cpu}`)", simulate,
                 {"NUMBA_CPU_NAME": cpu})]  # fmt: skip
    if "--compare" in sys.argv:
        commands.append(("`rlsim compare`", ["compare"], {}))
    rows = ["| command, in a fresh clone | first run (s) | second run (s) | first / second | first run's CPU (s) |",
            "|---|---:|---:|---:|---:|"]  # fmt: skip
    for label, args, env in commands:
        with tempfile.TemporaryDirectory() as tmp:  # each command in a clone of its own: its first run is cold
            clone = fresh_clone(Path(tmp))
            assert not list(clone.rglob("__pycache__/*.nbi")), "a fresh clone holds no compiled cache"
            first, first_cpu = timed(args, clone, env)
            second, _ = timed(args, clone, env)
            rows.append(f"| {label} | {first:.1f} | {second:.1f} | {first / second:.1f}x | {first_cpu:.1f} |")
            print(f"{label}: first {first:.1f} s, second {second:.1f} s", file=sys.stderr)
    body = "\n".join(rows) + "\n\n" + machine_note(meter, "first_run.py")
    if "--markdown" in sys.argv or "--readme" in sys.argv:
        emit("first_run", body, sys.argv)
    else:
        print(body)


if __name__ == "__main__":
    main()
