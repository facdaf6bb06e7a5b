"""No tracked file names a machine's absolute home or work folder: committed data (recorded runs,
traces, profiles) must work in any clone, so the paths it keeps are relative to the run directory
that holds them (`benchmarks/validate_real.relativize`), and a recorded run validates where it lies."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a home folder (home/USER, Users/USER, root) or a work folder at the root: what a machine's own paths begin with
ABSOLUTE = re.compile(rb"(?<![\w.~$-])/(?:home/\w|Users/\w|root/|work/)")


# The compiled core's shipped machine code (`rlsim/sim/compiled/shipped/`): numba writes the
# locations of its own sources and of the interpreter's extension modules on the building machine
# into the error messages of the code it generates; nothing opens them, and the code loads in any
# clone or wheel (`tests/test_shipped_core.py`, `.ci/wheel`)
MACHINE_CODE = "rlsim/sim/compiled/shipped/"


def test_no_tracked_file_names_an_absolute_home_or_work_path() -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    files = [f for f in files if f and not f.decode().startswith(MACHINE_CODE)]
    assert files
    found = [f.decode() for f in files if ABSOLUTE.search((ROOT / f.decode()).read_bytes())]
    assert found == [], "tracked files that name absolute home or work paths"


def test_the_pattern_finds_what_a_recorder_would_leave() -> None:
    assert ABSOLUTE.search(b'"trace_path": "/' + b'work/main/out/validate-real/tiny.parquet"')
    assert ABSOLUTE.search(b"model=/" + b"home/alice/models/qwen")
    assert not ABSOLUTE.search(b"see docs/work/ and ~/home/x and $HOME/root/")


def test_a_recorded_run_validates_where_it_lies_in_the_checkout() -> None:
    run = next((ROOT / "tests" / "data" / "recorded_runs").glob("*/run-sync*"))
    proc = subprocess.run([sys.executable, "-m", "rlsim.cli", "validate", str(run)], cwd=ROOT / "tests",
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rollout" in proc.stdout
