"""Build the compiled core's shipped machine code: what a fresh clone or a wheel loads instead of
compiling for a minute on its first run.

    python benchmarks/ship_core.py

Copies the checkout's tracked files into a temporary folder (no compiled cache), runs there the
commands that call every function `CompiledEngine` calls (`rlsim compare` over every policy on the
bundled trace, and one step of the multi-turn trace), compiled for the generic x86-64 CPU, then
copies the cache of those functions (and only those: each holds everything it calls) into
`rlsim/sim/compiled/shipped/<python>-numba<version>/`, replacing what was there. Run it after any
change to the core: `tests/test_shipped_core.py` fails while the shipped code is of another
source. It prints each function's size and the seconds the build took.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from first_run import fresh_clone

from rlsim.sim.compiled import jit

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = (
    ["compare", "--max-steps", "2"],
    ["simulate", "--trace", "traces/search_r1.parquet", "--max-steps", "1", "-o", "out/ship", "--force"],
)


def main() -> None:
    if jit.PURE or os.environ.get("NUMBA_CPU_NAME", "generic") != "generic":
        raise SystemExit("ship_core: needs numba, with NUMBA_CPU_NAME unset or 'generic'")
    from rlsim.sim.compiled.sim_engine import entry_points

    t0 = time.perf_counter()
    dest = jit.shipped_dir()
    with tempfile.TemporaryDirectory() as tmp:
        clone = fresh_clone(Path(tmp))
        for args in WORKLOAD:
            print(f"ship_core: rlsim {' '.join(args)}", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "rlsim.cli", *args], cwd=clone, check=True,
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
    print(f"ship_core: {dest.relative_to(REPO)}: {total / 1e6:.1f} MB in {time.perf_counter() - t0:.0f} s")
    if missing:
        raise SystemExit(f"ship_core: the workload never called {', '.join(missing)}; add a command that does")


if __name__ == "__main__":
    main()
