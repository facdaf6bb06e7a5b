"""The first run after an install compiles the simulator's core, and says so while it does: the
cache check behind the message (`rlsim.sim.compiled.jit.cached`) is held to a real compile here.
`python benchmarks/first_run.py` times a fresh clone's first and second run side by side."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from rlsim.sim.compiled.jit import PURE, cached
from rlsim.sim.compiled.sim_engine import core_compiled

pytestmark = pytest.mark.skipif(PURE, reason="the pure path compiles nothing")


def test_a_compiled_function_is_cached_only_once_it_has_compiled(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    (tmp_path / "fresh_core.py").write_text(
        "from rlsim.sim.compiled.jit import njit\n\n\n@njit\ndef twice(x):\n    return 2 * x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("fresh_core")
    try:
        assert not cached(mod.twice)  # a new module's function: nothing on disk yet
        assert mod.twice(21) == 42
        assert cached(mod.twice)
        assert list((tmp_path / "__pycache__").glob("fresh_core.twice-*.nbi"))
    finally:
        sys.modules.pop("fresh_core", None)


def test_the_message_is_shown_only_when_the_core_is_not_cached(small_trace_path: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rlsim.cli.app import app

    args = ["simulate", "--trace", str(small_trace_path), "--gpus", "4", "--max-steps", "1", "-o", str(tmp_path / "r")]
    CliRunner().invoke(app, args)  # compiles if it must
    assert core_compiled()
    r = CliRunner().invoke(app, [*args, "--force"])
    assert r.exit_code == 0 and "compiling the simulator's core" not in r.stderr
