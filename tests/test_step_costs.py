"""The RL step beyond rollout (rlsim.step_costs) and KV capacity derived from model facts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.derive.derive import derive_profile, setup
from rlsim.derive.train import Trainer, published_mfu
from rlsim.errors import RlsimError
from rlsim.framework_costs import micro_batches
from rlsim.profile import TrainCost, load_profile, profile_from_dict
from rlsim.sim.simulate import simulate
from rlsim.step_costs import (
    check_layout,
    forward_flops,
    kv_capacity,
    optimizer_s,
    padded_tokens,
    step_cost,
    weight_sync_s,
    with_engine,
)
from rlsim.trace.synth import SynthConfig, synthesize


def test_weight_sync_crosses_the_scale_up_link_within_a_domain_and_scale_out_beyond() -> None:
    """The whole model's bf16 bytes over NVLink (900 GB/s) on one 8-GPU node, over the 50 GB/s
    per-GPU scale-out link on 16 GPUs, plus each tensor's resharding collective (35 us) either way;
    on a GB200 NVL72 rack 64 GPUs still exchange over NVLink."""
    p = load_profile("h100-qwen2.5-7b-tp1")
    weights, tensors = p.model_facts["num_params"] * 2, p.model_facts["num_tensors"] * 35e-6
    assert weight_sync_s(p, 8) == pytest.approx(weights / 900e9 + tensors)
    assert weight_sync_s(p, 16) == pytest.approx(weights / 50e9 + tensors)
    assert p.weight_sync_s == round(weight_sync_s(p, 1), 3)
    cost = step_cost(p, np.array([1000.0]), 8, False, False, gpus=16)
    assert cost.update_weights == pytest.approx(weight_sync_s(p, 16))
    gb200 = profile_from_dict(derive_profile(setup("qwen2.5-7b", "gb200", 1)))
    assert weight_sync_s(gb200, 64) == pytest.approx(weights / gb200.gpu_facts["nvlink_bytes_per_s"] + tensors)


def test_trainer_backends_default_to_their_published_mfu() -> None:
    """FSDP2: TorchTitan's 5,762 tokens/s per H100 for Llama 3.1 8B at 8K, under rlsim's count
    (6 N + 6 L d T FLOPs per token: 8.03e9 parameters, 32 layers, 4,096 hidden) of 989 TFLOP/s;
    Megatron: its README's 47%. --mfu overrides either."""
    per_token = 6 * 8.03e9 + 6 * 32 * 4096 * 8192
    assert published_mfu("fsdp2") == pytest.approx(5762 * per_token / 989e12, abs=2e-3)
    assert published_mfu("megatron") == 0.47
    raw = derive_profile(setup("qwen2.5-7b", "h100", 1), trainer=Trainer("megatron", tp=2, pp=2))
    assert (raw["train"]["mfu"], raw["train"]["backend"], raw["train"]["tp"]) == (0.47, "megatron", 2)
    assert derive_profile(setup("qwen2.5-7b", "h100", 1), trainer=Trainer(mfu=0.5))["train"]["mfu"] == 0.5
    with pytest.raises(RlsimError, match="need megatron"):
        Trainer("fsdp2", tp=2)


def test_the_training_layout_adds_its_traffic_and_bubble() -> None:
    """Megatron TP 2 adds 2 all-reduces per layer and pass over NVLink; PP 4 adds the bubble
    (m + 3) / m for m micro-batches of 16,384 tokens; EP adds the all-to-alls of an MoE model;
    a layout that does not divide the training GPUs is one sentence."""

    def cost(trainer: Trainer, model: str = "qwen2.5-7b", gpus: int = 8):  # noqa: ANN202
        p = profile_from_dict(derive_profile(setup(model, "h100", 2 if "a3b" in model else 1), trainer=trainer))
        return p, step_cost(p, np.full(64, 4096.0), gpus, False, False)

    p, base = cost(Trainer("megatron"))
    _, tp2 = cost(Trainer("megatron", tp=2))
    tokens = 64 * 4096 / 4  # a data-parallel replica's tokens (8 GPUs / TP 2 = 4 replicas)
    ring = 2 * 28 * 2 * 0.5 * tokens * 3584 * 2 / 900e9
    assert tp2.old_log_prob - base.old_log_prob == pytest.approx(ring)
    _, pp4 = cost(Trainer("megatron", pp=4))
    m = 64 * 4096 / 2 / 16384  # 2 replicas, 8 micro-batches each
    assert pp4.old_log_prob == pytest.approx(base.old_log_prob * (m + 3) / m)
    _, moe = cost(Trainer("megatron"), "qwen3-30b-a3b")
    _, moe_ep = cost(Trainer("megatron", ep=8), "qwen3-30b-a3b")
    assert moe_ep.old_log_prob > moe.old_log_prob
    with pytest.raises(RlsimError, match="does not divide the 6 training GPUs"):
        tp4 = derive_profile(setup("qwen2.5-7b", "h100", 1), trainer=Trainer("megatron", tp=4))
        check_layout(profile_from_dict(tp4), 6)
    with pytest.raises(RlsimError, match="dense model"):
        derive_profile(setup("qwen2.5-7b", "h100", 1), trainer=Trainer("megatron", ep=2))


def test_kv_capacity_follows_memory_utilisation() -> None:
    """(u x memory - weight shard) x TP / KV bytes per token: Qwen2.5-32B at TP 4 on 80 GB GPUs."""
    p = load_profile("h100-qwen2.5-32b-tp4")
    kv_token = 2 * 64 * 8 * 128 * 2
    params = p.model_facts["num_params"]  # 32.8B counted from the config (the model card rounds to 32.5B)
    assert params == pytest.approx(32.76e9, rel=1e-3)
    assert p.kv_capacity_tokens == int((0.5 * 80e9 - 2 * params / 4) * 4 / kv_token)  # veRL's default
    assert with_engine(p, EngineConfig(gpu_memory_utilization=0.8)).kv_capacity_tokens == kv_capacity(p, 0.8)
    assert kv_capacity(p, 0.8) > 2 * kv_capacity(p, 0.5)
    q = with_engine(p, EngineConfig(max_num_seqs=64, max_num_batched_tokens=4096))
    limits = (q.engine.max_num_seqs, q.engine.max_num_batched_tokens, q.kv_capacity_tokens)
    assert limits == (64, 4096, p.kv_capacity_tokens)


def test_training_phases_scale_with_tokens_and_context() -> None:
    """old_log_prob is one forward, the update three plus the fixed cost; ref only with KL on;
    attention makes one long sequence dearer than the same tokens in short ones."""
    p = load_profile("h100-qwen2.5-7b-tp1")
    lens = np.array([1000.0, 3000.0])
    off = step_cost(p, lens, 8, use_kl_loss=False, sleep=False)
    on = step_cost(p, lens, 8, use_kl_loss=True, sleep=True)
    assert off.ref == 0 and on.ref == pytest.approx(on.old_log_prob)
    assert off.update_actor == pytest.approx(p.train.fixed_s + optimizer_s(p, 8) + 3 * off.old_log_prob)
    assert 0 < optimizer_s(p, 8) < 0.05  # AdamW over an eighth of 7B at HBM bandwidth
    assert off.rollout_sleep == 0 and on.rollout_sleep == on.rollout_wake_up > 0
    assert forward_flops(p, np.array([4000.0])) > forward_flops(p, np.array([1000.0] * 4))


def test_steps_parquet_names_every_phase_as_verl_does() -> None:
    """Every cost appears in the step table; colocated steps pay sleep and wake, KL adds ref."""
    tr = synthesize(SynthConfig(num_prompts=32, samples_per_prompt=4, epochs=1))
    rl = RLConfig(prompts_per_step=16, samples_per_prompt=4, epochs=1)
    cl = ClusterConfig(num_gpus=8, profile="h100-qwen2.5-7b-tp1")
    st = simulate(tr, "sync", cl, rl).steps
    for col in ("old_log_prob", "ref", "update_actor", "update_weights", "rollout_sleep", "rollout_wake_up"):
        assert f"timing_s/{col}" in st.columns
    assert (st["timing_s/ref"] == 0).all() and (st["timing_s/rollout_sleep"] > 0).all()
    kl = simulate(tr, "sync", cl, dataclasses.replace(rl, use_kl_loss=True)).steps
    assert (kl["timing_s/ref"] > 0).all() and kl["timing_s/step"].sum() > st["timing_s/step"].sum()
    parts = [c for c in st.columns if c.startswith("timing_s/") and c not in ("timing_s/step", "timing_s/gen")]
    assert (st["timing_s/gen"] + st[parts].sum(axis=1)).to_numpy() == pytest.approx(st["timing_s/step"].to_numpy())


def test_per_sample_reward_time_from_the_trace() -> None:
    """A trace's reward_time_s column replaces the run's reward latency, sample by sample."""
    tr = synthesize(SynthConfig(num_prompts=16, samples_per_prompt=4, epochs=1))
    rl = RLConfig(prompts_per_step=16, samples_per_prompt=4, epochs=1, reward_latency_s=0.0)
    cl = ClusterConfig(num_gpus=8, profile="h100-qwen2.5-7b-tp1")
    base = simulate(tr, "sync", cl, rl).steps["timing_s/reward"].sum()
    tr.table["reward_time_s"] = np.float32(120.0)  # a slow sandbox: longer than the rollout tail
    slow = simulate(tr, "sync", cl, rl).steps["timing_s/reward"].sum()
    assert base == 0 and slow > 60


def _fitted(train: TrainCost):  # noqa: ANN202 - a Profile as rlsim.calibration.fit writes one (no model facts)
    base = load_profile("h100-qwen2.5-7b-tp1")
    return dataclasses.replace(base, train=train, model_facts={}, gpu_facts={}, weight_sync_s=0.25)


def test_a_fitted_profile_costs_each_training_phase_from_its_own_measurement() -> None:
    """rlsim calibrate train's fit: the forward without gradient (old log-probs, and the reference's
    with KL) and the update apart, per padded token; the measured weight update as it is."""
    train = TrainCost(6.0, 6.0 / 1e-4, 1.0, 0.5, forward_fixed_s=0.1, forward_s_per_token=2e-5,
                      padded_micro_batch_tokens=100)  # fmt: skip
    p = _fitted(train)
    lens = np.array([30.0, 50.0, 40.0, 60.0])  # micro-batches [30, 50] and [40, 60]: 2 x 50 + 2 x 60 padded
    assert micro_batches([30, 50, 40, 60], 100) == [[0, 1], [2, 3]]
    assert padded_tokens(lens, 100) == 220
    off = step_cost(p, lens, 2, use_kl_loss=False, sleep=False)
    on = step_cost(p, lens, 2, use_kl_loss=True, sleep=False)
    assert off.old_log_prob == pytest.approx(0.1 + 220 * 2e-5 / 2)
    assert off.update_actor == pytest.approx(0.5 + 220 * 1e-4 / 2)
    assert off.ref == 0 and on.ref == pytest.approx(off.old_log_prob) and off.update_weights == 0.25
    # unpadded (0): the sum of the lengths; a fit without the forward costs the stage as the update
    plain = step_cost(_fitted(dataclasses.replace(train, padded_micro_batch_tokens=0)), lens, 1, False, False)
    assert plain.update_actor == pytest.approx(0.5 + 180 * 1e-4)
    old = step_cost(_fitted(TrainCost(6.0, 6.0 / 1e-4, 1.0, 0.5)), lens, 1, False, False)
    assert old.old_log_prob == 0 and old.update_actor == pytest.approx(0.5 + 180 * 1e-4)


def test_the_fitted_forward_survives_a_profile_round_trip() -> None:
    train = TrainCost(6.0, 1e9, 1.0, 0.5, forward_fixed_s=0.1, forward_s_per_token=2e-5, padded_micro_batch_tokens=64)
    p = _fitted(train)
    assert profile_from_dict(p.to_dict(), "round trip").train == train
    raw = p.to_dict()
    raw["train"] = {k: v for k, v in raw["train"].items() if not k.startswith(("forward", "padded"))}
    assert not profile_from_dict(raw, "an older profile").train.measures_forward
