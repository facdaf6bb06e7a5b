"""The same seed gives the same bytes: `rlsim compare --json` of a small, KV-tight configuration
against a committed golden file (wall time removed).

The configuration (16 GPUs as 8 TP 2 instances at `gpu_memory_utilization` 0.45, 64 prompts a
step, 4 steps, every default policy) preempts under every policy and pauses `async_partial`
mid-jump, so the file pins the scheduler, the event jumping, the policies and the step model at
once. It guards moves and refactors that must not change a number; a change that means to change
numbers regenerates the file with `python tests/test_golden_compare.py` and says why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden" / "compare_small.json"
ARGS = [
    "compare", "--gpus", "16", "--profile", "h100-qwen2.5-32b-tp2", "--gpu-memory-utilization", "0.45",
    "--prompts-per-step", "64", "--max-steps", "4", "--json",
]  # fmt: skip


def run_compare() -> str:
    """The canonical text of the comparison: sorted keys, wall time removed."""
    out = subprocess.run([sys.executable, "-m", "rlsim.cli", *ARGS], capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    for row in rows:
        row.pop("sim_wall_s")
    return json.dumps(rows, indent=1, sort_keys=True) + "\n"


def test_compare_matches_golden_bytes() -> None:
    text = run_compare()
    rows = json.loads(text)
    assert all(r["preemptions"] > 0 for r in rows), "the configuration must preempt under every policy"
    assert any(r["pause_interrupts"] > 0 for r in rows), "and interrupt a jump"
    assert text == GOLDEN.read_text()


if __name__ == "__main__":
    GOLDEN.write_text(run_compare())
