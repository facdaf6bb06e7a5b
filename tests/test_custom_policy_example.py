"""The custom-policy example of docs/policies.md, run as a user runs it: the block between its
markers is written to `my_policies.py` and loaded by `rlsim simulate --policy
my_policies:DropSlowest`, so a change to the policy protocol cannot break the example unseen. The
page's own command runs as written (the bundled trace, 64 GPUs, async scheduling), where a
prompt's last sample sometimes finishes before its abort reaches the engine; a small setup checks
the counts exactly."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

from doctables.doc_commands import example

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "policies.md"


def _example(tmp_path: Path) -> None:
    code = example(PAGE, "custom_policy")
    assert code, "docs/policies.md has no custom_policy example"
    (tmp_path / "my_policies.py").write_text(code)


def test_the_pages_command_runs_as_written(tmp_path: Path) -> None:
    _example(tmp_path)
    command = re.search(r"<!-- end example: custom_policy -->\n\n```bash\n(.*?)\n```", PAGE.read_text(), re.S)
    assert command and command.group(1).startswith("PYTHONPATH=. rlsim simulate --policy my_policies:DropSlowest")
    shutil.copytree(REPO / "traces", tmp_path / "traces")  # the default trace, where a fresh clone has it
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(["bash", "-c", command.group(1)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    req = pd.read_parquet(tmp_path / "runs" / "drop_slowest" / "requests.parquet")
    trained = req.trained_step.notna() & (req.trained_step >= 0)
    assert list(trained.groupby(req.step).sum()) == [512 * 15] * 4
    assert list((~trained).groupby(req.step).sum()) == [512] * 4  # each prompt's last sample
    late = (~trained & (req.outcome == "finished")).sum()
    assert late > 0  # some finished before their abort landed, and were not trained


def test_the_documented_custom_policy_runs_and_trains_r0_minus_one_samples(tmp_path: Path) -> None:
    _example(tmp_path)
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
