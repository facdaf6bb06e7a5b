"""Prediction on this machine: a profile calibrated before the runs, real runs at engine defaults.

    python benchmarks/predict_real.py [--out DIR] [--policies sync,rollpacker,sortedrl] [--repeats 3]
        [--steps 8] [--record tests/data/recorded_runs] [--markdown | --readme]

What a new user does: calibrate once (`rlsim calibrate decode`, `rlsim calibrate train`,
`rlsim calibrate fit`), then run for real with that profile and the engine's defaults (prefix
caching on, no `--calibrate`, no `--no-enable-prefix-caching`), then `rlsim validate`. Unlike
`validate_real.py`, nothing is measured inside the runs: the simulated side knows only the profile
calibrated before them, so the error is a prediction's. Every policy runs `--repeats` times, in
rounds (each round runs every policy once, so a slow minute of the machine falls on all of them);
the table gives each run's rollout and step time Diff%, its parts (the driver's time between
iterations, the iteration model) and the machine's load, and per policy the median of its runs,
the figure the 10% band holds.

`--record DIR` copies the whole batch (records, trace, profile and every run) into
DIR/<date-time>/ with a manifest saying `"calibrate": "before"`; `tests/test_recorded_runs.py`
validates every run of it in CI and holds each policy's median rollout time within 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from validate_real import calibrate_tiny, relativize, sh

from rlsim.hostload import LoadMeter
from rlsim.package_data.markers import emit, machine_note

PREDICTION_BAND_PCT = 10.0  # the median of a policy's runs, rollout time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/predict-real"))
    ap.add_argument("--policies", default="sync,rollpacker,sortedrl")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--record", type=Path, default=None, help="copy the batch into this folder for the CI test")
    ap.add_argument("--markdown", action="store_true", help="print the table it writes")
    ap.add_argument("--readme", action="store_true", help="print the table and write it into its page")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model, trace, rec, prof = out / "tiny-llama", out / "tiny.parquet", out / "records", out / "profile.json"
    t0 = time.perf_counter()
    meter = LoadMeter()
    if rec.exists():  # calibrated afresh, never on top of an earlier batch's records
        shutil.rmtree(rec)
    calibrate_tiny(out)
    print(f"calibrated in {time.perf_counter() - t0:.0f} s", flush=True)
    policies = args.policies.split(",")
    runs: list[tuple[str, str, dict]] = []
    for k in range(args.repeats):
        for policy in policies:
            name = f"run-{policy}-{k + 1}"
            run = out / name
            if run.exists():
                shutil.rmtree(run)
            sh("-m", "rlsim.cli", "run", "--real", "--model", str(model), "--trace", str(trace), "--steps",
               str(args.steps), "--epochs", "2", "--policy", policy, "--profile", str(prof),
               "--out", str(run))  # fmt: skip
            res = json.loads(sh("-m", "rlsim.cli", "validate", str(run), "--json"))
            runs.append((policy, name, res))
            t = res["parts"]["total"]
            print(f"{name}: rollout {t['rollout_time_pct']:+.1f}%, step {t['step_time_pct']:+.1f}%", flush=True)
    body = table(runs, policies)
    if args.record is not None:
        record(out, args.record, [name for _, name, _ in runs], args)
    emit("predict_real", body + "\n\n" + machine_note(meter, "predict_real.py"), sys.argv)
    if not (args.markdown or args.readme):
        print(body)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


def table(runs: list[tuple[str, str, dict]], policies: list[str]) -> str:
    """Per run its figures; per policy the median of its runs' rollout and step time Diff%."""
    rows = ["| run | rollout time | step time | driver time between iterations | iteration model | "
            "others' CPUs: calibration / run |", "|---|---|---|---|---|---|"]  # fmt: skip
    for _, name, res in runs:
        p = res["parts"]
        c, r = p["load"]["calibration"] or {}, p["load"]["run"] or {}
        rows.append(f"| {name.removeprefix('run-')} | {p['total']['rollout_time_pct']:+.1f}% | "
                    f"{p['total']['step_time_pct']:+.1f}% | {p['schedule']['rollout_time_pct']:+.1f}% | "
                    f"{p['iteration_model']['rollout_time_pct']:+.1f}% | {c.get('host/others_cpus')} / "
                    f"{r.get('host/others_cpus')} |")  # fmt: skip
    med = ["| policy | runs | median rollout time | median step time |", "|---|---:|---:|---:|"]
    for policy in policies:
        mine = [res["parts"]["total"] for pol, _, res in runs if pol == policy]
        roll = statistics.median(t["rollout_time_pct"] for t in mine)
        step = statistics.median(t["step_time_pct"] for t in mine)
        med.append(f"| {policy} | {len(mine)} | **{roll:+.1f}%** | {step:+.1f}% |")
    return "\n".join(med) + "\n\n" + "\n".join(rows)


def record(out: Path, dest: Path, runs: list[str], args: argparse.Namespace) -> None:
    """The batch as committed test data: every run of it, whatever its figures."""
    batch = dest / time.strftime("%Y%m%d-%H%M%S")
    skip = shutil.ignore_patterns("vllm.log", "checkpoint.pkl", "*.png", "trace.json", "actor", "*.tmp")
    shutil.copytree(out / "records", batch / "records", ignore=skip)
    shutil.copy2(out / "tiny.parquet", batch / "tiny.parquet")
    shutil.copy2(out / "profile.json", batch / "profile.json")
    for run in runs:
        shutil.copytree(out / run, batch / run, ignore=skip)
    manifest = {
        "runs": runs, "steps": args.steps, "calibrate": "before", "repeats": args.repeats,
        "command": "python benchmarks/predict_real.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.uname().nodename}, {os.cpu_count()} CPUs", "load_average_after": os.getloadavg()[0],
    }  # fmt: skip
    (batch / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    relativize(batch, out)  # no absolute path of this machine in committed data
    print(f"recorded the batch in {batch}")


if __name__ == "__main__":
    main()
