"""`rlsim calibrate ops` on this CPU end to end: operator timings at a model's shapes, records
that `rlsim calibrate fit` turns into a profile, and bad input in one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.optional import need

from .conftest import run_python

need("torch", "rlsim calibrate ops needs torch")

# Qwen2.5's layout (grouped-query attention, SwiGLU MLP) at a size a CPU times in seconds
TINY = {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1024}  # fmt: skip


def test_operator_timings_become_a_profile(tmp_path: Path) -> None:
    model = tmp_path / "tiny-qwen"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY))
    rec = tmp_path / "records"
    run_python("-m", "rlsim.cli", "calibrate", "ops", "--model", str(model), "--out", str(rec), "--repeats", "7",
               "--batch-sizes", "1,2,4,8,16,32", "--context-lens", "64,256,1024",
               "--prefill-lens", "64,128,256")  # fmt: skip
    facts = json.loads((rec / "facts.json").read_text())
    assert facts["source"] == "rlsim calibrate ops" and facts["model"] == "tiny-qwen" and facts["vllm_version"] is None
    assert facts["kv_capacity_tokens"] > 0 and facts["allreduce"] == "none (TP 1)"
    its = pd.read_parquet(rec / "iterations.parquet")
    assert len(its) == 6 * 3 + 3 and (its["step_s"] > 0).all()
    parts = its["linear_s"] + its["attention_s"] + its["allreduce_s"] + its["lm_head_sampler_s"]
    assert (parts - its["step_s"]).abs().max() < 1e-12  # an iteration is the sum of its operators
    decode = its[its["num_ctx_tokens"] == 0]
    per_seq = decode["context_tokens"] / decode["num_generation_requests"]
    assert (
        set(per_seq) == {64, 256, 1024} and (decode["num_generation_tokens"] == decode["num_generation_requests"]).all()
    )
    assert json.loads((rec / "train.json").read_text())["achieved_flops_per_device"] > 0
    out = tmp_path / "profile.json"
    # A CPU's timings of a model this small are noisy: the fit's own MAPE gate is not what is tested.
    proc = run_python("-m", "rlsim.cli", "calibrate", "fit", str(rec), "-o", str(out), "--force")
    assert "held-out MAPE" in proc.stdout
    prof = json.loads(out.read_text())
    assert (
        prof["t_w_s"] > 0
        and prof["prefill_s_per_token"] > 0
        and prof["kv_capacity_tokens"] == facts["kv_capacity_tokens"]
    )
    sim = run_python("-m", "rlsim.cli", "profile", "show", str(out))
    assert "no roofline" in sim.stdout  # a CPU profile states no HBM bandwidth


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--model", "/nonexistent"], "does not exist or holds no config.json"),
     (["--model", "CFG", "--batch-sizes", "4,x"], "expected comma-separated positive integers"),
     (["--model", "BAD"], "lacks a positive integer 'hidden_size'"),
     (["--model", "CFG", "--tp", "3"], "TP 3 does not divide the model's heads")],
)  # fmt: skip
def test_bad_input_is_one_sentence(tmp_path: Path, args: list[str], message: str) -> None:
    cfg, bad = tmp_path / "cfg", tmp_path / "bad"
    cfg.mkdir()
    bad.mkdir()
    (cfg / "config.json").write_text(json.dumps(TINY))
    (bad / "config.json").write_text(json.dumps({k: v for k, v in TINY.items() if k != "hidden_size"}))
    args = [str(cfg) if a == "CFG" else str(bad) if a == "BAD" else a for a in args]
    proc = run_python("-m", "rlsim.cli", "calibrate", "ops", *args, "--out", str(tmp_path / "r"), check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_tensor_parallel_all_reduce_is_timed_under_torchrun(tmp_path: Path) -> None:
    """Two ranks (gloo on a CPU, NCCL on GPUs): the all-reduce is measured and charged twice a layer."""
    model = tmp_path / "tiny-qwen"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY))
    rec = tmp_path / "records"
    run_python("-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "rlsim.cli", "calibrate", "ops", "--model",
               str(model),
               "--out", str(rec), "--repeats", "3", "--batch-sizes", "1,8", "--context-lens", "64",
               "--prefill-lens", "64")  # fmt: skip
    facts = json.loads((rec / "facts.json").read_text())
    assert facts["tensor_parallel_size"] == 2 and facts["allreduce"] == "measured"
    assert (pd.read_parquet(rec / "iterations.parquet")["allreduce_s"] > 0).all()
