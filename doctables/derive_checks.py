"""`rlsim profile derive` against what was measured or published, each figure's role stated.

`rows()` gives docs/calibrate.md's `derive_checks` table (written by `doctables/derive_table.py`): for
each check the data, whether it was fitted to or is a test, the figure and rlsim's, and the error
as found. Only the linear-layer roofline's fitting set (Vidur's H100 tables) was fitted to; every
other figure is a test, reported as it came out. `h100_linear_errors()` is what
`tests/test_derive_measured.py` holds the derivation to.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from rlsim.derive.derive import Setup, _linear_s, derive_profile, moe_experts_s, setup
from rlsim.derive.gpus import load_gpu
from rlsim.derive.models import Model, load_model, model_from_config
from rlsim.derive.moe_training import REFERENCE, efficiency_of_row, moe_training_efficiency, published
from rlsim.derive.operators import layer_shape, linear_fit
from rlsim.derive.train import Trainer, published_mfu
from rlsim.profile import load_profile, profile_from_dict
from rlsim.roofline import grid
from rlsim.step_costs import weight_sync_s

MEASURED = Path(__file__).resolve().parents[1] / "benchmarks" / "measured"  # what benchmarks/gpu_operators.py measured
H100_SXM = MEASURED / "h100-sxm"
DECODE_MAX_TOKENS = 512  # decode batches; above: prefill chunks
FUSED_MOE = MEASURED / "vllm-fused-moe-h100.csv"
# Mixtral-8x7B-Instruct-v0.1's config.json (huggingface.co/mistralai), the fields rlsim reads
MIXTRAL_8X7B = {"source": "mistralai/Mixtral-8x7B-Instruct-v0.1", "hidden_size": 4096, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000}  # fmt: skip


def a100_linear_errors() -> np.ndarray:
    """|predicted / measured - 1| of every held-out A100 row (Vidur's measured A100 layers)."""
    d = pd.read_csv(MEASURED / "vidur-a100-linear.csv", comment="#")
    a100 = load_gpu("a100")
    wb, fl = layer_shape(d)
    pred = linear_fit().layer_s(wb, fl, d.num_tokens, d.hidden_size, a100.hbm_bytes_per_s, a100.bf16_flops_per_s)
    return np.abs(pred * 1e3 / d.layer_ms.to_numpy() - 1)


def h100_linear_errors() -> pd.DataFrame:
    """Per measured row of `h100-sxm/linear_layers.csv`: the derivation's layer time on one rank
    (its linear layers over the layers) against the measured layer body, as a signed error."""
    m = pd.read_csv(H100_SXM / "linear_layers.csv")
    fit = linear_fit()
    out = []
    for (model, tp), g in m.groupby(["model", "tp"], sort=True):
        s = setup(model, "h100", int(tp))
        pred = _linear_s(s, fit, g.tokens.to_numpy(float)) / s.model.num_layers
        out.append(g.assign(predicted_s=pred, error=pred / g.layer_s.to_numpy() - 1))
    return pd.concat(out, ignore_index=True)


def _kernel_model(name: str) -> Model:
    return model_from_config(MIXTRAL_8X7B, name, "Mixtral-8x7B") if name == "mixtral-8x7b" else load_model(name)


def fused_moe_errors() -> pd.DataFrame:
    """Per published row of `vllm-fused-moe-h100.csv`: the derivation's routed experts of one MoE
    layer on one H100 rank (`moe_experts_s` without shared experts or router) against vLLM's own
    benchmark of its fused-MoE kernel at those tokens, as a signed error."""
    d = pd.read_csv(FUSED_MOE, comment="#")
    fit, out = linear_fit(), []
    for (model, tp, dtype), g in d.groupby(["model", "tp", "dtype"], sort=True):
        s = Setup(_kernel_model(model), load_gpu("h100"), "h100", int(tp), dtype=dtype)
        pred = moe_experts_s(s, fit, g.num_tokens.to_numpy(float), always=False)
        out.append(g.assign(predicted_s=pred, error=pred / (g.kernel_us.to_numpy() * 1e-6) - 1))
    return pd.concat(out, ignore_index=True)


def moe_training_rows() -> list[tuple[str, str, str, str, str, str]]:
    """Megatron-Bridge's published pre-training throughput read as each model's training efficiency
    against a dense model (`rlsim.derive.moe_training`): the H100 rows that set it, and the rows it
    is tested on (a dense 70B, and the MoE models on GB200, where rlsim uses the H100 figure)."""
    d, out = published(), []
    for i in d.index[d.model != REFERENCE]:
        row, found = d.loc[i], efficiency_of_row(d, i)
        rlsim = moe_training_efficiency(load_model(row.rlsim_model).facts("bf16", "bf16"))[0]
        data = (f"Megatron-Bridge {row.release} pre-training on {row.system}: {row.model} "
                f"({row.precision if row.precision != 'not stated' else 'precision not stated'}), "
                f"{row.tokens_per_s_per_gpu:,} tokens/s per GPU, against {REFERENCE} of that release")  # fmt: skip
        role = "cited (sets it)" if row.role == "source" else "test"
        out.append(("MoE training efficiency", data, role, f"{found:.3f}", f"{rlsim:.3f}",
                    "-" if row.role == "source" else f"{rlsim / found - 1:+.0%}"))  # fmt: skip
    return out


def _band(err: np.ndarray) -> str:
    return f"median {np.median(np.abs(err)):.1%}, worst {np.max(np.abs(err)):.1%}, mean {np.mean(err):+.1%}"


def rows() -> list[tuple[str, str, str, str, str, str]]:
    """(check, data, role, figure, rlsim, error) rows."""
    fit = linear_fit()
    out = [("linear layers", f"Vidur's H100 operator medians: Llama-2-7B, CodeLlama-34B, Qwen-72B at TP 1-8, 1-4,096 "
            f"tokens ({fit.rows:,} rows)", "fitted", "-", "-", f"mean {fit.mape:.1%}")]  # fmt: skip
    a100 = a100_linear_errors()
    out.append(
        (
            "linear layers",
            f"Vidur's A100 operator medians: Llama-2-7B, Llama-3-8B, CodeLlama-34B ({len(a100):,} "
            "rows), from the A100's datasheet",
            "test (held out)",
            "-",
            "-",
            f"mean {a100.mean():.1%}",
        )
    )
    h = h100_linear_errors()
    models = ", ".join(sorted(h.model.unique()))
    for label, part in (("decode, 1-512 tokens", h[h.tokens <= DECODE_MAX_TOKENS]),
                        ("prefill, 1,024-4,096 tokens", h[h.tokens > DECODE_MAX_TOKENS])):  # fmt: skip
        out.append(("linear layers", f"one H100 SXM, torch 2.11 in CUDA graphs ({models}; every TP vLLM accepts; "
                    f"{label}; {len(part)} rows)", "test", "-", "-", _band(part.error.to_numpy())))  # fmt: skip
    moe = fused_moe_errors()
    cases = (("mixtral-bf16-tp2-tuned", "Mixtral-8x7B bf16 TP 2 (8 experts of 14,336), vLLM's tuned config"),
             ("qwen3-30b-a3b-fp8-tp1-old-defaults", "Qwen3-30B-A3B fp8 TP 1 (128 experts of 768), the default "
              "config of the time"),
             ("qwen3-30b-a3b-fp8-tp1-new-defaults", "Qwen3-30B-A3B fp8 TP 1, the PR's defaults"))  # fmt: skip
    for case, label in cases:
        g = moe[moe.case == case]
        out.append(("routed experts (fused MoE)", f"vLLM's own kernel benchmark on one H100 (`benchmark_moe.py`, "
                    f"vllm-project/vllm PR 24700): {label}; {g.num_tokens.min():,}-{g.num_tokens.max():,} tokens, "
                    f"{len(g)} rows", "test", "-", "-", _band(g.error.to_numpy())))  # fmt: skip
    out += moe_training_rows()
    slime_fit = load_profile("h200-llama-8b")
    derived = profile_from_dict(derive_profile(setup("deepseek-r1-distill-llama-8b", "h200", 1)))
    err = np.array([b.tokens_per_s / a.tokens_per_s - 1 for a, b in zip(grid(slime_fit), grid(derived), strict=True)])
    out.append(("whole decode iteration", "slime's fit of real SGLang decode, DeepSeek-R1-Distill-Llama-8B on an "
                "H200 (`h200-llama-8b`), over batch 32-256 x context 1k-16k", "fitted (its T_w, alpha and beta "
                "set the framework, per-sequence and attention terms)", "-", "-", _band(err)))  # fmt: skip
    mfu = pd.read_csv(H100_SXM / "train_mfu.csv")
    achieved = mfu.achieved_flops_per_s / 989e12
    out.append(("trainer MFU", "fsdp2's default, from TorchTitan's published FSDP run (5,762 tokens/s per H100, "
                "Llama 3.1 8B at 8K); held against one H100 SXM running a Hugging Face Qwen2 model forward and "
                "backward over 2K-8K packed tokens (no optimizer, no sharding)", "test",
                f"{achieved.min():.1%}-{achieved.max():.1%}", f"{published_mfu('fsdp2'):.1%}",
                f"{published_mfu('fsdp2') / achieved.max() - 1:+.0%} to {published_mfu('fsdp2') / achieved.min() - 1:+.0%}"))  # fmt: skip  # noqa: E501
    slime = profile_from_dict(derive_profile(setup("deepseek-r1-distill-llama-8b", "h200", 1), trainer=Trainer()))
    sync = weight_sync_s(slime, 8)
    out.append(("weight sync", "slime's measured update of an 8B model on 8 GPUs (one node: NVLink), 2.8-5.0 s",
                "test", "2.8-5.0 s", f"{sync:.2f} s", f"{sync / 5.0 - 1:+.0%} to {sync / 2.8 - 1:+.0%}"))  # fmt: skip
    v3 = load_model("deepseek-v3")
    out.append(("parameters", "DeepSeek-V3's model card: 671B total, 37B active", "test", "671B / 37B",
                f"{v3.num_params / 1e9:.1f}B / {v3.num_active_params / 1e9:.1f}B",
                f"{v3.num_params / 671e9 - 1:+.1%} / {v3.num_active_params / 37e9 - 1:+.1%}"))  # fmt: skip
    kv = v3.facts("bf16", "bf16")["kv_bytes_per_token"]
    out.append(("MLA KV", "DeepSeek-V3 at bf16: (512 + 64) x 61 layers x 2 bytes", "arithmetic", "70,272 bytes",
                f"{kv:,.0f} bytes", f"{kv / 70272 - 1:+.0%}"))  # fmt: skip
    return out


def markdown() -> str:
    lines = ["| check | data | role | figure | rlsim | error |", "|---|---|---|---:|---:|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows()]
    return "\n".join(lines) + "\n"
