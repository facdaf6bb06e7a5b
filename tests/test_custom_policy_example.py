"""The custom-policy example of docs/policies.md, run as a user runs it: the block between its markers is
written to `my_policies.py` and loaded by `rlsim simulate --policy my_policies:DropSlowest`, so a
change to the policy protocol cannot break the example unseen."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

PAGE = Path(__file__).resolve().parents[1] / "docs" / "policies.md"


def test_the_documented_custom_policy_runs_and_trains_r0_minus_one_samples(tmp_path: Path) -> None:
    pattern = r"<!-- example: custom_policy -->\n```python\n(.*?)```\n<!-- end example"
    block = re.search(pattern, PAGE.read_text(), re.S)
    assert block, "docs/policies.md has no custom_policy example"
    (tmp_path / "my_policies.py").write_text(block.group(1))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "rlsim.cli", "simulate", "--policy", "my_policies:DropSlowest", "--max-steps", "3",
           "--gpus", "8", "--profile", "h100-qwen2.5-7b-tp1", "--prompts-per-step", "32", "--samples-per-prompt", "8",
           "-o", str(out)]  # fmt: skip
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    req = pd.read_parquet(out / "requests.parquet")
    trained = req[req.trained_step.notna() & (req.trained_step >= 0)].groupby("step").size()
    assert list(trained) == [32 * 7] * 3
    assert (req.outcome == "aborted").groupby(req.step).sum().eq(32).all()  # each prompt's last sample
