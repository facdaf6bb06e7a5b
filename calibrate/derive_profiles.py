"""Derive the shipped GPU profiles from measurements of the same operators (no GPU needed).

    python -m calibrate.derive_profiles [--vidur ../shared/data/vidur_profiling]

Every profile is `rlsim.iteration_model` filled with measured constants, folded into the closed
form the simulator charges; each constant's source is in the profile's `provenance.terms`:
- Linear layers: Vidur's measured H100 per-operator medians (github.com/microsoft/vidur @ 7d47513,
  `data/profiling/compute/h100/`, MIT), summed over one layer's non-attention ops, times the layer
  count, from the measured model whose layers are closest in size at the same TP (Llama-2-7B for
  Qwen2.5-7B and 14B, CodeLlama-34B for 32B), scaled by non-embedding parameters. A line over
  1..512 tokens gives the weight-read intercept and slope; 1,024..4,096 tokens the compute-bound
  slope (prefill, and the knee past which a decode batch is compute-bound).
- Attention: KV bytes per token (layers x KV heads x head dim x 2 x 2 bytes / TP) at 72.6% of HBM
  bandwidth, the fraction a real engine reaches: the slime SGLang fit of
  DeepSeek-R1-Distill-Llama-8B on an H200-class GPU (github.com/mjacob1002/slime @ 22a2ffb,
  `token-based-simulations/inference_throughput_model.py`) charges 37.6 ns per KV token where
  131,072 bytes over 4.8 TB/s take 27.3 ns.
- Per running sequence: 23.6 us (the same fit's alpha).
- Framework and sampler per iteration: that fit's T_w (5.595 ms) less what the linear layers and LM
  head of the same 8B model take on an H200 by the Vidur tables above (scaled to 4.8 TB/s): 1.2 ms.
- Tensor-parallel all-reduce, two per layer when TP > 1: 35 us per call, the median kernel time of
  Vidur's H100 DGX all-reduce profile for messages of 2 KB-1 MiB (the decode regime; 2 and 8 GPUs;
  `data/profiling/network/h100_dgx/all_reduce.csv`), plus the ring's bytes over NVLink
  (900 GB/s on H100, 400 GB/s on H800: the vendor datasheets).
- LM head: vocab x hidden x 2 bytes / TP over HBM bandwidth.
- Engine limits: veRL's rollout defaults (`verl/trainer/config/rollout/rollout.yaml`:
  gpu_memory_utilization 0.5, max_num_seqs 1024, max_num_batched_tokens 8192). KV capacity is
  derived from them and the model facts by `rlsim.step_costs.kv_capacity` (0.5 x 80 GB per GPU
  minus the rank's bf16 weight shard, over KV bytes per token), and re-derived for any other
  `--gpu-memory-utilization`.
- Model facts (parameters, non-embedding parameters, layers, hidden size, KV heads, head dim, bf16,
  tensor count) from the Qwen2.5 model cards and Hugging Face configs; `rlsim.step_costs` costs old
  log-probs, reference and update from them (forward 2N T + 2 L d T^2 FLOPs, update three
  forwards) at 35% MFU of 989 dense bf16 TFLOP/s per GPU, plus 5 s fixed per step (assumed).
- Weight sync: bf16 weights over 10 GB/s effective plus 5 ms per tensor (both assumed: resharding,
  bucketing and the engines' per-tensor load). For an 8B model this gives 3.1 s, inside the
  2.8-5.0 s per update that slime measured for an 8B model on 8 GPUs.
- Sleep and wake (veRL's hybrid engine): each rank's weight shard over the host link, PCIe Gen5
  x16 (64 GB/s a direction; 50 GB/s effective assumed), each way.
None of these constants is fitted to a paper's end-to-end seconds: the RollPacker baselines in
`benchmarks/paper_checks.py` are the check. `h200-llama-8b` is the slime fit itself (T_w, alpha,
beta and KV capacity as published), the one like-for-like measurement of a whole engine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from rlsim.derive.derive import (  # the constants `rlsim profile derive` shares, with their sources
    ALLREDUCE_LATENCY_S,
    ATTN_BW_FRACTION,
    HOST_LINK_BPS,
    SLIME_ALPHA_S,
    SLIME_BETA_S,
    SLIME_T_W_S,
    SYNC_BPS,
    SYNC_PER_TENSOR_S,
    VERL_GPU_MEMORY_UTILIZATION,
    VERL_MAX_NUM_BATCHED_TOKENS,
    VERL_MAX_NUM_SEQS,
)
from rlsim.iteration_model import H100, H200, H800, Gpu, Terms, closed_form
from rlsim.profile import profile_from_dict
from rlsim.step_costs import kv_capacity, weight_sync_s

OUT = Path(__file__).resolve().parent / "profiles"
OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
# slime's SGLang fit, DeepSeek-R1-Distill-Llama-8B on an H200-class GPU (module docstring)
SLIME_KV_CAPACITY = 789_000
LLAMA_8B = {"params": 8.03e9, "non_embedding": 6.98e9, "layers": 32, "hidden": 4096, "kv_heads": 8, "vocab": 128256}

# name: (params, non-embedding params, layers, hidden, kv_heads, head_dim, vocab, measured reference)
MODELS = {
    "qwen2.5-7b": (7.62e9, 6.53e9, 28, 3584, 4, 128, 152064, "meta-llama/Llama-2-7b-hf"),
    "qwen2.5-14b": (14.7e9, 13.1e9, 48, 5120, 8, 128, 152064, "meta-llama/Llama-2-7b-hf"),
    "qwen2.5-32b": (32.5e9, 31.0e9, 64, 5120, 8, 128, 152064, "codellama/CodeLlama-34b-Instruct-hf"),
}
# measured reference: (non-embedding params, layers); embeddings 2 x vocab 32,000 x hidden excluded
REFERENCE = {
    "meta-llama/Llama-2-7b-hf": (6.48e9, 32),
    "codellama/CodeLlama-34b-Instruct-hf": (33.2e9, 48),
}
# veRL's rollout defaults (verl/trainer/config/rollout/rollout.yaml)
# (GPU, model, rollout TP) shipped: the H100 family, and the H800 setups RollPacker ran (7B TP 1,
# 14B TP 2, 32B TP 4 as veRL's DAPO Qwen2.5-32B recipe rolls out).
# The rest of the H100 family (each model at TP 1/2/4/8 where its bf16 weights fit in half of
# an 80 GB GPU) is what `rlsim plan --tp` searches over.
SHIPPED = (
    (H100, "qwen2.5-7b", 1), (H100, "qwen2.5-14b", 2), (H100, "qwen2.5-32b", 2), (H100, "qwen2.5-32b", 4),
    (H800, "qwen2.5-7b", 1), (H800, "qwen2.5-14b", 2), (H800, "qwen2.5-32b", 4),
    (H100, "qwen2.5-7b", 2), (H100, "qwen2.5-7b", 4), (H100, "qwen2.5-7b", 8),
    (H100, "qwen2.5-14b", 1), (H100, "qwen2.5-14b", 4), (H100, "qwen2.5-14b", 8), (H100, "qwen2.5-32b", 8),
)  # fmt: skip


def _facts(params: float, non_emb: float, layers: int, hidden: int, kv_heads: int, head_dim: int, per_layer: int) -> dict:  # noqa: E501
    """Model facts; `per_layer` tensors per decoder layer plus embeddings, final norm, LM head."""
    return {
        "num_params": params, "num_non_embedding_params": non_emb, "num_layers": layers, "hidden_size": hidden,
        "num_kv_heads": kv_heads, "head_dim": head_dim, "dtype_bytes": 2, "num_tensors": layers * per_layer + 3,
    }  # fmt: skip


def _gpu(gpu: Gpu) -> dict:
    return {
        "memory_bytes": gpu.memory_bytes, "hbm_bytes_per_s": gpu.hbm_bytes_per_s,
        "nvlink_bytes_per_s": gpu.link_bytes_per_s,
        "host_link_bytes_per_s": HOST_LINK_BPS, "weight_sync_bytes_per_s": SYNC_BPS,
        "weight_sync_per_tensor_s": SYNC_PER_TENSOR_S,
    }  # fmt: skip


def _kv(prof: dict, util: float) -> int:
    # a placeholder capacity of one block: kv_capacity reads the model's and the GPU's facts only
    return kv_capacity(profile_from_dict(prof | {"kv_capacity_tokens": prof.get("block_size", 16)}), util)


def _train(params: float, gpu: Gpu) -> dict:
    """6 x params FLOPs per trained token (the update; rlsim.step_costs adds attention and the
    other phases from the model facts) at 35% MFU of the GPU's dense bf16 peak, 5 s fixed."""
    return {"flops_per_token": 6 * params, "peak_flops_per_gpu": gpu.bf16_flops_per_s, "mfu": 0.35, "fixed_s": 5.0}


def _linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    a = np.vstack([np.ones_like(x), x]).T
    (c0, c1), *_ = np.linalg.lstsq(a, y, rcond=None)
    mape = float(np.mean(np.abs(a @ np.array([c0, c1]) - y) / y))
    return float(c0), float(c1), mape


def linear_layers(vidur: Path, ref: str, tp: int, non_emb: float) -> tuple[float, float, float, float]:
    """(intercept s, slope s/token, compute-bound slope s/token, MAPE over 1..512 tokens) of all
    linear layers of a model of `non_emb` parameters, from the measured reference at the same TP."""
    ref_non_emb, ref_layers = REFERENCE[ref]
    table = pd.read_csv(vidur / "h100" / ref / "mlp.csv")
    rows = table[table.num_tensor_parallel_workers == tp].sort_values("num_tokens")
    per_iter_s = sum(rows[f"time_stats.{o}.median"] for o in OPS).to_numpy() * ref_layers / 1e3
    per_iter_s = per_iter_s * non_emb / ref_non_emb
    tokens = rows.num_tokens.to_numpy().astype(float)
    dec = tokens <= 512
    t0, slope, mape = _linear_fit(tokens[dec], per_iter_s[dec])
    pre = (tokens >= 1024) & (tokens <= 4096)
    _, prefill, _ = _linear_fit(tokens[pre], per_iter_s[pre])
    return t0, slope, prefill, mape


def framework_s(vidur: Path) -> float:
    """slime's measured T_w less the 8B model's linear layers and LM head on an H200."""
    t0, *_ = linear_layers(vidur, "meta-llama/Llama-2-7b-hf", 1, LLAMA_8B["non_embedding"])
    t0 *= H100.hbm_bytes_per_s / H200.hbm_bytes_per_s  # weight-read bound: scales with bandwidth
    lm_head = LLAMA_8B["vocab"] * LLAMA_8B["hidden"] * 2 / H200.hbm_bytes_per_s
    return SLIME_T_W_S - t0 - lm_head


def terms_for(gpu: Gpu, name: str, tp: int, vidur: Path) -> tuple[Terms, float]:
    """The model's iteration terms on `gpu` at `tp`, and the linear fit's MAPE."""
    params, non_emb, layers, hidden, kv_heads, head_dim, vocab, ref = MODELS[name]
    t0, slope, prefill, mape = linear_layers(vidur, ref, tp, non_emb)
    terms = Terms(
        num_layers=layers, hidden_size=hidden, dtype_bytes=2, kv_bytes_per_token=layers * kv_heads * head_dim * 2 * 2,
        tensor_parallel_size=tp, linear_t0_s=t0, linear_s_per_token=slope, linear_prefill_s_per_token=prefill,
        lm_head_s=vocab * hidden * 2 / tp / gpu.hbm_bytes_per_s, framework_s=framework_s(vidur),
        per_seq_s=SLIME_ALPHA_S, attn_bw_fraction=ATTN_BW_FRACTION, hbm_bytes_per_s=gpu.hbm_bytes_per_s,
        allreduce_latency_s=ALLREDUCE_LATENCY_S, link_bytes_per_s=gpu.link_bytes_per_s,
    )  # fmt: skip
    return terms, mape


def derive(gpu: Gpu, name: str, tp: int, vidur: Path) -> dict:
    params, non_emb, layers, hidden, kv_heads, head_dim, vocab, ref = MODELS[name]
    terms, mape = terms_for(gpu, name, tp, vidur)
    coeffs = {k: float(f"{v:.9g}") for k, v in closed_form(terms).items()}
    family = gpu.name.split("-")[0].lower()
    prof = {
        "schema_version": 2,
        "name": f"{family}-{name}-tp{tp}",
        "hardware": f"{tp}x {gpu.name}",
        "model": name.replace("qwen", "Qwen").replace("b", "B"),
        "tensor_parallel_size": tp,
        **coeffs,
        "kv_capacity_tokens": 0,
        "max_num_seqs": VERL_MAX_NUM_SEQS,
        "max_num_batched_tokens": VERL_MAX_NUM_BATCHED_TOKENS,
        "gpu_memory_utilization": VERL_GPU_MEMORY_UTILIZATION,
        "async_scheduling": True,  # vLLM 0.32's default on GPU executors (VllmConfig), as veRL runs it
        "train": _train(params, gpu),
        "weight_sync_s": 0.0,
        "model_facts": _facts(params, non_emb, layers, hidden, kv_heads, head_dim, 12),  # Qwen2.5: q/k/v biases
        "gpu_facts": _gpu(gpu),
        "provenance": {
            "kind": "derived from operator measurements",
            "terms": {
                "linear_layers": f"Vidur H100 per-operator medians of {ref} at TP{tp} (github.com/microsoft/vidur @ "
                f"7d47513), scaled by non-embedding parameters {non_emb:.3g}/{REFERENCE[ref][0]:.3g}: intercept "
                f"{terms.linear_t0_s * 1e3:.3f} ms, {terms.linear_s_per_token * 1e6:.2f} us/token to 512 tokens, "
                f"{terms.linear_prefill_s_per_token * 1e6:.2f} us/token compute-bound",
                "attention": f"KV {terms.kv_bytes_per_token:.0f} bytes/token / TP{tp} at {ATTN_BW_FRACTION:.1%} of "
                f"{gpu.hbm_bytes_per_s / 1e12:.2f} TB/s (the slime SGLang fit's beta against its bound)",
                "per_sequence": f"{SLIME_ALPHA_S * 1e6:.1f} us (the slime SGLang fit's alpha)",
                "framework": f"{terms.framework_s * 1e3:.2f} ms (the slime fit's T_w less its 8B model's linear "
                "layers and LM head by the Vidur tables at 4.8 TB/s)",
                "allreduce": (
                    f"{terms.allreduce_calls} calls x {ALLREDUCE_LATENCY_S * 1e6:.0f} us (Vidur h100_dgx "
                    f"all_reduce.csv, median kernel time, 2 KB-1 MiB) + ring bytes over NVLink "
                    f"{gpu.link_bytes_per_s / 1e9:.0f} GB/s: {terms.allreduce_s_per_token * 1e6:.2f} us/token"
                    if tp > 1 else "none (TP 1)"
                ),
                "lm_head": f"{vocab} x {hidden} x 2 bytes / TP{tp} over HBM: {terms.lm_head_s * 1e3:.3f} ms",
            },
            "kv_capacity": "rlsim.step_costs.kv_capacity at veRL's gpu_memory_utilization 0.5 "
            f"({gpu.memory_bytes / 1e9:.0f} GB per GPU)",
            "engine_limits": "veRL rollout defaults: max_num_seqs 1024, max_num_batched_tokens 8192",
            "model_facts": "Hugging Face config and model card of Qwen/" + name.replace("qwen", "Qwen").replace("b", "B"),  # noqa: E501
            "train": "forward 2N T + 2 L d T^2 FLOPs, update 3 forwards, at 35% MFU of 989 TFLOP/s, "
            "5 s fixed (assumed)",
            "weight_sync": "bf16 weights over 10 GB/s effective + 5 ms per tensor (assumed)",
            "sleep_wake": "weight shard over PCIe Gen5 x16 at 50 GB/s effective (assumed)",
            "script": "python -m calibrate.derive_profiles",
        },
        "fit_error": {"linear_layers_mape_1_512_tokens": round(mape, 4)},
    }
    prof["kv_capacity_tokens"] = _kv(prof, VERL_GPU_MEMORY_UTILIZATION)
    prof["weight_sync_s"] = round(_sync_s(prof), 3)
    return prof


def _sync_s(prof: dict) -> float:
    return weight_sync_s(profile_from_dict(prof))


def h200_llama_8b() -> dict:
    m = LLAMA_8B
    prof = {
        "schema_version": 2,
        "name": "h200-llama-8b",
        "hardware": "1x H200",
        "model": "DeepSeek-R1-Distill-Llama-8B",
        "tensor_parallel_size": 1,
        "t_w_s": SLIME_T_W_S,
        "alpha_s": SLIME_ALPHA_S,
        "beta_s": SLIME_BETA_S,
        "gamma_s": 0.0,
        "prefill_s_per_token": 6.0e-6,
        "kv_capacity_tokens": SLIME_KV_CAPACITY,
        "max_num_seqs": VERL_MAX_NUM_SEQS,
        "max_num_batched_tokens": VERL_MAX_NUM_BATCHED_TOKENS,
        "async_scheduling": True,  # simulated as vLLM 0.32 on a GPU executor
        "train": _train(m["params"], H200),
        "weight_sync_s": 0.0,
        "model_facts": _facts(m["params"], m["non_embedding"], m["layers"], m["hidden"], m["kv_heads"], 128, 9),
        "gpu_facts": _gpu(H200),
        "provenance": {
            "kind": "published fit",
            "decode": "t = T_w + alpha*running + beta*kv_tokens fitted to real SGLang decode logs "
            "(github.com/mjacob1002/slime @ 22a2ffb token-based-simulations/inference_throughput_model.py)",
            "prefill": "6 us/token assumed (2 x 8B FLOPs at about 2.7 PFLOP/s effective)",
            "kv_capacity": "published (engine memory setting not stated); re-derived from the model facts and "
            "141 GB when --gpu-memory-utilization is given",
            "train": "as the H100 profiles (H200 has the same dense bf16 peak)",
        },
        "fit_error": {"published_error": "0.7-1.9% at 8k-32k response caps"},
    }
    prof["weight_sync_s"] = round(_sync_s(prof), 3)
    return prof


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[2] / "shared" / "data" / "vidur_profiling"
    ap.add_argument("--vidur", type=Path, default=default)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    profiles = [derive(gpu, m, tp, args.vidur) for gpu, m, tp in SHIPPED] + [h200_llama_8b()]
    for prof in profiles:
        (OUT / f"{prof['name']}.json").write_text(json.dumps(prof, indent=2) + "\n")
        print(f"wrote {prof['name']}")


if __name__ == "__main__":
    main()
