"""`derive_profile`: a rollout instance's profile from a model's config and a GPU's datasheet.

One vLLM iteration on a TP group (one rank's view; `iteration_s` adds it up term by term):

- every layer's linear layers by the fitted roofline of `rlsim.derive.operators`, at the weights'
  dtype (FP8 halves the bytes and doubles the peak). A mixture-of-experts layer reads its
  attention projections, its shared experts and router, and only the routed experts the batch's
  tokens hit (`rlsim.model_facts.experts_hit`: E x (1 - (1 - k/E)^N) under uniform top-k routing),
  and computes with the k experts each token uses;
- attention: every running sequence's KV read once, at 72.6% of HBM bandwidth (the slime SGLang
  fit of DeepSeek-R1-Distill-Llama-8B on an H200: 37.6 ns per KV token where 131,072 bytes over
  4.8 TB/s take 27.3 ns; github.com/mjacob1002/slime @ 22a2ffb). GQA's KV is split over the TP
  ranks; MLA's latent KV is held in full by every rank, as vLLM does;
- TP > 1: two all-reduces per layer of the tokens' activations over the scale-up link (ring), 35 us
  each (Vidur's H100 DGX all-reduce median for 2 KB-1 MiB messages). Expert parallelism inside
  one instance (`ep` = TP: vLLM's `enable_expert_parallel` at data-parallel size 1) changes which
  experts a rank holds, not the links: every rank holds every token after attention's all-reduce,
  runs its own experts on them, and the MoE output is all-reduced as under TP (vLLM 0.32 uses its
  all-to-all kernels only with data or context parallelism, `FusedMoEParallelConfig.
  use_all2all_kernels`; the output's late all-reduce is `MoERunner._maybe_reduce_final_output`);
- a TP group beyond one scale-up domain (generation across nodes: k domains of g GPUs, TP = k g,
  as DeepSeek-V3 at TP 32 on 8-GPU nodes): vLLM's all-reduce is NCCL's, hierarchical as NCCL's
  tree and NVLS-tree algorithms are. `B` bytes cost the domain's ring share over the scale-up
  link, `2 (g - 1) / g B / scale_up`, plus each GPU's `1 / g` share all-reduced over its own NIC
  between the k domains, `2 (k - 1) / k (B / g) / scale_out`, plus NCCL's network hop latency
  twice per tree level, `2 log2(k) x 5.0 us` (NCCL's tuning model, `hwLat[NET][Tree][LL]`,
  src/graph/tuning.cc in github.com/NVIDIA/nccl);
- once per iteration: the LM head's weights, the framework and sampler (1.2 ms: the slime fit's
  T_w less its own model's linear layers and LM head); per running sequence 23.6 us (its alpha).

`closed_form` folds this into the profile's five coefficients as `rlsim.package_data.profiles`
folds measured tables: a line over 1..512 decode tokens gives `t_w_s` and `gamma_s` (and the linear
layers' own intercept `linear_t0_s`, where the compute knee starts), a line over 1,024..4,096
prefill tokens `prefill_s_per_token`. An MoE model's iteration time is concave in the batch (it
reads more experts as the batch grows, up to all of them), which a line cannot follow: its error
against `iteration_s` is in the profile's `fit_error`. Pipeline stages (`pp`: vLLM's
pipeline_parallel_size) run an iteration as pp micro-batches of 1/pp of its tokens through pp
stages of L/pp layers: the linear layers and links at the micro-batch's tokens (at least one:
fewer sequences than stages idle the rest, the pipeline's bubble), each GPU's share of the KV
divided by pp, a hand-over between stages per micro-batch (`p2p_s`), and the framework step and
LM head once a micro-batch.

Data-parallel attention with expert parallelism (`dp` > 1: vLLM's `data_parallel_size` with
`enable_expert_parallel`, EP = DP x TP, as DeepSeek-V3 is served at DP 8-32): each DP rank is an
instance of its own (TP GPUs, its own scheduler and KV) that runs attention, the dense layers, the
shared experts and router on its own batch, and the routed experts are split over all DP x TP
GPUs. The ranks step in lockstep (vLLM runs a dummy batch on a rank with nothing to do while any
rank of its group runs), and each rank's batch is padded to the busiest rank's tokens for its CUDA
graphs (`coordinate_batch_across_dp`; not under enforce_eager, `Profile.dp_group_s`). So a rank's
profile holds its own iteration without the routed experts, and `dp_moe_s` gives the routed
experts' time at the group's padded tokens M = DP x the busiest rank's: per MoE layer the experts
each GPU holds that M tokens hit, E x (1 - (1 - k/E)^M) / EP of them read and M x k / EP
token-experts computed, by the fitted roofline, and vLLM's default EP exchange (`all2all_backend`
allgather_reducescatter): an all-gather of the M tokens' activations over the EP group and a
reduce-scatter back, the two halves of one ring all-reduce of those bytes (`allreduce_s`,
hierarchical across domains). The simulator steps a group's ranks together at the slowest rank's
iteration plus that term (`rlsim.sim.engine`). A rank's GPUs hold the attention and dense weights
over TP and the routed experts over EP.

Not modelled, and refused in one sentence: a TP group beyond the scale-up domain that is not a
whole number of domains, expert parallelism that is neither within one instance nor over a DP group,
data-parallel attention with pipeline stages or on a dense model (its DP ranks are independent
instances); DeepSeek's MTP draft layer is not loaded.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlsim.config import EngineConfig
from rlsim.derive.gpus import GpuSpec, load_gpu, shipped_gpus
from rlsim.derive.models import DTYPE_BYTES, Model, load_model
from rlsim.derive.operators import LinearFit, linear_fit
from rlsim.derive.train import Trainer
from rlsim.errors import RlsimError
from rlsim.model_facts import experts_hit, kv_shards
from rlsim.profile import SCHEMA_VERSION, profile_from_dict
from rlsim.step_costs import (
    HOST_LINK_FALLBACK_BPS,
    HOST_MEMORY_FALLBACK_BPS,
    kv_capacity,
    rank_weight_bytes,
    weight_sync_s,
)

# slime's SGLang fit, DeepSeek-R1-Distill-Llama-8B on an H200-class GPU (module docstring)
SLIME_T_W_S, SLIME_ALPHA_S, SLIME_BETA_S = 5.595e-3, 23.6e-6, 37.6e-9
ATTN_BW_FRACTION = 2 * 32 * 8 * 128 * 2 / 4.8e12 / SLIME_BETA_S  # 0.726
ALLREDUCE_LATENCY_S = 35e-6  # Vidur h100_dgx all_reduce.csv, median kernel time, 2 KB-1 MiB messages
NET_HOP_LATENCY_S = 5.0e-6  # NCCL's tuning model, hwLat[NET][Tree][LL] (github.com/NVIDIA/nccl, src/graph/tuning.cc)
ACTIVATION_BYTES = 2  # bf16 activations cross the links whatever the weights' dtype
# veRL's rollout defaults (verl/trainer/config/rollout/rollout.yaml)
VERL_GPU_MEMORY_UTILIZATION, VERL_MAX_NUM_SEQS, VERL_MAX_NUM_BATCHED_TOKENS = 0.5, 1024, 8192
# per weight tensor of a refit: its resharding, one collective over the training layout, at the
# collective latency above (Vidur); a framework's own per-tensor overhead (its Python, the engine's
# load) is a framework term (rlsim.derive.terms), not physics
SYNC_PER_TENSOR_S = ALLREDUCE_LATENCY_S
DECODE_TOKENS = np.array([1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 320, 384, 448, 512])
PREFILL_TOKENS = np.array([1024, 1536, 2048, 3072, 4096])
# an MoE profile's residual knots: the line's range and on to veRL's max_num_batched_tokens
RESIDUAL_TOKENS = np.concatenate([DECODE_TOKENS, [768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]])


@dataclass(frozen=True, slots=True)
class Setup:
    """What is derived: a model on a GPU at a TP (and EP) degree, weights and KV at a dtype."""

    model: Model
    gpu: GpuSpec
    gpu_key: str
    tensor_parallel_size: int
    expert_parallel_size: int = 1
    dtype: str = "bf16"
    kv_cache_dtype: str = "bf16"
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1

    def __post_init__(self) -> None:
        m, tp, ep, pp = self.model, self.tensor_parallel_size, self.expert_parallel_size, self.pipeline_parallel_size
        dp = self.data_parallel_size
        if tp <= 0 or ep <= 0 or pp <= 0 or dp <= 0:
            raise RlsimError(f"--tp, --ep, --pp and --dp must be positive, got {tp}, {ep}, {pp} and {dp}")
        if dp > 1:
            if not m.is_moe:
                raise RlsimError(
                    f"--dp {dp}: {m.name} is a dense model; data-parallel attention is modelled with expert "
                    "parallelism, and a dense model's DP ranks are independent instances (drop --dp)"
                )
            if pp > 1:
                raise RlsimError(
                    f"--dp {dp} with --pp {pp}: data-parallel attention with pipeline stages is not modelled"
                )
            if ep != dp * tp:
                raise RlsimError(
                    f"--dp {dp} with --tp {tp} and --ep {ep}: data-parallel attention splits the experts over "
                    f"all DP x TP GPUs (vLLM's enable_expert_parallel): use --ep {dp * tp}"
                )
        if pp > m.num_layers:
            raise RlsimError(f"--pp {pp} exceeds {m.name}'s {m.num_layers} layers")
        if m.num_heads % tp:
            raise RlsimError(f"--tp {tp} does not divide {m.name}'s {m.num_heads} attention heads")
        if tp > self.gpu.scale_up_domain and tp % self.gpu.scale_up_domain:
            raise RlsimError(
                f"--tp {tp} spans more GPUs than {self.gpu.name}'s scale-up domain of {self.gpu.scale_up_domain} "
                "but not a whole number of domains: a TP group across nodes takes whole nodes"
            )
        if ep > 1 and dp == 1:
            if not m.is_moe:
                raise RlsimError(f"--ep {ep}: {m.name} is a dense model and has no experts to split")
            if ep != tp:
                raise RlsimError(
                    f"--ep {ep} with --tp {tp}: expert parallelism is modelled within one instance (--ep equal to "
                    "--tp) or over a data-parallel attention group (--ep equal to --dp x --tp)"
                )
        if ep > 1:
            if m.num_experts % ep:
                raise RlsimError(f"--ep {ep} does not divide {m.name}'s {m.num_experts} routed experts")
        for d in (self.dtype, self.kv_cache_dtype):
            if d not in DTYPE_BYTES:
                raise RlsimError(f"unknown dtype {d!r}; choose bf16 or fp8")
        self.gpu.peak_flops(self.dtype)  # FP8 on a GPU without it: one sentence

    @property
    def weight_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def facts(self) -> dict[str, Any]:
        return self.model.facts(self.dtype, self.kv_cache_dtype)

    @property
    def kv_bytes_per_rank_per_token(self) -> float:
        """One token's KV on one GPU: its TP shard of its stage's layers."""
        f = self.facts
        return f["kv_bytes_per_token"] / kv_shards(f, self.tensor_parallel_size) / self.pipeline_parallel_size

    def micro_tokens(self, tokens: np.ndarray) -> np.ndarray:
        """Tokens of each of the pipeline's micro-batches when an iteration's `tokens` are spread
        over its stages (at least one, while there are any: fewer sequences than stages leave
        stages idle, the pipeline's bubble)."""
        n = np.asarray(tokens, dtype=float)
        pp = self.pipeline_parallel_size
        return n if pp == 1 else np.maximum(n / pp, np.minimum(n, 1.0))


def _linear_s(s: Setup, fit: LinearFit, tokens: np.ndarray) -> np.ndarray:
    """All layers' linear time on one rank over `tokens` tokens (an array); with pipeline stages,
    every layer once per micro-batch of `Setup.micro_tokens` (p stages of L / p layers, p micro-batches)."""
    m, tp, wb = s.model, s.tensor_parallel_size, s.weight_bytes
    hbm, peak = s.gpu.hbm_bytes_per_s, s.gpu.peak_flops(s.dtype)
    n = s.micro_tokens(tokens)
    dense_params = m.attn_params + m.dense_mlp_params
    total = m.num_dense_layers * fit.layer_s(dense_params * wb / tp, 2 * dense_params / tp, n, m.hidden_size, hbm, peak)
    if m.moe_layers:
        attn = fit.layer_s(m.attn_params * wb / tp, 2 * m.attn_params / tp, n, m.hidden_size, hbm, peak)
        total = total + m.moe_layers * (attn + moe_experts_s(s, fit, n))
    return total


def moe_experts_s(s: Setup, fit: LinearFit, tokens: np.ndarray, always: bool = True) -> np.ndarray:
    """One MoE layer's experts on one rank over `tokens` tokens by the fitted roofline: the routed
    experts the tokens hit read and the k a token uses computed, with the shared experts and router
    unless `always` is False (the routed experts alone are what vLLM's fused-MoE kernel runs, which
    `doctables/derive_checks.py` holds against vLLM's own kernel benchmark). With data-parallel
    attention the group pays the routed experts (`dp_moe_s`)."""
    m, tp, wb = s.model, s.tensor_parallel_size, s.weight_bytes
    n = np.asarray(tokens, dtype=float)
    hit = np.array([experts_hit(m.num_experts, m.experts_per_token, x) for x in np.atleast_1d(n)]).reshape(n.shape)
    shared = (m.shared_expert_params + m.router_params) if always else 0.0
    routed = s.data_parallel_size == 1
    read = (hit * m.expert_params * routed + shared) * wb / tp
    used = 2 * (m.experts_per_token * m.expert_params * routed + shared) / tp
    return fit.roofline_s(read, n * used, s.gpu.hbm_bytes_per_s, s.gpu.peak_flops(s.dtype))


def domains(tp: int, scale_up_domain: int) -> tuple[int, int]:
    """(k, g): a group of `tp` GPUs spans k scale-up domains of g GPUs each."""
    g = min(tp, scale_up_domain)
    return tp // g, g


def allreduce_s(gpu: GpuSpec, group: int, nbytes: np.ndarray) -> np.ndarray:
    """One all-reduce of `nbytes` over `group` GPUs: a ring within one scale-up domain, NCCL's
    hierarchy beyond it (the module docstring)."""
    k, g = domains(group, gpu.scale_up_domain)
    t = ALLREDUCE_LATENCY_S + nbytes * 2 * (g - 1) / g / gpu.scale_up_bytes_per_s
    if k > 1:
        t = t + 2 * np.log2(k) * NET_HOP_LATENCY_S + nbytes / g * 2 * (k - 1) / k / gpu.scale_out_bytes_per_s
    return t


def _links_s(s: Setup, tokens: np.ndarray) -> np.ndarray:
    """All-reduce time of one iteration over `tokens` tokens (two a layer, the same with expert
    parallelism inside the instance), and with pipeline stages each micro-batch's hand-over to the
    next stage."""
    m, tp, pp = s.model, s.tensor_parallel_size, s.pipeline_parallel_size
    n = s.micro_tokens(tokens)
    hops = pp * p2p_s(s, n) if pp > 1 else np.zeros_like(n)
    if tp == 1:
        return hops
    allreduce = allreduce_s(s.gpu, tp, n * m.hidden_size * ACTIVATION_BYTES)
    if s.data_parallel_size > 1:  # a DP rank's own: its attention's all-reduce (the EP exchange: `dp_moe_s`)
        return 2 * m.num_dense_layers * allreduce + m.moe_layers * allreduce
    return 2 * m.num_layers * allreduce + hops


def dp_moe_s(s: Setup, group_tokens: np.ndarray) -> np.ndarray:
    """A data-parallel attention group's routed experts in one lockstep iteration over
    `group_tokens` (DP x the busiest rank's tokens), on each of its DP x TP GPUs: the experts it
    holds that the tokens hit, read and computed by the fitted roofline, and the EP exchange, an
    all-gather and a reduce-scatter of the tokens' activations (the module docstring)."""
    m, g, group = s.model, s.gpu, s.expert_parallel_size
    fit, wb = linear_fit(), s.weight_bytes
    n = np.asarray(group_tokens, dtype=float)
    hit = np.array([experts_hit(m.num_experts, m.experts_per_token, x) for x in np.atleast_1d(n)]).reshape(n.shape)
    read = hit * m.expert_params * wb / group
    flops = n * 2 * m.experts_per_token * m.expert_params / group
    experts = fit.c0_s + fit.roofline_s(read, flops, g.hbm_bytes_per_s, g.peak_flops(s.dtype))
    return m.moe_layers * (experts + allreduce_s(g, group, n * m.hidden_size * ACTIVATION_BYTES))


def p2p_s(s: Setup, micro: np.ndarray) -> np.ndarray:
    """One micro-batch's activations sent to the next pipeline stage: over the scale-up link
    while the instance fits in one scale-up domain, else over the NIC (a stage boundary then
    crosses nodes), at the collective latency plus a network hop."""
    nbytes = micro * s.model.hidden_size * ACTIVATION_BYTES
    if s.tensor_parallel_size * s.pipeline_parallel_size <= s.gpu.scale_up_domain:
        return ALLREDUCE_LATENCY_S + nbytes / s.gpu.scale_up_bytes_per_s
    return ALLREDUCE_LATENCY_S + NET_HOP_LATENCY_S + nbytes / s.gpu.scale_out_bytes_per_s


@functools.cache
def framework_s() -> float:
    """slime's measured T_w less what its own model's linear layers and LM head take on an H200
    by the fitted roofline (the line over 1..512 tokens, as `closed_form` folds a model)."""
    fit = linear_fit()
    h200 = load_gpu("h200")
    slime = load_model("deepseek-r1-distill-llama-8b")
    s = Setup(slime, h200, "h200", 1)
    t0, _ = np.polyfit(DECODE_TOKENS, _linear_s(s, fit, DECODE_TOKENS), 1)[::-1]
    return SLIME_T_W_S - t0 - slime.lm_head_params * 2 / h200.hbm_bytes_per_s


def iteration_s(s: Setup, batch: float, context: float, decode_tokens: float, prefill_tokens: float = 0.0) -> float:
    """One iteration, term by term (the reference the closed form is fitted to)."""
    fit = linear_fit()
    tokens = np.array([decode_tokens + prefill_tokens], dtype=float)
    attn = context * s.kv_bytes_per_rank_per_token / (ATTN_BW_FRACTION * s.gpu.hbm_bytes_per_s)
    body = float(_linear_s(s, fit, tokens)[0] + _links_s(s, tokens)[0]) if tokens[0] > 0 else 0.0
    return _fixed_s(s) + SLIME_ALPHA_S * batch + attn + body


def _fixed_s(s: Setup) -> float:
    """An iteration's time whatever its batch: the framework's step (scheduling, input
    preparation, sampling) and the LM head's weights, once per micro-batch with pipeline stages:
    the one engine core schedules each micro-batch in turn, and the last stage reads the head for each."""
    lm_head = s.model.lm_head_params * s.weight_bytes / s.tensor_parallel_size / s.gpu.hbm_bytes_per_s
    return s.pipeline_parallel_size * (framework_s() + lm_head)


def _knee(coeffs: dict[str, Any], tokens: float) -> float:
    return max(0.0, (coeffs["prefill_s_per_token"] - coeffs["gamma_s"]) * tokens - coeffs["linear_t0_s"])


def closed_form(s: Setup) -> tuple[dict[str, Any], float]:
    """The profile's coefficients (`linear_t0_s` and, for an MoE model, the `decode_residual_s`
    knots the line misses), and their mean relative error against `iteration_s` over decode
    batches 1..512 at contexts of 1K-16K tokens."""
    fit = linear_fit()
    fixed = _fixed_s(s)
    lin = _linear_s(s, fit, DECODE_TOKENS)
    body = lin + _links_s(s, DECODE_TOKENS)
    gamma, t0 = np.polyfit(DECODE_TOKENS, body, 1)
    lin_slope, lin_t0 = np.polyfit(DECODE_TOKENS, lin, 1)
    pre_body = _linear_s(s, fit, PREFILL_TOKENS) + _links_s(s, PREFILL_TOKENS)
    prefill, _ = np.polyfit(PREFILL_TOKENS, pre_body, 1)
    coeffs = {
        "t_w_s": fixed + t0,
        "alpha_s": SLIME_ALPHA_S,
        "beta_s": s.kv_bytes_per_rank_per_token / (ATTN_BW_FRACTION * s.gpu.hbm_bytes_per_s),
        "gamma_s": gamma,
        "prefill_s_per_token": max(prefill, gamma),
        "linear_t0_s": max(lin_t0, 0.0),
    }
    coeffs: dict[str, Any] = {k: float(f"{float(v):.9g}") for k, v in coeffs.items()}
    if s.model.is_moe:  # what the line misses, knot by knot (rlsim.profile.Profile.decode_residual)
        ys = _linear_s(s, fit, RESIDUAL_TOKENS) + _links_s(s, RESIDUAL_TOKENS)
        coeffs["decode_residual_s"] = [
            [int(n), float(f"{float(y - (t0 + gamma * n) - _knee(coeffs, n)):.6g}")]
            for n, y in zip(RESIDUAL_TOKENS, ys, strict=True)
        ]
    if s.data_parallel_size > 1:  # the group's routed experts at its padded tokens, knot by knot
        group = s.data_parallel_size * RESIDUAL_TOKENS
        knots = zip(group, dp_moe_s(s, group), strict=True)
        coeffs["dp_moe_s"] = [[int(n), float(f"{float(y):.6g}")] for n, y in knots]
    residual = dict((n, y) for n, y in coeffs.get("decode_residual_s", []))
    errors = []
    for b in (1, 8, 32, 128, 512):
        for ctx in (1024, 4096, 16384):
            ref = iteration_s(s, b, b * ctx, b)
            got = coeffs["t_w_s"] + coeffs["alpha_s"] * b + coeffs["beta_s"] * b * ctx + coeffs["gamma_s"] * b
            errors.append(abs((got + _knee(coeffs, b) + residual.get(b, 0.0)) / ref - 1))
    return coeffs, float(np.mean(errors))


def setup(
    model: str,
    gpu: str,
    tp: int,
    ep: int = 1,
    dtype: str = "bf16",
    kv_cache_dtype: str | None = None,
    pp: int = 1,
    dp: int = 1,
) -> Setup:
    """The `Setup` of a model name or config path on a GPU name or JSON file."""
    spec = load_gpu(gpu)
    key = gpu.lower() if gpu.lower() in shipped_gpus() else spec.name.lower()
    return Setup(load_model(model), spec, key, tp, ep, dtype, kv_cache_dtype or dtype, pp, dp)


def derive_profile(s: Setup, engine: EngineConfig | None = None, trainer: Trainer | None = None) -> dict[str, Any]:
    """The profile (as its JSON dict) of `s`, under veRL's rollout defaults unless `engine` sets
    `gpu_memory_utilization`, `max_num_seqs` or `max_num_batched_tokens`, trained by `trainer`
    (default: veRL's FSDP backend at its published MFU)."""
    m, g, tp, pp = s.model, s.gpu, s.tensor_parallel_size, s.pipeline_parallel_size
    trainer = trainer or Trainer()
    fit = linear_fit()
    coeffs, err = closed_form(s)
    engine = engine or EngineConfig()
    util = engine.gpu_memory_utilization or VERL_GPU_MEMORY_UTILIZATION
    dp = s.data_parallel_size
    suffix = (
        (f"-dp{dp}" if dp > 1 else "")
        + (f"-pp{pp}" if pp > 1 else "")
        + (f"-ep{s.expert_parallel_size}" if s.expert_parallel_size > 1 else "")
        + (f"-{s.dtype}" if s.dtype != "bf16" else "")
    )
    facts = s.facts
    gpu_facts = {
        "memory_bytes": g.memory_bytes, "hbm_bytes_per_s": g.hbm_bytes_per_s,
        "nvlink_bytes_per_s": g.scale_up_bytes_per_s,
        "scale_up_domain": g.scale_up_domain, "scale_out_bytes_per_s": g.scale_out_bytes_per_s,
        "host_link_bytes_per_s": g.host_link_bytes_per_s or HOST_LINK_FALLBACK_BPS,
        "host_memory_bytes_per_s": g.host_memory_bytes_per_s or HOST_MEMORY_FALLBACK_BPS,
        "weight_sync_per_tensor_s": SYNC_PER_TENSOR_S,
    }  # fmt: skip
    prof: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "name": f"{s.gpu_key}-{m.name}-tp{tp}{suffix}",
        "hardware": f"{tp * pp}x {g.name}",
        "model": m.name,
        "tensor_parallel_size": tp,
        **({"pipeline_parallel_size": pp} if pp > 1 else {}),
        **({"data_parallel_size": dp} if dp > 1 else {}),
        **coeffs,
        "kv_capacity_tokens": 16,
        "max_num_seqs": engine.max_num_seqs or VERL_MAX_NUM_SEQS,
        "max_num_batched_tokens": engine.max_num_batched_tokens or VERL_MAX_NUM_BATCHED_TOKENS,
        "gpu_memory_utilization": util,
        "async_scheduling": True,  # vLLM 0.32's default on GPU executors, as veRL runs it
        "train": trainer.block(m, g),
        "weight_sync_s": 0.0,
        "model_facts": facts,
        "gpu_facts": gpu_facts,
        "provenance": {
            "kind": "derived by rlsim profile derive",
            "model": f"config of {m.source} ({m.num_params / 1e9:.2f}B parameters, {m.num_active_params / 1e9:.2f}B "
            f"active, {'MLA' if m.is_mla else 'GQA'}, {'MoE' if m.is_moe else 'dense'})",
            "gpu": g.source,
            "linear_layers": f"roofline fitted to Vidur's H100 operator medians ({fit.rows} rows, "
            f"MAPE {fit.mape:.1%}): "
            f"{fit.eff_bw:.1%} of HBM bandwidth, {fit.eff_flops:.1%} of peak, knee sharpness {fit.p:.2f}, "
            f"{fit.c0_s * 1e6:.1f} us per layer (rlsim.derive.operators)",
            "attention": f"KV at {ATTN_BW_FRACTION:.1%} of HBM bandwidth (the slime fit's beta against its bound); "
            f"{s.kv_bytes_per_rank_per_token:,.0f} bytes per token per rank",
            "per_sequence": f"{SLIME_ALPHA_S * 1e6:.1f} us (the slime fit's alpha)",
            "framework": f"{framework_s() * 1e3:.2f} ms (the slime fit's T_w less its model's linear layers and LM "
            "head by the fitted roofline)",
            "links": "2 all-reduces per layer (35 us + ring bytes over the scale-up link"
            + (
                f"; across {domains(tp, g.scale_up_domain)[0]} scale-up domains, NCCL's hierarchy: each GPU's share "
                "over its NIC + 5 us a tree level)"
                if tp > g.scale_up_domain
                else ")"
            )
            + (
                "; with EP inside the instance the same (vLLM's all-to-all kernels need data parallelism)"
                if s.expert_parallel_size > 1 and dp == 1
                else "; per MoE layer 1 all-reduce (the EP exchange: data_parallel)" if dp > 1 else ""
            )
            if tp > 1
            else "none (TP 1)",
            "engine_limits": "veRL rollout defaults unless given: max_num_seqs 1024, max_num_batched_tokens 8192, "
            "gpu_memory_utilization 0.5",
            "train": trainer.provenance(m),
            "weight_sync": f"the whole model's bytes over the scale-up link ({g.scale_up_bytes_per_s / 1e9:,.0f} GB/s) "
            f"within a scale-up domain of {g.scale_up_domain} GPUs, the scale-out link "
            f"({g.scale_out_bytes_per_s / 1e9:,.0f} GB/s per GPU) beyond it, + {SYNC_PER_TENSOR_S * 1e6:.0f} us per "
            "tensor (its resharding collective, Vidur's median collective latency; a framework's own per-tensor "
            "overhead is a framework term, --terms); weight_sync_s is one instance's",
            **({"pipeline": f"{pp} stages of {m.num_layers / pp:.1f} layers: each iteration p micro-batches of 1/p "
                "of the tokens through every stage, a hand-over between stages (35 us + bytes over the link, + 5 us "
                "across nodes), the framework step and LM head once a micro-batch"} if pp > 1 else {}),
            **({"data_parallel": f"{dp} DP ranks of {tp} GPU(s) in lockstep, experts over EP {dp * tp}: a rank's "
                "own iteration here, the routed experts in dp_moe_s at DP x the busiest rank's tokens (experts hit "
                "read, token-experts computed, by the fitted roofline, + 1 c0; vLLM's allgather_reducescatter "
                "exchange as one ring all-reduce's bytes)"} if dp > 1 else {}),
            "not_modelled": "MTP draft layers" if dp > 1 else "data-parallel attention, MTP draft layers",
        },
        "fit_error": {"closed_form_vs_terms_mape": round(err, 4), "linear_layers_fit_mape": round(fit.mape, 4)},
    }
    weights = rank_weight_bytes(facts, tp * pp, dp)
    if weights >= util * g.memory_bytes:
        where = f"TP {tp}" + (f" x PP {pp}" if pp > 1 else "") + (f" with EP {dp * tp}" if dp > 1 else "")
        raise RlsimError(
            f"{m.name}'s weights take {weights / 1e9:.1f} GB per GPU at {where}, more than "
            f"gpu_memory_utilization {util} of {g.name}'s {g.memory_bytes / 1e9:.0f} GB: raise --tp or --pp or "
            "--gpu-memory-utilization, or use --dtype fp8"
        )
    placeholder = profile_from_dict(prof, "derived profile")
    prof["kv_capacity_tokens"] = kv_capacity(placeholder, util)
    prof["weight_sync_s"] = round(weight_sync_s(profile_from_dict(prof, "derived profile")), 3)
    return prof
