"""Write the shipped GPU profiles with `rlsim profile derive`'s own derivation (no GPU needed).

    python -m calibrate.derive_profiles

Every GPU profile but one is exactly what `rlsim profile derive --model M --gpu G --tp N` writes
at veRL's rollout defaults (`rlsim.derive.derive`, whose docstring and each file's `provenance`
cite every constant): the H100 family that `rlsim plan --tp` searches (each Qwen2.5 model at every
TP vLLM accepts, its heads divided, where its bf16 weights fit in half of an 80 GB GPU) and the
H800 setups RollPacker ran (7B TP 1, 14B TP 2, 32B TP 4, as veRL's DAPO Qwen2.5-32B recipe rolls
out). `h200-llama-8b` is the published slime fit itself (T_w, alpha and beta fitted to real
SGLang decode logs of DeepSeek-R1-Distill-Llama-8B on an H200-class GPU, and its KV capacity), with
the model's and GPU's facts derived as for the others: the one like-for-like measurement of a
whole engine.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rlsim.derive.derive import SLIME_ALPHA_S, SLIME_BETA_S, SLIME_T_W_S, derive_profile, setup
from rlsim.profile import profile_from_dict
from rlsim.step_costs import weight_sync_s

OUT = Path(__file__).resolve().parent / "profiles"
SLIME_KV_CAPACITY = 789_000
SHIPPED = (
    ("h100", "qwen2.5-7b", 1), ("h100", "qwen2.5-14b", 2), ("h100", "qwen2.5-32b", 2), ("h100", "qwen2.5-32b", 4),
    ("h800", "qwen2.5-7b", 1), ("h800", "qwen2.5-14b", 2), ("h800", "qwen2.5-32b", 4),
    ("h100", "qwen2.5-7b", 2), ("h100", "qwen2.5-7b", 4),
    ("h100", "qwen2.5-14b", 1), ("h100", "qwen2.5-14b", 4), ("h100", "qwen2.5-14b", 8), ("h100", "qwen2.5-32b", 8),
)  # fmt: skip


def derive(gpu: str, model: str, tp: int) -> dict[str, Any]:
    """A shipped profile: `rlsim profile derive --model MODEL --gpu GPU --tp TP`."""
    return derive_profile(setup(model, gpu, tp))


def h200_llama_8b() -> dict[str, Any]:
    """The slime fit, with the model's and the GPU's facts derived."""
    prof = derive("h200", "deepseek-r1-distill-llama-8b", 1)
    fit = {"t_w_s": SLIME_T_W_S, "alpha_s": SLIME_ALPHA_S, "beta_s": SLIME_BETA_S, "gamma_s": 0.0}
    prof.pop("linear_t0_s")  # the fit has no separate weight-read intercept: the knee starts from t_w
    prof |= fit | {
        "name": "h200-llama-8b",
        "model": "DeepSeek-R1-Distill-Llama-8B",
        "prefill_s_per_token": 6.0e-6,
        "kv_capacity_tokens": SLIME_KV_CAPACITY,
        "provenance": prof["provenance"]
        | {
            "kind": "published fit",
            "decode": "t = T_w + alpha*running + beta*kv_tokens fitted to real SGLang decode logs "
            "(github.com/mjacob1002/slime @ 22a2ffb token-based-simulations/inference_throughput_model.py)",
            "prefill": "6 us/token assumed (2 x 8B FLOPs at about 2.7 PFLOP/s effective)",
            "kv_capacity": "published (engine memory setting not stated); re-derived from the model facts and "
            "141 GB when --gpu-memory-utilization is given",
        },
        "fit_error": {"published_error": "0.7-1.9% at 8k-32k response caps"},
        "rollout_engine": "sglang",  # slime rolls out with SGLang
    }
    for key in ("linear_layers", "attention", "per_sequence", "framework", "links"):
        prof["provenance"].pop(key, None)  # the fit replaces these terms
    prof["weight_sync_s"] = round(weight_sync_s(profile_from_dict(prof)), 3)
    return prof


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    keep = {f"{gpu}-{model}-tp{tp}" for gpu, model, tp in SHIPPED} | {"h200-llama-8b"}
    for stale in OUT.glob("*.json"):
        if stale.stem not in keep:
            stale.unlink()
            print(f"removed {stale.name}")
    for prof in [derive(*row) for row in SHIPPED] + [h200_llama_8b()]:
        (OUT / f"{prof['name']}.json").write_text(json.dumps(prof, indent=2) + "\n")
        print(f"wrote {prof['name']}")


if __name__ == "__main__":
    main()
