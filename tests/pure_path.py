"""Running tests again on the compiled core's pure-Python path (`RLSIM_PURE_PYTHON=1`): the same
source the compiler runs, run as plain Python, must pass the same checks."""

from __future__ import annotations

import os
import subprocess
import sys


def run_pure(*node_ids: str) -> str:
    """Run these tests (pytest node ids) in a fresh process on the pure path; fail with its output
    unless they all pass. Returns pytest's output."""
    env = {**os.environ, "RLSIM_PURE_PYTHON": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *node_ids],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout
