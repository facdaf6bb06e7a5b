"""The README's `rlsim plan` example, as Markdown: its answer and its Pareto front.

    python benchmarks/plan_table.py [--markdown | --readme]

Runs the README's first `rlsim plan` command (the bundled trace, DAPO's batch, the Qwen2.5-32B
H100 family at TP 4 and 8, 16-64 GPUs colocated or disaggregated, four policies; about two
minutes on a 2-core machine) with `--json --no-cache`, and prints its answer table and its
Pareto front (`rlsim.plan.report`, the rows the command prints) as the README table
`plan_example`; `--readme` also writes it into README.md. The search is deterministic (seeded),
so `tests/test_readme_tables.py` re-runs it in CI and holds the README's table equal to it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from readme_tables import emit

from rlsim.plan.report import answer_rows, pareto_rows

COMMAND = ["plan", "--gpu-budget", "64", "--gpus", "16,32,64", "--placement", "colocated,disaggregated",
           "--train-share", "0.25,0.5", "--tp", "4,8", "--policies",
           "sync,one_step_off,rollpacker,async_partial"]  # fmt: skip


def markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def main() -> int:
    out = subprocess.run([sys.executable, "-m", "rlsim.cli", *COMMAND, "--json", "--no-cache"], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    if out.returncode:
        print(out.stderr, file=sys.stderr)
        return out.returncode
    res = json.loads(out.stdout)
    lines = markdown(["policy", "configuration", "cap", "clipped", "epoch (h)", "GPU-h / epoch", "rank", "meets"],
                     answer_rows(res))  # fmt: skip
    lines += ["", f"{res['num_candidates']} candidates, {res['simulated']} simulations; the Pareto front of "
              "epoch time against GPU-hours over every candidate simulated (each at its last round's steps):",
              ""]  # fmt: skip
    lines += markdown(["policy", "configuration", "cap", "epoch (h)", "GPU-h / epoch", "steps"], pareto_rows(res))
    table = "\n".join(lines)
    if "--markdown" in sys.argv or "--readme" in sys.argv:
        emit("plan_example", table, sys.argv)
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
