"""Docs/planning.md's `rlsim plan` example, as Markdown: its answer and its Pareto front.

    python -m doctables.plan_table [--markdown | --readme]

Runs docs/planning.md's first `rlsim plan` command (the bundled trace, DAPO's batch, the Qwen2.5-32B
H100 family at TP 4 and 8, 16-64 GPUs colocated or disaggregated, four policies; about two
minutes on a 2-core machine) with `--json --no-cache`, and prints its answer table and its
Pareto front (`rlsim.plan.report`, the rows the command prints) as the table of docs/planning.md
`plan_example`; `--readme` also writes it into README.md. The search is deterministic (seeded),
so `tests/test_readme_tables.py` re-runs it among the checks too long for CI (`.ci/long`) and holds
docs/planning.md's table equal to it.

Then docs/planning.md's asynchronous example (`plan_async`: one_step_off, fully_async and areal on
disaggregated splits of 32 or 64 GPUs, four staleness bounds; about two and a half minutes), with
the best answer's whole epoch simulated under the plan's first seed beside the plan's estimate.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rlsim.package_data.markers import emit
from rlsim.plan.report import answer_rows, band_lines, pareto_rows

COMMAND = ["plan", "--gpu-budget", "64", "--gpus", "16,32,64", "--placement", "colocated,disaggregated",
           "--train-share", "0.25,0.5", "--tp", "4,8", "--policies",
           "sync,one_step_off,rollpacker,async_partial"]  # fmt: skip
ASYNC_COMMAND = ["plan", "--gpu-budget", "64", "--gpus", "32,64", "--placement", "disaggregated", "--train-share",
                 "0.25,0.5", "--policies", "one_step_off,fully_async,areal", "--staleness", "0.1,0.5,1,2", "--steps",
                 "8", "--min-steps", "4", "--seeds", "2"]  # fmt: skip


def markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def plan(command: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "rlsim.cli", *command, "--json", "--no-cache"], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    if out.returncode:
        print(out.stderr, file=sys.stderr)
        raise SystemExit(out.returncode)
    return json.loads(out.stdout)


def whole_epoch_hours(best: dict) -> float:
    """The answer's first epoch simulated whole, under the plan's first seed (RLConfig's default)."""
    from rlsim.config import ClusterConfig, RLConfig
    from rlsim.paths import default_trace
    from rlsim.sim.simulate import simulate
    from rlsim.trace.format import load

    cluster = ClusterConfig(num_gpus=best["num_gpus"], profile=best["profile"], placement=best["placement"],
                            train_gpus=best["train_gpus"])  # fmt: skip
    rl = RLConfig(prompts_per_step=512, samples_per_prompt=16, epochs=1, max_response_len=best["max_response_len"])
    return simulate(load(default_trace()), best["policy"], cluster, rl, tables=False).summary["total_time_s"] / 3600


def main() -> int:
    res = plan(COMMAND)
    lines = markdown(["policy", "configuration", "cap", "clipped", "epoch (h)", "GPU-h / epoch", "rank", "meets"],
                     answer_rows(res))  # fmt: skip
    lines += ["", *band_lines(res)]
    lines += ["", f"{res['num_candidates']} candidates, {res['simulated']} simulations; the Pareto front of "
              "epoch time against GPU-hours over every candidate simulated (each at its last round's steps):",
              ""]  # fmt: skip
    lines += markdown(["policy", "configuration", "cap", "epoch (h)", "GPU-h / epoch", "steps"], pareto_rows(res))
    tables = {"plan_example": "\n".join(lines)}
    res = plan(ASYNC_COMMAND)
    best = res["best"]
    whole, estimate = whole_epoch_hours(best), best["epoch_hours_by_seed"][0]
    lines = markdown(["policy", "configuration", "cap", "clipped", "epoch (h)", "GPU-h / epoch", "rank", "meets"],
                     answer_rows(res))  # fmt: skip
    lines += ["", *band_lines(res)]
    lines += ["", f"{res['num_candidates']} candidates, {res['simulated']} simulations. The best answer's whole "
              f"epoch simulated (seed {res['seeds'][0]}): {whole:.2f} h, against the plan's {estimate:.2f} h "
              f"estimate from {res['rungs'][-1]} steps' worth of prompts ({estimate / whole - 1:+.1%})."]  # fmt: skip
    tables["plan_async"] = "\n".join(lines)
    for name, table in tables.items():
        if "--markdown" in sys.argv or "--readme" in sys.argv:
            emit(name, table, sys.argv)
        else:
            print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
