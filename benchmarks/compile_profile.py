"""Where a cold compile of the simulator's core goes: each numba compilation's own time against
the size of the machine code library it builds.

    python benchmarks/compile_profile.py [--top N]

Copies the checkout's tracked files into a temporary folder (no compiled cache), runs a one-step
`rlsim simulate` there, with numba set to this machine's own CPU (so that the shipped generic code
does not fit, and the core compiles as where it is not shipped), in a child process with a
listener on numba's compile events, and prints per compilation its own seconds (those of the
compilations it triggers taken out), its library's functions and LLVM instructions (a numba
library holds the code of every function it calls), a least-squares fit of seconds on
instructions, and the instructions the entry points' libraries hold against all libraries'.
docs/speed.md quotes one run of it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import llvmlite.binding as ll
import numpy as np

from rlsim.hostload import LoadMeter, describe
from rlsim.package_data import fresh_clone
from rlsim.sim.compiled.sim_engine import entry_points

CHILD = r"""
import json, sys, time
from numba.core import event
stack, rows = [], []

class Listener(event.Listener):
    def on_start(self, ev):
        stack.append([time.perf_counter(), 0.0])

    def on_end(self, ev):
        d = ev.data["dispatcher"]
        t0, inner = stack.pop()
        total = time.perf_counter() - t0
        if stack:
            stack[-1][1] += total
        rows.append((str(d.py_func.__module__), d.py_func.__name__, total - inner, d))

event.register("numba:compile", Listener())
sys.argv = ["rlsim", "simulate", "--max-steps", "1", "-o", sys.argv[1], "--force"]
from rlsim.cli.app import main
try:
    main()
except SystemExit:
    pass
out = []
for module, name, own, d in rows:
    if not d.overloads:  # (a typing attempt numba retried with other types)
        out.append({"module": module, "name": name, "own_s": own, "functions": 0, "instructions": 0})
        continue
    lib = next(iter(d.overloads.values())).library
    funcs = [f for f in lib._final_module.functions if not f.is_declaration]
    insts = sum(len(list(b.instructions)) for f in funcs for b in f.blocks)
    out.append({"module": module, "name": name, "own_s": own, "functions": len(funcs), "instructions": insts})
print("ROWS" + json.dumps(out))
"""


def main() -> None:
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 15
    meter = LoadMeter()
    with tempfile.TemporaryDirectory() as tmp:
        clone = fresh_clone(Path(tmp))
        # numba set to this machine's CPU, so that the shipped generic code does not fit: the core compiles
        env = dict(os.environ, PYTHONPATH=str(clone), NUMBA_CPU_NAME=ll.get_host_cpu_name())
        proc = subprocess.run([sys.executable, "-c", CHILD, str(Path(tmp) / "out")], cwd=clone, env=env,
                              capture_output=True, text=True)  # fmt: skip
    line = next((x for x in proc.stdout.splitlines() if x.startswith("ROWS")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"the cold simulate failed:\n{proc.stderr[-2000:]}")
    rows = json.loads(line[4:])
    own = np.array([r["own_s"] for r in rows])
    insts = np.array([r["instructions"] for r in rows], float)
    fixed, per = np.linalg.lstsq(np.c_[np.ones_like(insts), insts], own, rcond=None)[0]
    core = [r for r in rows if r["module"].startswith("rlsim.sim.compiled")]
    entry = [r for r in core if r["name"] in entry_points()]
    print(f"{len(rows)} compilations ({len(core)} of the core's functions), {own.sum():.1f} s of their own time")
    print(f"fit: {fixed:.3f} s per compilation + {per * 1e6:.0f} us per LLVM instruction of its library")
    print(f"instructions in all libraries: {int(insts.sum()):,}; in the core's entry points' libraries: "
          f"{sum(r['instructions'] for r in entry):,}")  # fmt: skip
    print(f"\n{'own s':>6} {'functions':>9} {'instructions':>12}  compilation")
    for r in sorted(rows, key=lambda r: -r["own_s"])[:top]:
        print(f"{r['own_s']:6.2f} {r['functions']:9d} {r['instructions']:12,d}  {r['module']}.{r['name']}")
    machine = f"{platform.machine()} Linux with {os.cpu_count()} CPUs"
    print(f"\non {machine}; during the measurement {describe(meter.read())}")


if __name__ == "__main__":
    main()
