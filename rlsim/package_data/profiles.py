"""The shipped GPU profiles (`rlsim/profiles/`), by `rlsim profile derive`'s own derivation (no GPU).

    python -m rlsim.package_data profiles [--check]

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

import json
import math
from pathlib import Path
from typing import Any

from rlsim.derive.derive import SLIME_ALPHA_S, SLIME_BETA_S, SLIME_T_W_S, derive_profile, setup
from rlsim.profile import profile_from_dict
from rlsim.step_costs import weight_sync_s

OUT = Path(__file__).resolve().parents[1] / "profiles"
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


def build() -> dict[str, dict[str, Any]]:
    """Every shipped profile, by name."""
    return {prof["name"]: prof for prof in [derive(*row) for row in SHIPPED] + [h200_llama_8b()]}


def same(a: Any, b: Any) -> bool:  # noqa: ANN401 - JSON values
    """Two profiles equal but for the 9th significant digit of a float: the derivation's
    least-squares lines (numpy's polyfit, through LAPACK) sum in an order that can move with
    OpenBLAS's threads, and a value on a rounding edge then flips that digit (a loaded host once
    derived 4.95292476e-05 where 4.95292475e-05 is shipped)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1.1e-8, abs_tol=0.0)  # one in the 9th digit of 1.xxxxxxxx
    return a == b


def stale() -> list[str]:
    """What differs between the committed profiles and `build()`: each file missing, extra or changed."""
    built = build()
    have = {p.stem: p for p in OUT.glob("*.json")}
    out = [f"{name}.json missing" for name in built if name not in have]
    out += [f"{name}.json not built" for name in have if name not in built]
    out += [f"{name}.json differs" for name, prof in built.items()
            if name in have and not same(json.loads(have[name].read_text()), prof)]  # fmt: skip
    return out


def write() -> None:
    """Write every profile, removing one no longer shipped."""
    built = build()
    OUT.mkdir(parents=True, exist_ok=True)
    for stale_file in OUT.glob("*.json"):
        if stale_file.stem not in built:
            stale_file.unlink()
            print(f"profiles: removed {stale_file.name}")
    for name, prof in built.items():
        (OUT / f"{name}.json").write_text(json.dumps(prof, indent=2) + "\n")
    print(f"profiles: wrote {len(built)} to {OUT}")
