"""The pieces of `rlsim validate` that need no vLLM: the host-load meter, the decomposition's
parts on hand-made tables, and the veRL-metrics path on a log written in veRL's formats."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rlsim.hostload import LoadMeter, describe, speed_probe
from rlsim.profile import load_profile
from rlsim.real.validate_parts import finish_order, iteration_model_part, load_part, predicted_s

from .conftest import REPO, run_python

POLYTRACE = REPO / "tests" / "data" / "polytrace_verl_dapo_qwen2.5"
BUSY = "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass\n"


@pytest.mark.serial  # it needs a spare core to see another's busy process: no parallel neighbour
@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc")
def test_load_meter_counts_other_processes_not_this_tree() -> None:
    """A busy child is this process tree's own work; a busy process outside the tree (a
    double fork, re-parented away) is another's, about one CPU."""
    meter = LoadMeter()
    time.sleep(1.5)
    before = meter.read()["host/others_cpus"]  # whatever else this machine runs meanwhile
    child = subprocess.Popen([sys.executable, "-c", BUSY])
    child.wait()
    own = meter.read()
    assert own["host/others_cpus"] < before + 0.5, (before, own)
    # double fork: the grandchild outlives its parent, so it is not our descendant
    spawn = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {BUSY!r}])"
    subprocess.run([sys.executable, "-c", spawn], check=True)
    time.sleep(1.4)
    other = meter.read()
    assert other["host/others_cpus"] > before + 0.5, (before, other)
    assert "others used" in describe(other) and describe(None) == "not recorded"
    assert speed_probe(3) > 0


def _iterations(prof, scale: float) -> pd.DataFrame:  # noqa: ANN001
    rng = np.random.default_rng(0)
    n = 400
    its = pd.DataFrame(
        {
            "num_generation_requests": rng.integers(1, 64, n),
            "num_ctx_requests": np.zeros(n, int),
            "num_ctx_tokens": np.zeros(n, int),
            "context_tokens": rng.integers(100, 20_000, n),
        }
    )
    its["num_generation_tokens"] = its["num_generation_requests"]
    its["wall_s"] = predicted_s(prof, its) * scale
    return its


def test_iteration_model_part_measures_a_known_gap() -> None:
    """Iterations 25% slower than the profile: MAPE 20%, summed -20%, the same in every batch
    bucket, and a rollout-time part that is the summed gap per instance and step."""
    prof = load_profile("h100-qwen2.5-7b-tp1")
    its = _iterations(prof, 1.25)
    real_m = {"rollout_time_s": float(its["wall_s"].sum()) / 2 / 4, "step_time_s": float(its["wall_s"].sum())}
    part = iteration_model_part(prof, its, 2, 4, real_m)
    assert part["mape"] == pytest.approx(0.2, abs=1e-4) and part["total_time_pct"] == pytest.approx(-20, abs=0.01)
    assert all(b["signed_pct"] == pytest.approx(-20, abs=0.01) for b in part["by_batch"].values())
    assert part["rollout_time_pct"] == pytest.approx(-20, abs=0.01)


def _requests(finish: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"request_id": range(len(finish)), "step": 0, "outcome": "finished", "finish_time": finish})


def test_finish_order_agreement() -> None:
    steps = pd.DataFrame({"step": [0], "time/start": [1.0]})
    sim_steps = pd.DataFrame({"step": [0], "time/start": [0.0]})
    same = finish_order(_requests([1.1, 1.2, 1.4]), _requests([0.1, 0.2, 0.41]), steps, sim_steps)
    assert same["kendall_tau"] == 1.0 and same["steps_same_order"] == "1/1" and same["matched_requests"] == 3
    assert same["finish_abs_diff_median_s"] == pytest.approx(0.0, abs=1e-9)
    swapped = finish_order(_requests([1.1, 1.2, 1.4]), _requests([0.2, 0.1, 0.4]), steps, sim_steps)
    assert swapped["kendall_tau"] < 1.0 and swapped["steps_same_order"] == "0/1"


def test_load_part_warns_when_the_machine_differs() -> None:
    prof = load_profile("h100-qwen2.5-7b-tp1")
    import dataclasses

    calibrated = dataclasses.replace(
        prof, provenance={"host_load": {"host/others_cpus": 0.0, "host/load_1m": 0.5, "host/probe_ms": 2.0}}
    )
    steps = pd.DataFrame({"host/others_cpus": [0.9, 1.1], "host/load_1m": [2.0, 2.2]})
    part = load_part(calibrated, steps, {"probes": [{"probe_ms": 2.4}, {"probe_ms": 2.6}]})
    assert part["run"]["host/others_cpus"] == pytest.approx(1.0)
    assert part["machine_pct"] == pytest.approx(100 * (2.0 / 2.5 - 1))
    assert "1.00 CPUs during the run" in part["warning"] and "25% slower" in part["warning"]
    quiet = load_part(calibrated, steps.assign(**{"host/others_cpus": 0.01}), {"probes": [{"probe_ms": 2.0}]})
    assert quiet["warning"] is None and quiet["machine_pct"] == 0
    assert "records no host load" in load_part(prof, steps, None)["warning"]


# ---- the veRL path ------------------------------------------------------------------------
def _verl_metrics(tmp_path: Path, scale: float, console: bool) -> Path:
    """The log's steps simulated on a shipped profile, written as veRL's file logger (or its
    console logger, inside other log lines) writes them, timings scaled by `scale`."""
    from rlsim.config import ClusterConfig, RLConfig
    from rlsim.sim.simulate import simulate
    from rlsim.trace.importers import import_logs

    trace = import_logs(POLYTRACE).trace
    params = trace.meta.source_params
    meta = trace.meta
    rl = RLConfig(
        prompts_per_step=params["prompts_per_step"], samples_per_prompt=meta.samples_per_prompt,
        max_response_len=meta.max_response_len, epochs=len(trace.epochs), max_steps=len(params["steps"]),
    )  # fmt: skip
    res = simulate(trace, "sync", ClusterConfig(num_gpus=8, profile="h100-qwen2.5-7b-tp1"), rl)
    lines = []
    for step, (_, row) in zip(params["steps"], res.steps.iterrows(), strict=True):
        data = {"timing_s/gen": row["timing_s/gen"] * scale, "timing_s/step": row["timing_s/step"] * scale,
                "response_length/mean": row["response_length/mean"], "actor/pg_loss": 0.1}  # fmt: skip
        if console:
            lines.append("(TaskRunner pid=1) INFO: something else")
            pairs = " - ".join(f"{k}:{v}" for k, v in data.items())
            lines.append(f"(TaskRunner pid=1) step:{step} - {pairs}")
        else:
            lines.append(json.dumps({"step": step, "data": data}))
    path = tmp_path / ("console.log" if console else "metrics.jsonl")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("console", [False, True])
def test_verl_metrics_against_the_simulation(tmp_path: Path, console: bool) -> None:
    """Metrics that are the simulation's own give 0%; timings 10% slower give -9.1% (the
    simulation is then 1/1.1 of them); the response length is the log's either way."""
    from rlsim.real.validate_verl import validate_verl

    for scale, want in ((1.0, 0.0), (1.1, 100 * (1 / 1.1 - 1))):
        res = validate_verl(_verl_metrics(tmp_path, scale, console), POLYTRACE, "h100-qwen2.5-7b-tp1", 8)
        rows = {r["metric"]: r for r in res["rows"]}
        assert res["steps"] == 6 and len(res["per_step"]) == 6
        assert rows["timing_s/gen"]["diff_pct"] == pytest.approx(want, abs=1e-6)
        assert rows["timing_s/step"]["diff_pct"] == pytest.approx(want, abs=1e-6)
        assert rows["response_length/mean"]["diff_pct"] == pytest.approx(0.0, abs=1e-6)


def test_verl_validate_cli_and_its_errors(tmp_path: Path) -> None:
    metrics = _verl_metrics(tmp_path, 1.0, False)
    base = ["-m", "rlsim.cli", "validate", "--verl-metrics", str(metrics), "--log", str(POLYTRACE)]
    out = run_python(*base, "--profile", "h100-qwen2.5-7b-tp1", "--gpus", "8").stdout
    assert "rollout time" in out and "+0.0%" in out
    cases = [
        (base + ["--profile", "h100-qwen2.5-7b-tp1"], "needs --gpus"),
        (["-m", "rlsim.cli", "validate"], "give a run directory"),
        (base + ["--profile", "h100-qwen2.5-7b-tp1", "--gpus", "8", str(tmp_path)], "not both"),
    ]
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"step": 99, "data": {"timing_s/gen": 1.0}}) + "\n")
    cases.append((["-m", "rlsim.cli", "validate", "--verl-metrics", str(other), "--log", str(POLYTRACE),
                   "--profile", "h100-qwen2.5-7b-tp1", "--gpus", "8"], "share no step"))  # fmt: skip
    nogen = tmp_path / "nogen.jsonl"
    nogen.write_text(json.dumps({"step": 0, "data": {"actor/pg_loss": 1.0}}) + "\n")
    cases.append((["-m", "rlsim.cli", "validate", "--verl-metrics", str(nogen), "--log", str(POLYTRACE),
                   "--profile", "h100-qwen2.5-7b-tp1", "--gpus", "8"], "no 'timing_s/gen'"))  # fmt: skip
    for args, msg in cases:
        proc = run_python(*args, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert msg in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
