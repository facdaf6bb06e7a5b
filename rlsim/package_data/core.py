"""The compiled core's shipped machine code: what a fresh clone or a wheel loads instead of
compiling for a minute on its first run.

    python -m rlsim.package_data core [--check]

Copies the checkout's tracked files into a temporary folder (no compiled cache), runs there the
commands that call every function `CompiledEngine` calls (`rlsim compare` over every policy on the
bundled trace under each engine whose rules the core holds, and one step of the multi-turn trace)
and every function of each engine's rules that SimEngine calls (`rlsim.sim.sglang_rules`,
`rlsim.sim.vllm_rules`),
compiled for the generic x86-64 CPU, then copies the cache of those functions (and only those:
each holds everything it calls) into `rlsim/sim/compiled/shipped/<python>-numba<version>/`,
replacing what was there. Run it after any
change to the core, and commit its output with the change: `--check` (and
`tests/test_shipped_core.py`) fails while the shipped code is of another source. It prints each
function's size and the seconds the build took.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlsim.errors import RlsimError
from rlsim.package_data import checkout, fresh_clone
from rlsim.sim.compiled import jit

WORKLOAD = (  # (the core is compiled for each rules' state type: vLLM's, then SGLang's), with its environment
    (["compare", "--max-steps", "2"], {}),
    (["compare", "--rollout-engine", "sglang", "--max-steps", "2"], {}),
    (["simulate", "--trace", "traces/search_r1.parquet", "--max-steps", "1", "-o", "out/ship", "--force"], {}),
    # SimEngine under each engine's rules (lockstep, replay, data-parallel attention), which calls the
    # rules' functions from Python
    (["compare", "--rollout-engine", "sglang", "--max-steps", "1", "--policies", "sync,async_partial"],
     {"RLSIM_ENGINE": "simpy"}),
    (["compare", "--max-steps", "1", "--policies", "sync,async_partial"], {"RLSIM_ENGINE": "simpy"}),
)


def index(path: Path) -> tuple[str, dict]:
    """(The source stamp, the overloads) of one shipped function's index file."""
    with path.open("rb") as f:
        version = pickle.load(f)
        stamp, overloads = pickle.loads(f.read())
    if version != jit.numba.__version__:
        raise RlsimError(f"{path.name} is numba {version}'s index, and numba {jit.numba.__version__} is installed")
    return stamp, overloads


def stale() -> list[str]:
    """What is not this source's machine code in the shipped folder: a function without an index,
    one of another source or CPU, a file no function indexes, a folder of another numba."""
    if jit.PURE:
        return []  # (the pure-Python path compiles nothing, so it has nothing to compare)
    from rlsim.sim.compiled.sim_engine import entry_points

    shipped = jit.shipped_dir()
    if not shipped.is_dir():
        return [f"{shipped.name}/ missing"]
    out, names = [], set()
    for name, fn in entry_points().items():
        path = shipped / f"{fn._cache._impl.filename_base}.nbi"
        if not path.is_file():
            out.append(f"{name}: no machine code")
            continue
        stamp, overloads = index(path)
        if stamp != jit._DIGEST:
            out.append(f"{name}: of another source")
        if not overloads or any(key[1][1:] != ("generic", "") for key in overloads):
            out.append(f"{name}: not generic x86-64 code")
        names |= {path.name, *overloads.values()}
    out += [f"{f.name}: no function indexes it" for f in sorted(shipped.iterdir()) if f.name not in names]
    out += [f"{p.name}/: for another numba or CPython" for p in sorted(jit.SHIPPED.iterdir()) if p != shipped]
    return out


def write() -> None:
    """Build the machine code and replace the shipped folder with it."""
    if jit.PURE or os.environ.get("NUMBA_CPU_NAME", "generic") != "generic":
        raise RlsimError("core: building the machine code needs numba, with NUMBA_CPU_NAME unset or 'generic'")
    from rlsim.sim.compiled.sim_engine import entry_points

    root = checkout()

    t0 = time.perf_counter()
    dest = jit.shipped_dir()
    with tempfile.TemporaryDirectory() as tmp:
        clone = fresh_clone(Path(tmp))
        for args, env in WORKLOAD:
            said = " ".join([*(f"{k}={v}" for k, v in env.items()), "rlsim", *args])
            print(f"core: {said}", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "rlsim.cli", *args], cwd=clone, check=True, env=os.environ | env,
                           stdout=subprocess.DEVNULL)  # fmt: skip
        built = clone / "rlsim" / "sim" / "compiled" / "__pycache__"
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        missing = []
        for name, fn in entry_points().items():
            base = fn._cache._impl.filename_base
            files = sorted(built.glob(f"{base}.*"))
            if not any(f.suffix == ".nbi" for f in files):
                missing.append(name)
                continue
            for f in files:
                shutil.copy2(f, dest / f.name)
            size = sum(f.stat().st_size for f in files)
            print(f"  {name:<20} {len(files) - 1} overload(s), {size / 1e6:.2f} MB")
    total = sum(f.stat().st_size for f in dest.iterdir())
    print(f"core: {dest.relative_to(root)}: {total / 1e6:.1f} MB in {time.perf_counter() - t0:.0f} s")
    if missing:
        raise RlsimError(f"core: the workload never called {', '.join(missing)}; add a command that does")
