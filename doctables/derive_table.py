"""Derived profiles of dense and MoE models on several GPUs: decode tok/s and roofline fraction.

    python -m doctables.derive_table [--markdown | --readme]

Each row is `rlsim profile derive` of one model on one GPU (`rlsim.derive`), and each cell the
profile's steady decode at a batch and a per-sequence context: output tokens per second of one
instance, and in brackets the share of the memory roofline it reaches (the weights the batch
reads plus its KV over HBM bandwidth; `rlsim.roofline`). `*` marks a cell whose KV does not fit.
Then the checks of `doctables/derive_checks.py`: the derivation against measured and published
figures, each marked fitted or test. Pure arithmetic on datasheets, configs and committed
measurements: deterministic, so `tests/test_readme_tables.py` holds the README's tables equal to
this script's output.
"""

from __future__ import annotations

import sys

from doctables.derive_checks import markdown as checks_markdown
from rlsim.config import EngineConfig
from rlsim.derive.derive import derive_profile, setup
from rlsim.package_data.markers import emit
from rlsim.profile import profile_from_dict
from rlsim.roofline import cell

# (model, GPU, TP, EP, dtype, gpu_memory_utilization)
ROWS = (
    ("qwen2.5-7b", "h100", 1, 1, "bf16", 0.5),
    ("qwen2.5-7b", "a100", 1, 1, "bf16", 0.5),
    ("qwen2.5-7b", "l40s", 1, 1, "bf16", 0.5),
    ("qwen2.5-7b", "b200", 1, 1, "bf16", 0.5),
    ("qwen3-32b", "h100", 2, 1, "bf16", 0.5),
    ("qwen3-32b", "mi300x", 1, 1, "bf16", 0.5),
    ("qwen3-32b", "h20", 2, 1, "bf16", 0.5),
    ("qwen3-30b-a3b", "h100", 2, 1, "bf16", 0.5),
    ("qwen3-30b-a3b", "h100", 2, 2, "bf16", 0.5),
    ("qwen3-30b-a3b", "gb200", 1, 1, "bf16", 0.5),
    ("deepseek-v3", "h200", 8, 8, "fp8", 0.9),
    ("deepseek-v3", "b200", 8, 8, "fp8", 0.9),
)
POINTS = ((1, 4096), (32, 4096), (256, 4096), (256, 16384))


def main() -> None:
    head = " | ".join(f"B {b}, {c // 1024}k" for b, c in POINTS)
    lines = [f"| model | GPU | TP/EP, dtype | KV tokens | {head} |", "|---|---|---|---:|" + "---:|" * len(POINTS)]
    for model, gpu, tp, ep, dtype, util in ROWS:
        raw = derive_profile(setup(model, gpu, tp, ep, dtype), EngineConfig(gpu_memory_utilization=util))
        prof = profile_from_dict(raw, raw["name"])
        cells = []
        for b, c in POINTS:
            x = cell(prof, b, c)
            cells.append(f"{x.tokens_per_s:,.0f} ({x.roofline_fraction:.0%}){'' if x.kv_fits else '*'}")
        par = f"TP {tp}" + (f"/EP {ep}" if ep > 1 else "") + f", {dtype}" + (f", mem {util}" if util != 0.5 else "")
        lines.append(f"| {model} | {gpu} | {par} | {prof.kv_capacity_tokens:,} | " + " | ".join(cells) + " |")
    emit("derived_profiles", "\n".join(lines) + "\n", sys.argv)
    checks = checks_markdown()
    emit("derive_checks", checks, sys.argv)
    if "--markdown" not in sys.argv and "--readme" not in sys.argv:
        print("\n".join(lines) + "\n\n" + checks)


if __name__ == "__main__":
    main()
