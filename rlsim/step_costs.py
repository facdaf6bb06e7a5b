"""The RL step beyond rollout, and the engine limits, derived from a profile's facts.

Training (veRL's phases, each a `timing_s/...` column of steps.parquet):
- `old_log_prob`: one forward pass over every trained sample (prompt + response) to recompute the
  behaviour log-probs; `ref`: another forward of the reference model, only when the KL term is on
  (DAPO drops it); `update_actor`: forward and backward, three forwards' worth of FLOPs, plus the
  profile's fixed per-step overhead.
- A forward over a sequence of T tokens costs `2 N T` FLOPs for the weights plus `2 L d T^2` for
  causal attention (QK^T and AV, 4 L d t at position t, summed over t); all at the profile's MFU
  of the training GPUs' peak. The MFU is its trainer backend's published figure
  (`rlsim.derive.train`), which holds the data-parallel traffic its run overlapped; the training
  layout adds what it does not (`layout_cost`): tensor parallelism's two all-reduces per layer
  and pass, expert parallelism's two all-to-alls per MoE layer and pass (experts folded over a
  pipeline stage's GPUs, as Megatron-Core does, each TP rank sending its sequence-parallel
  share), over the scale-up link when the group fits in one scale-up domain and the scale-out
  link otherwise, and the
  pipeline's bubble, `(m + pp - 1) / m` for m micro-batches of veRL's 16,384 tokens per stage.
  Context parallelism splits each sequence over its ranks; its ring exchange overlaps
  attention and is not charged.
- `update_weights`: the whole model's bytes over the link the exchange crosses (the scale-up
  link when the cluster's GPUs fit in one scale-up domain, the scale-out link otherwise), plus
  a cost per tensor (gathering, bucketing, the engines' load): `bytes / link +
  num_tensors * weight_sync_per_tensor_s`. Older profiles state one effective bandwidth instead
  (`weight_sync_bytes_per_s`).
- Colocated engines sleep through training (veRL's `free_cache_engine`): `rollout_sleep`
  offloads each rank's weight shard over the host link and frees the KV cache, `rollout_wake_up`
  loads it back; the KV is gone, so carried requests re-prefill.

A profile without `model_facts` (one calibrated on real hardware) falls back to its fitted
`train` block and its measured `weight_sync_s`, and has no sleep cost: `rlsim calibrate train` times
the trainer's forward pass without gradient (old log-probs; the reference's too, with KL) and
its update apart, so each phase has its own measured cost (per padded token when the profile
says its trainer pads micro-batches, as `rlsim.real.trainer` does: `padded_tokens`); an older fit
without the forward costs the whole training stage as `update_actor`.

Eager mode (`EngineConfig.enforce_eager`, vLLM's CUDA graphs off): each iteration pays a launch
cost per layer, 46.9 us (`eager_s`); a profile without model facts measured its engine as it ran
and takes no cost.

KV capacity (`kv_capacity`): vLLM gives the KV cache what `gpu_memory_utilization` of each GPU
leaves after the rank's weight shard: `(u * memory - weight_bytes / TP) * TP / kv_bytes_per_token`,
with `kv_bytes_per_token = 2 * layers * kv_heads * head_dim * dtype_bytes`. Activation and CUDA
graph memory are not subtracted, so this is an upper bound of what vLLM reports.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from rlsim import framework_costs, model_facts
from rlsim.config import EngineConfig
from rlsim.errors import RlsimError
from rlsim.framework_costs import micro_batches
from rlsim.profile import Profile
from rlsim.rollout_engines import resolve, rollout_engine


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds of each non-rollout phase of one RL step."""

    old_log_prob: float = 0.0
    ref: float = 0.0
    update_actor: float = 0.0
    update_weights: float = 0.0
    rollout_sleep: float = 0.0
    rollout_wake_up: float = 0.0

    @property
    def training(self) -> float:
        return self.old_log_prob + self.ref + self.update_actor

    def columns(self) -> dict[str, float]:
        return {f"timing_s/{f.name}": getattr(self, f.name) for f in dataclasses.fields(self)}


def weight_bytes(profile: Profile) -> float:
    mf = profile.model_facts
    return float(mf["num_params"]) * float(mf["dtype_bytes"])


def rank_weight_bytes(facts: dict, gpus: int, data_parallel_size: int = 1) -> float:
    """One GPU's share of the weights (`model_facts`): the whole over an instance's `gpus`, but
    with data-parallel attention the routed experts over all of the group's DP x `gpus` GPUs."""
    total = float(facts["num_params"]) * float(facts["dtype_bytes"])
    if data_parallel_size == 1:
        return total / gpus
    routed = float(facts["moe_layers"] * facts["num_experts"] * facts["expert_params"]) * float(facts["dtype_bytes"])
    return (total - routed) / gpus + routed / (gpus * data_parallel_size)


def weight_bytes_per_gpu(profile: Profile) -> float:
    """`rank_weight_bytes` of a profile."""
    return rank_weight_bytes(profile.model_facts, profile.instance_gpus, profile.data_parallel_size)


def kv_bytes_per_token(profile: Profile) -> float:
    return model_facts.kv_bytes_per_token(profile.model_facts)


def kv_capacity(profile: Profile, gpu_memory_utilization: float) -> int:
    """KV tokens one instance holds at this memory utilisation (see the module docstring); with
    pipeline stages each GPU holds its stage's layers, so a token's KV is spread over them too."""
    tp, pp = profile.tensor_parallel_size, profile.pipeline_parallel_size
    memory = float(profile.gpu_facts["memory_bytes"])
    per_gpu = weight_bytes_per_gpu(profile)
    free = gpu_memory_utilization * memory - per_gpu
    if free <= 0:
        where = f"TP{tp}" + (f" x PP{pp}" if pp > 1 else "")
        raise RlsimError(
            f"profile {profile.name}: the weights ({per_gpu / 1e9:.1f} GB per GPU at {where}) do "
            f"not fit in gpu_memory_utilization={gpu_memory_utilization} of {memory / 1e9:.0f} GB"
        )
    shards = model_facts.kv_shards(profile.model_facts, tp)  # MLA: every rank holds the whole latent
    return int(free * shards * pp / kv_bytes_per_token(profile))


def with_engine(profile: Profile, engine: EngineConfig) -> Profile:
    """The profile under this run's engine: `engine` laid over the profile's own (`None` keeps
    the profile's setting), the KV capacity re-derived for another `gpu_memory_utilization`.
    The result's `engine` is the one configuration every part of the run reads."""
    engine.check_settings_for_engine()
    merged = engine.over(profile.engine)
    # (a profile measured on such an engine holds the budget it ran with)
    unset = engine.max_num_batched_tokens is None and not rollout_engine(profile.rollout_engine).chunk_budget_by_gpu
    rules = rollout_engine(merged.rollout_engine)
    if rules.chunk_budget_by_gpu and unset:
        # SGLang sizes its chunked prefill by the GPU's memory where the run leaves it unset (veRL does)
        memory = profile.gpu_facts.get("memory_bytes")
        if not memory:
            raise RlsimError(
                f"profile {profile.name} has no GPU memory facts, by which {rules.label} sizes its chunked prefill: "
                "give --max-num-batched-tokens"
            )
        merged = dataclasses.replace(merged, max_num_batched_tokens=resolve(rules.chunk_budget_by_gpu)(memory))
    changes: dict = {"engine": merged}
    if merged.enforce_eager and not profile.engine.enforce_eager and profile.model_facts:
        # CUDA graphs off: every layer's kernels launched from Python, each iteration
        changes["t_w_s"] = profile.t_w_s + eager_s(profile)
    u, was = merged.gpu_memory_utilization, profile.engine.gpu_memory_utilization
    if u is not None and u != was:
        if not (profile.model_facts and profile.gpu_facts.get("memory_bytes")):
            raise RlsimError(
                f"profile {profile.name} has no model and GPU memory facts, so its KV capacity "
                f"({profile.kv_capacity_tokens} tokens, as measured) cannot be re-derived for "
                f"gpu_memory_utilization={u}"
            )
        changes["kv_capacity_tokens"] = kv_capacity(profile, u)
    return dataclasses.replace(profile, **changes)


EAGER_LAYER_S = (1.20 - 1.05) / 100 / 32  # vLLM PR 1440: Llama 2 7B, 100 tokens, 1.20 s eager, 1.05 s graphed


def eager_s(profile: Profile) -> float:
    """Seconds an iteration adds without CUDA graphs (vLLM's `enforce_eager`): 46.9 us per layer,
    what vLLM measured when it first captured graphs (github.com/vllm-project/vllm pull 1440: Llama 2
    7B at batch 1, 5 prompt and 100 output tokens, 1.20 s eager against 1.05 s graphed, over its 32
    layers), a launch cost per layer that does not shrink with the model's size."""
    return float(profile.model_facts["num_layers"]) * EAGER_LAYER_S


def forward_flops(profile: Profile, seq_lens: np.ndarray) -> float:
    """FLOPs of one forward pass over sequences of these lengths (weights + causal attention)."""
    mf = profile.model_facts
    t = np.asarray(seq_lens, dtype=float)
    return float((2.0 * model_facts.active_params(mf) * t + 2.0 * mf["num_layers"] * mf["hidden_size"] * t * t).sum())


def link_bytes_per_s(profile: Profile, gpus: int) -> float:
    """Per-GPU bandwidth of the link a group of `gpus` GPUs crosses: the scale-up link (NVLink)
    within one scale-up domain, the scale-out link (the node's NICs) beyond it."""
    gf = profile.gpu_facts
    if gpus <= gf.get("scale_up_domain", 8) or "scale_out_bytes_per_s" not in gf:
        return float(gf["nvlink_bytes_per_s"])
    return float(gf["scale_out_bytes_per_s"])


def weight_sync_s(profile: Profile, gpus: int | None = None, bucket_bytes: float | None = None) -> float:
    """`update_weights` on a cluster of `gpus` GPUs (default: one instance's GPUs).
    `bucket_bytes`: the weights move in buckets of this size (a checkpoint engine, as veRL's
    fully-async `checkpoint_engine` with its `device_buffer_size_M`), so the per-tensor cost is
    paid once a bucket rather than once a tensor."""
    gf, mf = profile.gpu_facts, profile.model_facts
    if not mf:
        return profile.weight_sync_s
    pieces = mf["num_tensors"] if bucket_bytes is None else max(1, math.ceil(weight_bytes(profile) / bucket_bytes))
    per_tensor = min(pieces, mf["num_tensors"]) * gf.get("weight_sync_per_tensor_s", 0.0)
    if "weight_sync_bytes_per_s" in gf:  # an older profile's one effective bandwidth
        return weight_bytes(profile) / gf["weight_sync_bytes_per_s"] + per_tensor
    if "nvlink_bytes_per_s" in gf:
        return weight_bytes(profile) / link_bytes_per_s(profile, gpus or profile.instance_gpus) + per_tensor
    return profile.weight_sync_s


PP_MICRO_BATCH_TOKENS = 16384  # veRL's ppo_max_token_len_per_gpu default: the tokens of a micro-batch
# a profile whose gpu_facts predate the host fields: PCIe Gen5 x16, one direction (64 GB/s), and
# DGX H100's host memory per GPU (2 Xeon 8480C, 8 channels of DDR5-4800 each: 614.4 GB/s over 8 GPUs)
HOST_LINK_FALLBACK_BPS, HOST_MEMORY_FALLBACK_BPS = 64e9, 76.8e9
ACTIVATION_BYTES = 2  # bf16 activations


def check_layout(profile: Profile, gpus: int) -> None:
    """One sentence where the training layout cannot run on `gpus` training GPUs."""
    tc, mf = profile.train, profile.model_facts
    group = tc.tp * tc.pp * tc.cp
    if gpus % group:
        raise RlsimError(
            f"the training layout TP {tc.tp} x PP {tc.pp} x CP {tc.cp} = {group} GPUs does not divide the {gpus} "
            "training GPUs"
        )
    if tc.ep > 1 and (gpus // tc.pp) % tc.ep:  # Megatron's MoE parallel folding: experts over a stage's GPUs
        raise RlsimError(f"training EP {tc.ep} does not divide the {gpus // tc.pp} GPUs of a pipeline stage")
    if mf and tc.pp > mf.get("num_layers", tc.pp):
        raise RlsimError(f"training PP {tc.pp} exceeds the model's {mf['num_layers']} layers")


def micro_batches_of(profile: Profile, seq_lens: np.ndarray, gpus: int, forward_only: bool = False) -> int:
    """Micro-batches of one data-parallel rank's share of these samples:
    packed to the trainer's token budget with dynamic batch size (`max_token_len`, or
    `log_prob_max_token_len` for a forward-only pass), `micro_batch_size` samples each without it,
    and by default veRL's 16,384 tokens a micro-batch, perfectly packed
    (`rlsim.framework_costs.micro_batch_count`)."""
    tc, fw = profile.train, profile.train.framework
    dp = max(1, gpus // (tc.tp * tc.pp * tc.cp))
    lens = np.asarray(seq_lens, dtype=float)
    budget = (fw.log_prob_max_token_len if forward_only else 0) or fw.max_token_len
    if budget or fw.micro_batch_size:
        return framework_costs.micro_batch_count(lens[::dp] / tc.cp, budget, fw.micro_batch_size)
    tokens = float(np.sum(lens)) / (dp * tc.cp)
    return max(1, math.ceil(tokens / (tc.padded_micro_batch_tokens or PP_MICRO_BATCH_TOKENS)))


def layout_cost(profile: Profile, seq_lens: np.ndarray, gpus: int) -> float:
    """Seconds of tensor- and expert-parallel traffic in one forward pass of training on samples
    of these lengths on `gpus` GPUs (the module docstring; the pipeline's bubble is the caller's)."""
    tc, mf = profile.train, profile.model_facts
    dp = max(1, gpus // (tc.tp * tc.pp * tc.cp))
    tokens = float(np.sum(seq_lens)) / (dp * tc.cp)  # what one rank of a data-parallel replica computes on
    act = tokens * mf["hidden_size"] * ACTIVATION_BYTES
    comm = 0.0
    if tc.tp > 1:  # 2 all-reduces per layer (ring: 2 (tp - 1) / tp of the bytes), its stage's layers
        comm += 2 * mf["num_layers"] / tc.pp * 2 * (tc.tp - 1) / tc.tp * act / link_bytes_per_s(profile, tc.tp)
    if tc.ep > 1 and mf.get("moe_layers"):  # dispatch and combine: each token to its k experts and back,
        # each TP rank sending its sequence-parallel share, within the EP group
        a2a = mf["experts_per_token"] * act / tc.tp * (tc.ep - 1) / tc.ep / link_bytes_per_s(profile, tc.ep)
        comm += 2 * mf["moe_layers"] / tc.pp * a2a
    return comm


def rank_shards(profile: Profile, gpus: int) -> framework_costs.Shards:
    """One training rank's parameter and optimizer shards on `gpus` training GPUs
    (`rlsim.framework_costs.shards`; FSDP shards the parameters too, over every rank)."""
    tc = profile.train
    dp = max(1, gpus // (tc.tp * tc.pp * tc.cp))
    shard = framework_costs.shards(profile.model_facts, tc.tp, tc.pp, tc.ep, dp)
    if tc.backend == "fsdp2":
        shard = framework_costs.Shards(shard.optimizer, shard.optimizer)
    return shard


def offload_costs(profile: Profile, gpus: int) -> dict[str, float]:
    """Seconds of offload per update on `gpus` training GPUs (`rlsim.framework_costs.offload_s`),
    and `ref`: the reference model's load before its pass."""
    tc, gf, fw = profile.train, profile.gpu_facts, profile.train.framework
    shard = rank_shards(profile, gpus)
    link = float(gf.get("host_link_bytes_per_s") or HOST_LINK_FALLBACK_BPS)
    memory = float(gf.get("host_memory_bytes_per_s") or HOST_MEMORY_FALLBACK_BPS)
    out = framework_costs.offload_s(
        shard, link, memory, fw.param_offload, fw.grad_offload, fw.optimizer_offload_fraction, tc.backend == "fsdp2"
    )
    out["ref"] = shard.weights * framework_costs.BF16_BYTES / link if fw.ref_offload else 0.0  # bf16 reference
    return out


def optimizer_s(profile: Profile, gpus: int) -> float:
    """Seconds of one AdamW step on `gpus` training GPUs (`rlsim.framework_costs.optimizer_step_s`);
    none where the profile states no HBM bandwidth."""
    tc, gf = profile.train, profile.gpu_facts
    if "hbm_bytes_per_s" not in gf:
        return 0.0
    return framework_costs.optimizer_step_s(
        rank_shards(profile, gpus), float(gf["hbm_bytes_per_s"]), tc.framework.optimizer_offload_fraction,
        tc.backend == "fsdp2",
    )  # fmt: skip


def sleep_s(profile: Profile) -> float:
    """Seconds to offload (or reload) one rank's weight shard over the host link."""
    link = profile.gpu_facts.get("host_link_bytes_per_s")
    if not (profile.model_facts and link):
        return 0.0
    return weight_bytes(profile) / profile.instance_gpus / link


def padded_tokens(lengths, budget: int) -> int:  # noqa: ANN001
    """Tokens the trainer computes over, padding each micro-batch to its longest sample."""
    lengths = [int(n) for n in lengths]
    return sum(len(mb) * max(lengths[i] for i in mb) for mb in micro_batches(lengths, budget))


def step_cost(
    profile: Profile, seq_lens: np.ndarray, train_gpus: int, use_kl_loss: bool, sleep: bool, gpus: int | None = None
) -> StepCost:
    """The phases of one step that trains on samples of these total lengths (prompt + response),
    on `train_gpus` training GPUs of a cluster of `gpus` (default: the training GPUs)."""
    tc = profile.train
    if profile.model_facts:
        old, ref, update = derived_training(profile, seq_lens, train_gpus, use_kl_loss)
    else:  # fitted: the measured forward (old log-probs, reference) and update, or the whole stage
        budget = tc.padded_micro_batch_tokens
        tokens = padded_tokens(seq_lens, budget) if budget else int(np.sum(seq_lens))
        fwd = tc.forward_seconds(tokens, train_gpus)
        old, ref, update = fwd, (fwd if use_kl_loss else 0.0), tc.seconds(tokens, train_gpus)
    slept = sleep_s(profile) if sleep else 0.0
    return StepCost(old, ref, update, weight_sync_s(profile, gpus or train_gpus), slept, slept)


def derived_training(profile: Profile, seq_lens: np.ndarray, train_gpus: int, use_kl_loss: bool) -> tuple:
    """(old log-prob, reference, update) seconds of a profile with model facts: FLOPs at the MFU,
    the layout's traffic and bubble, and what the framework does (`rlsim.framework_costs`)."""
    tc, mf, gf = profile.train, profile.model_facts, profile.gpu_facts
    rate = train_gpus * tc.peak_flops_per_gpu * tc.mfu
    flops = forward_flops(profile, seq_lens)
    comm = layout_cost(profile, seq_lens, train_gpus)
    micro = micro_batches_of(profile, seq_lens, train_gpus)
    lp_micro = micro_batches_of(profile, seq_lens, train_gpus, forward_only=True)
    bubble = framework_costs.bubble_factor(micro, tc.pp, tc.framework.vpp)
    lp_bubble = framework_costs.bubble_factor(lp_micro, tc.pp, tc.framework.vpp)
    floor = 0.0
    if model_facts.is_moe(mf) and "hbm_bytes_per_s" in gf:  # the update's micro-batches bound it
        dp = max(1, train_gpus // (tc.tp * tc.pp * tc.cp))
        per_micro = float(np.sum(seq_lens)) / (dp * tc.cp * tc.tp) / micro
        floor = framework_costs.expert_floor_s(
            mf, per_micro, micro, tc.ep, tc.pp, float(gf["hbm_bytes_per_s"]), tc.peak_flops_per_gpu * tc.mfu
        )
    body = flops / rate + comm + floor
    # the forward-only passes at their own efficiency where a calibration set one (else the update's)
    lp_rate = train_gpus * tc.peak_flops_per_gpu * tc.forward_mfu if tc.forward_mfu else rate
    lp_body = flops / lp_rate + comm + floor
    fwd, lp = body * bubble, lp_body * lp_bubble
    t = np.asarray(seq_lens, dtype=float)
    attention = 2.0 * mf["num_layers"] * mf["hidden_size"] * float(np.sum(t * t)) / flops if flops else 0.0
    fw = tc.framework
    covered = min(1.0, fw.recompute_layers / mf["num_layers"]) if fw.recompute_layers else 1.0
    again = framework_costs.recompute_forwards(fw.recompute, covered, attention)
    none = {"params": 0.0, "grads": 0.0, "optimizer": 0.0, "ref": 0.0}
    off = offload_costs(profile, train_gpus) if fw.offloads else none
    old = lp + off["params"]
    ref = lp + off["ref"] if use_kl_loss else 0.0
    # each optimizer step (a mini-batch's) pays the AdamW step and its gradient and optimizer offload
    n, step = fw.optimizer_steps, optimizer_s(profile, train_gpus)
    update = tc.fixed_s + (3 + again) * fwd + n * step + off["params"] + n * off["grads"] + n * off["optimizer"]
    return old, ref, update
