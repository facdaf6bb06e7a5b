"""What training frameworks do around the FLOPs (rlsim.framework_costs), each formula held to its
hand computation, and the settings' path from `--trainer` through the profile to the step."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from rlsim import framework_costs as fc
from rlsim.cli.app import app
from rlsim.config import EngineConfig
from rlsim.derive.derive import derive_profile, setup
from rlsim.derive.train import Trainer
from rlsim.errors import RlsimError
from rlsim.framework_costs import FrameworkSettings
from rlsim.profile import profile_from_dict
from rlsim.step_costs import micro_batches_of, offload_costs, optimizer_s, step_cost, with_engine


def _profile(model: str = "qwen3-32b", gpu: str = "h100", trainer: Trainer | None = None):  # noqa: ANN202
    return profile_from_dict(derive_profile(setup(model, gpu, 4), trainer=trainer or Trainer("megatron", tp=4)))


LENS = np.full(256, 2048.0)


def _megatron(pp: int = 1, **framework) -> Trainer:  # noqa: ANN003 - FrameworkSettings' fields
    return Trainer("megatron", tp=4, pp=pp, framework=FrameworkSettings(**framework))


def test_full_recompute_adds_one_forward_to_the_update_and_selective_its_attention() -> None:
    base = _profile()
    plain = step_cost(base, LENS, 32, False, False)
    fwd = plain.old_log_prob
    fixed = base.train.fixed_s + optimizer_s(base, 32)  # the AdamW step, whatever the recompute
    full = step_cost(_profile(trainer=_megatron(recompute="full")), LENS, 32, False, False)
    assert full.update_actor - fixed == pytest.approx(4 * fwd)
    assert plain.update_actor - fixed == pytest.approx(3 * fwd)
    half = _profile(trainer=_megatron(recompute="full", recompute_layers=32))  # of 64 layers
    assert step_cost(half, LENS, 32, False, False).update_actor - fixed == pytest.approx(3.5 * fwd)
    sel = step_cost(_profile(trainer=_megatron(recompute="selective")), LENS, 32, False, False)
    mf = base.model_facts
    flops = 2 * mf["num_active_params"] * 2048 + 2 * mf["num_layers"] * mf["hidden_size"] * 2048**2
    share = 2 * mf["num_layers"] * mf["hidden_size"] * 2048**2 / flops
    assert sel.update_actor - fixed == pytest.approx((3 + share) * fwd)
    assert full.old_log_prob == plain.old_log_prob  # a forward-only pass recomputes nothing


def test_the_optimizer_step_reads_and_writes_each_gpus_shard_at_hbm_bandwidth() -> None:
    """AdamW on Qwen3-32B, Megatron TP 4 on 32 H100s (8 data-parallel ranks): each GPU's optimizer
    shard of N / 4 / 8 parameters at 28 bytes a parameter over 3.35 TB/s, about 8.6 ms; what
    Megatron's CPU optimizer steps leaves the GPU, where veRL's FSDP offload steps it on the GPU."""
    p = _profile()
    n = p.model_facts["num_params"]
    assert p.train.fixed_s == 0  # a derived profile states no other fixed cost per update
    assert optimizer_s(p, 32) == pytest.approx(n / 4 / 8 * 28 / 3.35e12)
    assert 5e-3 < optimizer_s(p, 32) < 1.5e-2
    shard = fc.shards(p.model_facts, 4, 1, 1, 8)
    assert fc.optimizer_step_s(shard, 3.35e12, offloaded=0.25) == pytest.approx(0.75 * optimizer_s(p, 32))
    assert fc.optimizer_step_s(shard, 3.35e12, offloaded=1.0) == 0
    assert fc.optimizer_step_s(shard, 3.35e12, offloaded=1.0, fsdp=True) == pytest.approx(optimizer_s(p, 32))
    assert optimizer_s(p, 64) == pytest.approx(optimizer_s(p, 32) / 2)


def test_each_optimizer_step_of_an_update_pays_adamw_and_its_offload() -> None:
    """An update of n mini-batches makes n AdamW steps (NeMo RL's samples / train_global_batch_size,
    veRL's train_batch_size / ppo_mini_batch_size x ppo_epochs), each with its gradient and
    optimizer offload traffic; the parameters' offload is paid once a pass, and nothing else moves."""
    offload = {"grad_offload": True, "optimizer_offload_fraction": 0.5, "param_offload": True}
    one = _profile(trainer=_megatron(**offload))
    four = _profile(trainer=_megatron(optimizer_steps=4, **offload))
    a, b = step_cost(one, LENS, 32, False, False), step_cost(four, LENS, 32, False, False)
    off = offload_costs(one, 32)
    assert off["grads"] > 0 and off["optimizer"] > 0 and off["params"] > 0
    per_step = optimizer_s(one, 32) + off["grads"] + off["optimizer"]
    assert b.update_actor - a.update_actor == pytest.approx(3 * per_step)
    assert b.old_log_prob == a.old_log_prob
    with pytest.raises(RlsimError, match="optimizer_steps"):
        FrameworkSettings(optimizer_steps=0)
    assert Trainer.parse("megatron(tp=4,optimizer_steps=4)").framework.optimizer_steps == 4


def test_virtual_stages_shrink_the_pipeline_bubble() -> None:
    assert fc.bubble_factor(8, 4) == pytest.approx(11 / 8)
    assert fc.bubble_factor(8, 4, vpp=3) == pytest.approx((8 + 1) / 8)
    deep = Trainer("megatron", tp=4, pp=4)
    plain = step_cost(_profile(trainer=deep), LENS, 32, False, False)
    inter = step_cost(
        _profile(trainer=dataclasses.replace(deep, framework=FrameworkSettings(vpp=2))), LENS, 32, False, False
    )
    # 256 x 2048 tokens over dp = 2 ranks: 262,144 tokens a rank, 16 micro-batches of 16,384
    assert inter.old_log_prob / plain.old_log_prob == pytest.approx((16 + 1.5) / (16 + 3))


def test_dynamic_batch_size_packs_micro_batches_to_its_token_budget() -> None:
    lens = np.array([3000, 3000, 3000, 1000, 500])
    assert fc.micro_batch_count(lens, 4096, 0) == 4 == len(fc.micro_batches(lens, 4096))
    assert fc.micro_batch_count(lens, 0, 2) == 3
    p = _profile(trainer=_megatron(4, max_token_len=8192, log_prob_max_token_len=32768))
    # dp = 32 / 16 = 2: a rank holds 128 samples of 2,048 tokens: 4 a micro-batch of 8,192, 16 of 32,768
    assert micro_batches_of(p, LENS, 32) == 32
    assert micro_batches_of(p, LENS, 32, forward_only=True) == 8
    cost = step_cost(p, LENS, 32, False, False)
    # the update's 32 micro-batches fill PP 4 better than the log-prob pass's 8: (32 + 3) / 32 against (8 + 3) / 8
    forward = (cost.update_actor - optimizer_s(p, 32)) / 3
    assert forward / cost.old_log_prob == pytest.approx((35 / 32) / (11 / 8))
    with pytest.raises(RlsimError, match="max_token_len must be >= 0"):
        Trainer("megatron", framework=FrameworkSettings(max_token_len=-1))


def test_offload_moves_bytes_over_the_gpus_host_link_and_steps_adam_on_the_host() -> None:
    """Qwen3-32B, Megatron TP 4 on 32 H100s (dp 8): a rank's shard is 1/4 of the weights, its
    optimizer shard 1/32. The hybrid CPU optimizer at fraction 1 sends fp32 gradients down and
    bf16 parameters back over PCIe Gen5 (64 GB/s a direction) and runs Adam at the rank's share
    of DGX H100's host memory (76.8 GB/s): 28 bytes a parameter."""
    tr = _megatron(optimizer_offload_fraction=1.0, param_offload=True, grad_offload=True)
    p = _profile(trainer=tr)
    n = p.model_facts["num_params"]
    off = offload_costs(p, 32)
    assert off["params"] == pytest.approx(2 * n / 4 * 2 / 64e9)
    assert off["grads"] == pytest.approx(2 * n / 4 * 4 / 64e9)
    assert off["optimizer"] == pytest.approx(n / 32 * 6 / 64e9 + n / 32 * 28 / 76.8e9)
    plain = step_cost(_profile(), LENS, 32, False, False)
    cost = step_cost(p, LENS, 32, False, False)
    assert cost.old_log_prob == pytest.approx(plain.old_log_prob + off["params"])
    moved = off["params"] + off["grads"] + off["optimizer"]
    # the host steps the whole shard, so the GPU's AdamW step is gone from the update
    assert cost.update_actor == pytest.approx(plain.update_actor - optimizer_s(plain_p := _profile(), 32) + moved)
    assert optimizer_s(p, 32) == 0 < optimizer_s(plain_p, 32)
    # GB200's NVLink-C2C (225 GB/s a direction) and Grace's memory make the same offload cheaper
    gb = offload_costs(profile_from_dict(derive_profile(setup("qwen3-32b", "gb200", 4), trainer=tr)), 32)
    assert gb["params"] == pytest.approx(off["params"] * 64 / 225)
    assert gb["optimizer"] < off["optimizer"] / 3
    # veRL's FSDP moves its two fp32 moments instead of stepping on the host; its parameters are fp32
    fsdp = profile_from_dict(
        derive_profile(
            setup("qwen3-32b", "h100", 4),
            trainer=Trainer(framework=FrameworkSettings(optimizer_offload_fraction=1.0, param_offload=True)),
        )
    )
    got = offload_costs(fsdp, 32)
    assert got["optimizer"] == pytest.approx(2 * n / 32 * 8 / 64e9)
    assert got["params"] == pytest.approx(2 * n / 32 * 4 / 64e9)


def test_the_reference_models_offload_is_paid_on_its_pass_only() -> None:
    tr = _megatron(ref_offload=True)
    p = _profile(trainer=tr)
    plain = step_cost(_profile(), LENS, 32, True, False)
    cost = step_cost(p, LENS, 32, True, False)
    assert cost.ref - plain.ref == pytest.approx(p.model_facts["num_params"] / 4 * 2 / 64e9)
    assert (cost.old_log_prob, cost.update_actor) == (plain.old_log_prob, plain.update_actor)


def test_expert_gemms_with_few_tokens_pay_for_reading_their_weights() -> None:
    """Qwen3-30B-A3B, EP 8: 16 local experts of 4.7M parameters (151 MB in bf16) a layer take 45 us
    to read on an H100, whatever the tokens; a micro-batch of one short sample computes less."""
    mf = _profile("qwen3-30b-a3b").model_facts
    rate = 989e12 * 0.47
    few = fc.expert_floor_s(mf, 64, 1, ep=8, pp=1, hbm=3.35e12, flop_rate=rate)
    read = 16 * mf["expert_params"] * 2 / 3.35e12
    assert few == pytest.approx(mf["moe_layers"] * (read - 2 * 64 * 8 * mf["expert_params"] / rate))
    assert fc.expert_floor_s(mf, 16384, 1, ep=8, pp=1, hbm=3.35e12, flop_rate=rate) == 0.0
    dense = _profile().model_facts
    assert fc.expert_floor_s(dense, 64, 1, ep=1, pp=1, hbm=3.35e12, flop_rate=rate) == 0.0


def test_framework_settings_travel_from_the_command_line_to_the_profile(tmp_path) -> None:  # noqa: ANN001
    """A `--trainer` setting lands in the profile's train block and back; the defaults leave the
    block as before (no new keys), and a bad setting is one sentence."""
    out = tmp_path / "p.json"
    args = ["profile", "derive", "--model", "qwen3-32b", "--gpu", "h100", "--tp", "4", "-o", str(out)]
    r = CliRunner().invoke(app, [*args, "--trainer", "megatron(tp=4,pp=2,vpp=2,recompute=full,ref_offload=true)"])
    assert r.exit_code == 0, r.output
    train = json.loads(out.read_text())["train"]
    assert (train["recompute"], train["vpp"], train["ref_offload"]) == ("full", 2, True)
    back = profile_from_dict(json.loads(out.read_text()))
    written = back.to_dict()["train"]  # what loads back writes back (a default layout field left out)
    assert all(written.get(k, v) == v for k, v in train.items()) and written["recompute"] == "full"
    plain = derive_profile(setup("qwen3-32b", "h100", 4), trainer=Trainer("megatron", tp=4))["train"]
    assert not set(plain) & {f.name for f in dataclasses.fields(FrameworkSettings)}
    for bad, message in (("megatron(recompute=most)", "recompute must be one of"),
                         ("megatron(vpp=2)", "needs pp > 1"),
                         ("megatron(param_offload=maybe)", "must be true or false")):  # fmt: skip
        r = CliRunner().invoke(app, [*args[:-2], "--trainer", bad])
        assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.output, r.output
    raw = json.loads(out.read_text())
    raw["train"]["recompute"] = 3
    with pytest.raises(RlsimError, match="recompute must be text"):
        profile_from_dict(raw)


def test_eager_mode_adds_a_launch_cost_per_layer_to_every_iteration(small_trace_path, tmp_path) -> None:  # noqa: ANN001
    """vLLM's `enforce_eager` (CUDA graphs off): 46.9 us per layer per iteration, vLLM's own
    measurement (pull 1440: 0.15 s over 100 tokens of Llama 2 7B's 32 layers); Qwen3-8B's 36
    layers add 1.69 ms to every iteration, a calibrated profile (no model facts) nothing, and a
    simulated step is longer."""
    p = profile_from_dict(derive_profile(setup("qwen3-8b", "h100", 1)))
    eager = with_engine(p, EngineConfig(enforce_eager=True))
    assert eager.t_w_s - p.t_w_s == pytest.approx(36 * 0.15 / 100 / 32)
    assert with_engine(p, EngineConfig(enforce_eager=False)).t_w_s == p.t_w_s
    calibrated = dataclasses.replace(p, model_facts={})  # as `rlsim calibrate` writes one: costs measured whole
    assert with_engine(calibrated, EngineConfig(enforce_eager=True)).t_w_s == calibrated.t_w_s
    args = ["simulate", "--trace", str(small_trace_path), "--model", "qwen3-8b", "--gpu", "h100", "--gpus", "8",
            "--max-steps", "1", "--json"]  # fmt: skip
    times = []
    for flag in ("--no-enforce-eager", "--enforce-eager"):
        r = CliRunner().invoke(app, [*args, flag, "--out", str(tmp_path / flag)])
        assert r.exit_code == 0, r.output
        times.append(json.loads(r.stdout)["total_time_s"])
    assert times[1] > times[0]
