"""How much slower Megatron trains a mixture-of-experts model than a dense one, per FLOP: published.

Megatron-Bridge (the NeMo Framework's Megatron training) publishes each model's pre-training
throughput on DGX-H100 (`megatron_pretraining.csv`, with its source). Under rlsim's FLOP count
(`rlsim.derive.models.flops_per_token`: active weights and causal attention, three forwards) the
tokens per second of a model and of the dense reference, LLAMA3_8B, of the same release, system
and precision give the model's efficiency against a dense model:

    efficiency = (tokens/s x FLOPs per token)_model / (tokens/s x FLOPs per token)_LLAMA3_8B

Qwen3-30B-A3B's 128 experts of 768 train at 0.15 of it, Qwen3-235B-A22B's 128 of 1,536 at 0.28,
DeepSeek-V3's 256 of 2,048 at 0.40 (the 25.09 release, its one H100 row): the grouped GEMMs over
few tokens an expert, the token permutation and the dispatch are what a dense model does not pay.
A Megatron trainer's default MFU (`rlsim.derive.train`) and NeMo RL's fitted dense MFU
(`rlsim.derive.terms`) are a dense model's, and an MoE model trains at that times its efficiency.

A dense model's efficiency is 1 (LLAMA3_70B's published row comes to 0.93 of LLAMA3_8B's). An
MoE model with no published row takes the published model's whose expert GEMM (hidden x the
expert's intermediate size) is nearest in ratio: a stated stand-in, named in the profile's
provenance. The published throughput holds the pre-training's own expert dispatch, and rlsim
still charges a layout's expert all-to-all and the expert weights' read floor apart
(`rlsim.step_costs`), so an MoE update pays part of its dispatch twice: veRL's Qwen3-30B-A3B
phases, 10-15% long with it (docs/accuracy.md), may hold some of that. The ratio is read on
H100 and used on every GPU: on GB200 the same release puts Qwen3-30B-A3B at 0.33 and
DeepSeek-V3 at 0.58 (FP8-MX), so it is conservative there (`doctables/derive_checks.py`).
"""

from __future__ import annotations

import functools
import math
from importlib import resources
from typing import Any

import pandas as pd

from rlsim.derive.models import flops_per_token, load_model
from rlsim.errors import RlsimError

REFERENCE = "LLAMA3_8B"
SOURCE_SYSTEM = "DGX-H100"
KEY = ("num_layers", "hidden_size", "num_experts", "experts_per_token", "expert_params")


def published() -> pd.DataFrame:
    """The published rows (`megatron_pretraining.csv`)."""
    with (resources.files("rlsim.derive") / "megatron_pretraining.csv").open(encoding="utf-8") as fh:
        return pd.read_csv(fh, comment="#")


def _facts(name: str) -> dict[str, Any]:
    return load_model(name).facts("bf16", "bf16")


def _rate(tokens_per_s: float, name: str, seq_len: int) -> float:
    """FLOP/s under rlsim's count of a model trained at `tokens_per_s` on `seq_len`-token sequences."""
    return tokens_per_s * flops_per_token(load_model(name), seq_len)


def efficiency_of_row(d: pd.DataFrame, i: int) -> float:
    """Row `i`'s efficiency against LLAMA3_8B's row of the same release, system and precision."""
    row = d.loc[i]
    ref = d[(d.model == REFERENCE) & (d.release == row.release) & (d.system == row.system)
            & (d.precision == row.precision)]  # fmt: skip
    if ref.empty:
        raise ValueError(f"no {REFERENCE} row beside {row.model} ({row.release}, {row.system}, {row.precision})")
    r = ref.iloc[0]
    mine = _rate(row.tokens_per_s_per_gpu, row.rlsim_model, int(row.seq_len))
    return float(mine / _rate(r.tokens_per_s_per_gpu, r.rlsim_model, int(r.seq_len)))


@functools.cache
def _sources() -> tuple[tuple[tuple, float, str, float], ...]:
    """(architecture key, efficiency, label, expert GEMM size) of each published MoE source row."""
    d = published()
    out = []
    for i in d.index[(d.role == "source") & (d.model != REFERENCE) & (d.system == SOURCE_SYSTEM)]:
        f = _facts(d.loc[i, "rlsim_model"])
        gemm = float(f["expert_params"]) / 3
        label = f"{d.loc[i, 'model']}, Megatron-Bridge {d.loc[i, 'release']} on {SOURCE_SYSTEM}"
        out.append((tuple(float(f[k]) for k in KEY), efficiency_of_row(d, i), label, gemm))
    return tuple(out)


def moe_training_efficiency(facts: dict[str, Any]) -> tuple[float, str]:
    """(efficiency, where it comes from) of a model with these `model_facts` (the module docstring)."""
    if not facts.get("num_experts"):
        return 1.0, "a dense model"
    missing = [k for k in (*KEY, "num_active_params") if k not in facts]
    if missing:
        raise RlsimError(f"the model facts name {facts['num_experts']} experts but not {missing[0]!r}, which an MoE "
                         "model's training efficiency needs")  # fmt: skip
    key = tuple(float(facts.get(k, 0)) for k in KEY)
    for src, eff, label, _ in _sources():
        if src == key:
            return eff, label
    gemm = float(facts["expert_params"]) / 3
    _, eff, label, _ = min(_sources(), key=lambda s: abs(math.log(s[3] / gemm)))
    return eff, f"no published row: the nearest expert GEMM's ({label})"
