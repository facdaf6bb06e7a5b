"""Derive the shipped default profiles from published measurements (no GPU needed).

    python -m calibrate.derive_profiles [--vidur ../shared/data/vidur_profiling]

H100 profiles (Qwen2.5-7B TP1, 14B TP2, 32B TP2):
- Linear layers: Vidur's measured H100 per-operator medians (github.com/microsoft/vidur @ 7d47513,
  `data/profiling/compute/h100/`, MIT), summed over one layer's non-attention ops and multiplied
  by the layer count, at num_tokens = 1..512 (in decode, num_tokens is the running batch). A
  least-squares line gives the intercept (part of t_w) and the per-token slope (gamma). Sizes not
  measured are scaled by parameter count from the nearest measured model at the same TP.
  Prefill tokens cost the slope of the same tables over 1,024..4,096 tokens (compute-bound).
- Attention (beta): KV bytes per token per GPU (layers x KV heads x head dim x 2 x 2 bytes / TP)
  over the H100's 3.35 TB/s HBM bandwidth: a decode step reads every running sequence's KV.
- t_w also holds the LM head's weight read (vocab x hidden x 2 bytes / TP over HBM bandwidth) and
  an assumed 1 ms of per-iteration framework overhead (scheduling, sampling, launch).
- Engine limits: veRL's rollout defaults (`verl/trainer/config/rollout/rollout.yaml`:
  gpu_memory_utilization 0.5, max_num_seqs 1024, max_num_batched_tokens 8192). KV capacity is
  derived from them and the model facts by `rlsim.step_costs.kv_capacity` (0.5 x 80 GB per GPU
  minus the rank's bf16 weight shard, over KV bytes per token), and re-derived for any other
  `--gpu-memory-utilization`.
- Model facts (parameters, layers, hidden size, KV heads, head dim, bf16, tensor count) from the
  models' Hugging Face configs; `rlsim.step_costs` costs old log-probs, reference and update from
  them (forward 2N T + 2 L d T^2 FLOPs, update three forwards) at 35% MFU of 989 dense bf16
  TFLOP/s per GPU, plus 5 s fixed per step (assumed).
- Weight sync: bf16 weights over 10 GB/s effective plus 5 ms per tensor (both assumed: resharding,
  bucketing and the engines' per-tensor load). For an 8B model this gives 3.1 s, inside the
  2.8-5.0 s per update slime measured for an 8B model on 8 GPUs.
- Sleep and wake (veRL's hybrid engine): each rank's weight shard over the host link, PCIe Gen5
  x16 (64 GB/s a direction; 50 GB/s effective assumed), each way.
`h200-llama-8b` takes T_w, alpha, beta and KV capacity from the published fit to SGLang decode
logs (github.com/mjacob1002/slime @ 22a2ffb, `token-based-simulations/inference_throughput_model.py`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "profiles"
HBM_BPS = 3.35e12
H100_BF16 = 989e12
GPU_MEM = 80e9
FRAMEWORK_OVERHEAD_S = 1e-3
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

# name: (params, layers, hidden, kv_heads, head_dim, vocab, measured reference)
MODELS = {
    "qwen2.5-7b": (7.62e9, 28, 3584, 4, 128, 152064, "meta-llama/Llama-2-7b-hf"),
    "qwen2.5-14b": (14.7e9, 48, 5120, 8, 128, 152064, "codellama/CodeLlama-34b-Instruct-hf"),
    "qwen2.5-32b": (32.5e9, 64, 5120, 8, 128, 152064, "codellama/CodeLlama-34b-Instruct-hf"),
}
# veRL's rollout defaults (verl/trainer/config/rollout/rollout.yaml)
VERL_GPU_MEMORY_UTILIZATION, VERL_MAX_NUM_SEQS, VERL_MAX_NUM_BATCHED_TOKENS = 0.5, 1024, 8192
HOST_LINK_BPS = 50e9  # PCIe Gen5 x16: 64 GB/s a direction; 50 effective (assumed)
SYNC_BPS, SYNC_PER_TENSOR_S = 10e9, 5e-3  # assumed; see the module docstring


def _facts(params: float, layers: int, hidden: int, kv_heads: int, head_dim: int, per_layer: int) -> dict:
    """Model facts; `per_layer` tensors per decoder layer plus embeddings, final norm, LM head."""
    return {
        "num_params": params, "num_layers": layers, "hidden_size": hidden, "num_kv_heads": kv_heads,
        "head_dim": head_dim, "dtype_bytes": 2, "num_tensors": layers * per_layer + 3,
    }  # fmt: skip


def _gpu(memory: float, hbm: float) -> dict:
    return {
        "memory_bytes": memory, "hbm_bytes_per_s": hbm, "host_link_bytes_per_s": HOST_LINK_BPS,
        "weight_sync_bytes_per_s": SYNC_BPS, "weight_sync_per_tensor_s": SYNC_PER_TENSOR_S,
    }  # fmt: skip


def _kv(prof: dict, util: float) -> int:
    from rlsim.profile import profile_from_dict
    from rlsim.step_costs import kv_capacity

    return kv_capacity(profile_from_dict(prof | {"kv_capacity_tokens": 1}), util)
# (model, rollout TP) pairs shipped; TP4 for 32B is what veRL's DAPO recipe uses at 20k+ lengths.
SHIPPED = (("qwen2.5-7b", 1), ("qwen2.5-14b", 2), ("qwen2.5-32b", 2), ("qwen2.5-32b", 4))
REFERENCE = {
    "meta-llama/Llama-2-7b-hf": (6.74e9, 32),
    "codellama/CodeLlama-34b-Instruct-hf": (33.7e9, 48),
}


def _train(params: float) -> dict:
    """6 x params FLOPs per trained token (the update; rlsim.step_costs adds attention and the
    other phases from the model facts) at 35% MFU of an H100's dense bf16 peak, 5 s fixed."""
    return {"flops_per_token": 6 * params, "peak_flops_per_gpu": H100_BF16, "mfu": 0.35, "fixed_s": 5.0}


def _linear_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    a = np.vstack([np.ones_like(x), x]).T
    (c0, c1), *_ = np.linalg.lstsq(a, y, rcond=None)
    mape = float(np.mean(np.abs(a @ np.array([c0, c1]) - y) / y))
    return float(c0), float(c1), mape


def derive_h100(name: str, tp: int, vidur: Path) -> dict:
    import pandas as pd

    params, layers, hidden, kv_heads, head_dim, vocab, ref = MODELS[name]
    ref_params, ref_layers = REFERENCE[ref]
    table = pd.read_csv(vidur / "h100" / ref / "mlp.csv")
    rows = table[table.num_tensor_parallel_workers == tp].sort_values("num_tokens")
    per_iter_s = sum(rows[f"time_stats.{o}.median"] for o in OPS).to_numpy() * ref_layers / 1e3
    per_iter_s = per_iter_s * params / ref_params  # scale by parameter count
    tokens = rows.num_tokens.to_numpy().astype(float)
    dec = tokens <= 512
    t0, gamma, mape = _linear_fit(tokens[dec], per_iter_s[dec])
    pre = (tokens >= 1024) & (tokens <= 4096)
    _, prefill, _ = _linear_fit(tokens[pre], per_iter_s[pre])
    kv_bytes = layers * kv_heads * head_dim * 2 * 2
    lm_head_s = vocab * hidden * 2 / tp / HBM_BPS
    prof = {
        "name": f"h100-{name}-tp{tp}",
        "hardware": f"{tp}x H100-SXM-80GB",
        "model": name.replace("qwen", "Qwen"),
        "tensor_parallel_size": tp,
        "t_w_s": round(t0 + lm_head_s + FRAMEWORK_OVERHEAD_S, 7),
        "alpha_s": 0.0,
        "beta_s": round(kv_bytes / tp / HBM_BPS, 13),
        "gamma_s": round(gamma, 9),
        "prefill_s_per_token": round(prefill, 9),
        "kv_capacity_tokens": 0,
        "max_num_seqs": VERL_MAX_NUM_SEQS,
        "max_num_batched_tokens": VERL_MAX_NUM_BATCHED_TOKENS,
        "gpu_memory_utilization": VERL_GPU_MEMORY_UTILIZATION,
        "train": _train(params),
        "weight_sync_s": 0.0,
        "model_facts": _facts(params, layers, hidden, kv_heads, head_dim, 12),  # Qwen2.5: q/k/v biases
        "gpu_facts": _gpu(GPU_MEM, HBM_BPS),
        "provenance": {
            "kind": "derived from publications",
            "linear_layers": f"Vidur H100 per-operator medians of {ref} at TP{tp}, x {layers} layers "
            f"of {name}, scaled by parameter count {params:.3g}/{ref_params:.3g}; github.com/microsoft/vidur @ 7d47513",
            "attention": f"KV {kv_bytes} bytes/token / TP{tp} over 3.35 TB/s HBM",
            "t_w": "linear-fit intercept + LM head weight read + 1 ms framework overhead (assumed)",
            "kv_capacity": "rlsim.step_costs.kv_capacity at veRL's gpu_memory_utilization 0.5 (80 GB per GPU)",
            "engine_limits": "veRL rollout defaults: max_num_seqs 1024, max_num_batched_tokens 8192",
            "model_facts": f"Hugging Face config of Qwen/{name.replace('qwen', 'Qwen').replace('b', 'B')}",
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
    from rlsim.profile import profile_from_dict
    from rlsim.step_costs import weight_sync_s

    return weight_sync_s(profile_from_dict(prof))


def h200_llama_8b() -> dict:
    params = 8.03e9
    prof = {
        "name": "h200-llama-8b",
        "hardware": "1x H200",
        "model": "DeepSeek-R1-Distill-Llama-8B",
        "tensor_parallel_size": 1,
        "t_w_s": 5.595e-3,
        "alpha_s": 23.6e-6,
        "beta_s": 37.6e-9,
        "gamma_s": 0.0,
        "prefill_s_per_token": 6.0e-6,
        "kv_capacity_tokens": 789_000,
        "max_num_seqs": VERL_MAX_NUM_SEQS,
        "max_num_batched_tokens": VERL_MAX_NUM_BATCHED_TOKENS,
        "train": _train(params),
        "weight_sync_s": 0.0,
        "model_facts": _facts(params, 32, 4096, 8, 128, 9),
        "gpu_facts": _gpu(141e9, 4.8e12),
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
    profiles = [derive_h100(m, tp, args.vidur) for m, tp in SHIPPED] + [h200_llama_8b()]
    for prof in profiles:
        (OUT / f"{prof['name']}.json").write_text(json.dumps(prof, indent=2) + "\n")
        print(f"wrote {prof['name']}")


if __name__ == "__main__":
    main()
