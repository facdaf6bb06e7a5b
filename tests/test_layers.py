"""The layout's import rules (docs/architecture.md), as import-linter contracts in pyproject.toml:
rlsim's layers import downward only (rlsim.real and rlsim.plan above rlsim.calibration, the
measurement drivers of rlsim.measure above rlsim.real), nothing in rlsim or policies imports
calibrate/ (the shipped profiles and two scripts), and policies import only rlsim.protocol,
rlsim.errors and rlsim.config (never simpy, vllm or torch). The contracts hold on the tree, and each one breaks on a
copy of the tree with one import the wrong way, so they are not vacuous."""

from __future__ import annotations

import os
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
    assert "3 kept, 0 broken" in out.stdout


def _copy(tmp_path: Path) -> Path:
    for name in ("rlsim", "policies", "calibrate"):
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
    assert "rlsim's layers import downward only BROKEN" in out.stdout
    assert "rlsim.trace.format -> rlsim.sim.engine" in out.stdout


def test_the_calibration_layer_importing_real_breaks_the_layers(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _add_import(root / "rlsim" / "calibration" / "fit.py", "from rlsim.real import vllm_engine  # noqa: E402")
    out = lint(root)
    assert out.returncode == 1
    assert "rlsim.calibration.fit -> rlsim.real.vllm_engine" in out.stdout


def test_rlsim_importing_calibrate_breaks_its_contract(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _add_import(root / "rlsim" / "real" / "run.py", "import calibrate.derive_profiles  # noqa: E402")
    out = lint(root)
    assert out.returncode == 1
    assert "rlsim is not allowed to import calibrate" in out.stdout
    assert "rlsim.real.run -> calibrate.derive_profiles" in out.stdout


def test_a_policy_importing_simpy_breaks_its_contract(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _add_import(root / "policies" / "sync.py", "import simpy  # noqa: E402")
    out = lint(root)
    assert out.returncode == 1
    assert "policies import only rlsim.protocol, rlsim.errors and rlsim.config BROKEN" in out.stdout
    assert "policies.sync -> simpy" in out.stdout
