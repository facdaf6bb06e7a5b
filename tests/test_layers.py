"""The layout's import rules (docs/architecture.md), as import-linter contracts in pyproject.toml
over every package (rlsim, policies, calibrate/, benchmarks/, doctables/, tests/): each imports
downward only (tests, then the benchmarks and the doc tables' scripts, then calibrate's scripts,
above the library; in rlsim, rlsim.real and rlsim.plan above rlsim.calibration, the measurement
drivers of rlsim.measure above rlsim.real, the profile above the roofline it is checked against),
no package's modules import each other in a cycle, policies import only rlsim.protocol,
rlsim.errors and rlsim.config (never simpy, vllm or torch), only the command layer imports typer,
the tests import no benchmark (not even by putting benchmarks/ on the path) and rlsim imports
nothing of calibrate/. The contracts hold on the tree, and each one breaks on a copy of the tree
with one import the wrong way, so they are not vacuous."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import REPO

LINT = str(Path(sys.executable).with_name("lint-imports"))


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([LINT, "--no-cache"], cwd=root, env=env, capture_output=True, text=True)


def test_contracts_hold() -> None:
    out = lint(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "6 kept, 0 broken" in out.stdout


def _copy(tmp_path: Path) -> Path:
    for name in ("rlsim", "policies", "calibrate", "benchmarks", "doctables", "tests"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    return tmp_path


def _add_import(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _add_import(root / "rlsim" / "trace" / "format.py", "from rlsim.sim import engine  # noqa: E402")
    out = lint(root)
    assert out.returncode == 1
    assert "every package imports downward only BROKEN" in out.stdout
    assert "rlsim.trace.format -> rlsim.sim.engine" in out.stdout


def test_the_calibration_layer_importing_real_breaks_the_layers(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _add_import(root / "rlsim" / "calibration" / "fit.py", "from rlsim.real import vllm_engine  # noqa: E402")
    out = lint(root)
    assert out.returncode == 1
    assert "rlsim.calibration.fit -> rlsim.real.vllm_engine" in out.stdout


def test_rlsim_importing_calibrate_or_a_benchmark_breaks_the_layers(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _add_import(root / "rlsim" / "real" / "run.py", "import calibrate.tiny_model  # noqa: E402")
    _add_import(root / "rlsim" / "cli" / "trace.py", "import benchmarks.trace_load  # noqa: E402")
    out = lint(root)
    assert out.returncode == 1
    assert "rlsim.real.run -> calibrate.tiny_model" in out.stdout
    assert "rlsim.cli.trace -> benchmarks.trace_load" in out.stdout
    assert "the library imports nothing of the calibration scripts" in out.stdout.replace("\n", "")


def test_a_test_importing_a_benchmark_breaks_its_contract(tmp_path: Path) -> None:
    """A test checks what is deterministic; a benchmark measures. (A table's script, which
    computes a doc table from the code, is what a test may import.)"""
    root = _copy(tmp_path)
    _add_import(root / "tests" / "test_bands.py", "import benchmarks.engine_speed  # noqa: E402")
    out = lint(root)
    assert out.returncode == 1
    assert "the tests import no benchmark" in out.stdout
    assert "tests.test_bands -> benchmarks.engine_speed" in out.stdout


def test_no_test_puts_the_benchmarks_on_the_path() -> None:
    """An import by bare name from a folder put on `sys.path` is one import-linter cannot see."""
    on_path = re.compile(r"sys\.path\.(insert|append)\(.*benchmarks")
    for path in sorted((REPO / "tests").glob("*.py")):
        for line in path.read_text().splitlines():
            assert "on_path" in line or not on_path.search(line), f"{path.name}: {line.strip()}"
    assert on_path.search('sys.path.insert(0, str(REPO / "benchmarks"))')


def test_the_roofline_importing_the_profile_at_run_time_breaks_the_layers(tmp_path: Path) -> None:
    """The profile loader checks a profile against the roofline, so the roofline names the
    profile's class for annotations only."""
    root = _copy(tmp_path)
    _add_import(root / "rlsim" / "roofline.py", "from rlsim.profile import Profile  # noqa: E402, F811")
    out = lint(root)
    assert out.returncode == 1
    assert "rlsim.roofline -> rlsim.profile" in out.stdout


def test_a_cycle_inside_a_package_breaks_its_contract(tmp_path: Path) -> None:
    """Two modules of rlsim.trace that import each other (even from inside a function) are a cycle."""
    root = _copy(tmp_path)
    path = root / "rlsim" / "trace" / "synth.py"
    path.write_text(path.read_text() + "\n\ndef _late():\n    from rlsim.trace import fit  # noqa: F401\n")
    out = lint(root)
    assert out.returncode == 1
    assert "no import cycle: the modules of every package import each other without a cycle BROKEN" in out.stdout
    assert ".synth -> .fit" in out.stdout


def test_a_policy_importing_simpy_breaks_its_contract(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _add_import(root / "policies" / "sync.py", "import simpy  # noqa: E402")
    out = lint(root)
    assert out.returncode == 1
    assert "policies import only rlsim.protocol, rlsim.errors and rlsim.config BROKEN" in out.stdout
    assert "policies.sync -> simpy" in out.stdout


def test_the_library_importing_typer_breaks_its_contract(tmp_path: Path) -> None:
    """Only the command layer parses: typer anywhere else in rlsim (even inside a function) is refused."""
    root = _copy(tmp_path)
    path = root / "rlsim" / "plan" / "planner.py"
    path.write_text(path.read_text() + "\n\ndef _late():\n    import typer  # noqa: F401\n")
    out = lint(root)
    assert out.returncode == 1
    assert "only the command layer imports typer: the library parses nothing BROKEN" in out.stdout
    assert "rlsim.plan.planner -> typer" in out.stdout
