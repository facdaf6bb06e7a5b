"""The linear layers' time on any GPU: a roofline with efficiencies fitted to measured H100 layers.

One rank of a tensor-parallel group runs a layer's projections (and norms, activation, residual
add) over N tokens in

    t(N) = c0 + (a^p + b^p)^(1/p) + c1 x N x hidden / HBM bandwidth
    a = weight bytes / (eff_bw x HBM bandwidth)        (reading the rank's weights)
    b = N x FLOPs per token / (eff_flops x peak FLOP/s)  (computing on them)

a smooth maximum of the memory-bound and compute-bound times (p sets how sharp the knee is),
plus kernel launches (c0) and the per-token element-wise work (c1). The five constants are
fitted, in log space, to the fitting set `vidur_h100_linear.csv`: Vidur's measured H100
per-operator medians of Llama-2-7B, CodeLlama-34B and Qwen-72B at TP 1, 2, 4 and 8 and 1 to 4,096
tokens (github.com/microsoft/vidur @ 7d47513, MIT; the file carries the notice). Other GPUs take
the same efficiencies with their datasheet bandwidth and peak: Vidur's A100 measurements of
Llama-2-7B, Llama-3-8B and CodeLlama-34B are the held-out check (`tests/test_derive.py`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

H100_HBM_BYTES_PER_S, H100_BF16_FLOPS_PER_S = 3.35e12, 989e12  # the fitting set's GPU (gpus.json)


@dataclass(frozen=True, slots=True)
class LinearFit:
    """The fitted constants and the fit's error on its own set."""

    c0_s: float
    eff_bw: float
    eff_flops: float
    c1: float
    p: float
    mape: float
    rows: int

    def roofline_s(self, read_bytes, flops, hbm: float, peak: float):  # noqa: ANN001, ANN201
        """The smooth maximum of reading `read_bytes` and computing `flops` (arrays broadcast)."""
        a = np.asarray(read_bytes, dtype=float) / (self.eff_bw * hbm)
        b = np.asarray(flops, dtype=float) / (self.eff_flops * peak)
        return (a**self.p + b**self.p) ** (1.0 / self.p)

    def layer_s(self, weight_bytes, flops_per_token, tokens, hidden: int, hbm: float, peak: float):  # noqa: ANN001, ANN201
        """One layer's linear time on one rank (arrays broadcast)."""
        n = np.asarray(tokens, dtype=float)
        return self.c0_s + self.roofline_s(weight_bytes, n * flops_per_token, hbm, peak) + self.c1 * n * hidden / hbm


def layer_shape(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Weight bytes (bf16) and FLOPs per token of one layer on one rank, from the table's shape columns."""
    h, heads, kv = frame.hidden_size, frame.num_heads, frame.num_kv_heads
    hd = h // heads
    mlp = np.where(frame.gated, 3, 2) * h * frame.intermediate_size
    params = h * heads * hd + 2 * h * kv * hd + heads * hd * h + mlp
    return (params * 2 / frame.tp).to_numpy(float), (2 * params / frame.tp).to_numpy(float)


def measured_h100() -> pd.DataFrame:
    """The fitting set (`vidur_h100_linear.csv`)."""
    with (resources.files("rlsim.derive") / "vidur_h100_linear.csv").open(encoding="utf-8") as fh:
        return pd.read_csv(fh, comment="#")


@functools.cache
def linear_fit() -> LinearFit:
    """The constants fitted to the H100 measurements (deterministic; computed once per process)."""
    d = measured_h100()
    wb, fl = layer_shape(d)
    n, h, y = d.num_tokens.to_numpy(float), d.hidden_size.to_numpy(float), d.layer_ms.to_numpy(float) / 1e3
    hbm, peak = H100_HBM_BYTES_PER_S, H100_BF16_FLOPS_PER_S

    def model(x: np.ndarray) -> np.ndarray:
        c0, eb, ef, c1, p = x
        a, b = wb / (eb * hbm), n * fl / (ef * peak)
        return c0 + (a**p + b**p) ** (1 / p) + c1 * n * h / hbm

    x = least_squares(
        lambda x: np.log(model(x)) - np.log(y), [5e-5, 0.7, 0.6, 1.0, 3.0],
        bounds=([0, 0.05, 0.05, 0, 1], [1e-3, 1, 1, 1e3, 20]),
    ).x  # fmt: skip
    mape = float(np.mean(np.abs(model(x) / y - 1)))
    return LinearFit(*(float(v) for v in x), mape=mape, rows=len(d))
