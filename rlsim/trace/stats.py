"""Summary statistics of a trace's response lengths, per epoch and overall.

`within_prompt_cv` is the median over prompts of std/mean of one visit's samples (population
std, as in the PolyTrace analysis of the verl logs). `cross_epoch_spearman` is the Spearman
rank correlation of prompt mean length between a visit and the previous one, over the prompts
seen in both: it is what history-based policies (RhymeRL HistoPipe) exploit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sstats

from rlsim.files import save_figure
from rlsim.trace.format import Trace
from rlsim.trace.presets import fit_prompt_share

METRICS = (
    "num_prompts",
    "num_samples",
    "mean_prompt_tokens",
    "mean",
    "p10",
    "p25",
    "p50",
    "p75",
    "p90",
    "p99",
    "max",
    "clip_ratio",
    "clipped_group_share",
    "within_prompt_cv",
    "prompt_share",
    "cross_epoch_spearman",
)
COMPARED = (
    "mean", "p10", "p25", "p50", "p75", "p90", "p99", "max", "clip_ratio", "clipped_group_share",
    "within_prompt_cv", "prompt_share",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class LengthStats:
    """Statistics of one epoch (or of all epochs pooled: epoch = None)."""

    epoch: int | None
    num_prompts: int
    num_samples: int
    mean_prompt_tokens: float
    mean: float
    p10: float
    p25: float
    p50: float
    p75: float
    p90: float
    p99: float
    max: int
    clip_ratio: float
    clipped_group_share: float  # groups (one prompt's visit) with at least one sample at the cap
    within_prompt_cv: float
    prompt_share: float | None  # between-prompt share of normal scores (presets.fit_prompt_share)
    cross_epoch_spearman: float | None


@dataclass(frozen=True, slots=True)
class TraceStats:
    """Per-epoch and pooled statistics plus the trace's identity."""

    model: str
    source: str
    max_response_len: int
    samples_per_prompt: int
    epochs: tuple[LengthStats, ...]
    overall: LengthStats

    def to_dict(self) -> dict:
        return asdict(self)


def _length_stats(df: pd.DataFrame, max_len: int, epoch: int | None, prev_means: pd.Series | None) -> LengthStats:
    out = df["num_output_tokens"].to_numpy(dtype=np.float64)
    grouped = df.groupby(["epoch", "prompt_id"], sort=False)["num_output_tokens"]
    g_mean, g_std = grouped.mean(), grouped.std(ddof=0)
    cv = float(np.median(g_std.to_numpy() / g_mean.to_numpy()))
    rho = None
    if prev_means is not None:
        cur = g_mean.droplevel("epoch")
        both = cur.index.intersection(prev_means.index)
        if len(both) >= 3:
            rho = float(sstats.spearmanr(cur.loc[both], prev_means.loc[both]).statistic)
    p10, p25, p50, p75, p90, p99 = np.percentile(out, [10, 25, 50, 75, 90, 99])
    at_cap = (df["finish_reason"].astype(str) == "length").to_numpy()
    clipped_groups = pd.Series(at_cap, index=df.index).groupby([df["epoch"], df["prompt_id"]], sort=False).any()
    return LengthStats(
        epoch=epoch,
        num_prompts=int(df["prompt_id"].nunique()),
        num_samples=len(df),
        mean_prompt_tokens=float(df["num_prompt_tokens"].mean()),
        mean=float(out.mean()),
        p10=float(p10),
        p25=float(p25),
        p50=float(p50),
        p75=float(p75),
        p90=float(p90),
        p99=float(p99),
        max=int(out.max()),
        clip_ratio=float(at_cap.mean()),
        clipped_group_share=float(clipped_groups.mean()),
        within_prompt_cv=cv,
        prompt_share=_prompt_share(df),
        cross_epoch_spearman=rho,
    )


def _prompt_share(df: pd.DataFrame) -> float | None:
    """`fit_prompt_share` over the groups, on the samples every group has (None if undefined)."""
    n = int(df.groupby(["epoch", "prompt_id"], sort=False).size().min())
    kept = df[df["sample_idx"] < n].sort_values(["epoch", "prompt_id", "sample_idx"])
    if n < 2 or len(kept) // n < 3 or len(kept) % n:
        return None
    return fit_prompt_share(kept["num_output_tokens"].to_numpy(float).reshape(-1, n))


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov distance: the largest gap between the two empirical CDFs."""
    return float(sstats.ks_2samp(np.asarray(a), np.asarray(b)).statistic)


def trace_stats(trace: Trace) -> TraceStats:
    """Compute `TraceStats` for a loaded trace."""
    df = trace.table
    max_len = trace.meta.max_response_len
    per_epoch, prev = [], None
    for e in trace.epochs:
        visit = df[df["epoch"] == e]
        per_epoch.append(_length_stats(visit, max_len, e, prev))
        prev = visit.groupby("prompt_id")["num_output_tokens"].mean()
    return TraceStats(
        model=trace.meta.model,
        source=trace.meta.source,
        max_response_len=max_len,
        samples_per_prompt=trace.meta.samples_per_prompt,
        epochs=tuple(per_epoch),
        overall=_length_stats(df, max_len, None, None),
    )


def relative_diff(a: float | None, b: float | None) -> float | None:
    """(b - a) / a, or None when undefined."""
    if a is None or b is None or a == 0:
        return None
    return (b - a) / a


def compare_traces(a: Trace, b: Trace) -> list[dict]:
    """`compare_stats` of two traces plus the KS distance of their lengths per scope."""
    la, lb = a.table, b.table
    ks = {"all": ks_distance(la["num_output_tokens"], lb["num_output_tokens"])}
    for e in set(a.epochs) & set(b.epochs):
        ks[f"epoch {e}"] = ks_distance(a.visit(e)["num_output_tokens"], b.visit(e)["num_output_tokens"])
    return compare_stats(trace_stats(a), trace_stats(b), ks)


def compare_stats(a: TraceStats, b: TraceStats, ks: dict[str, float] | None = None) -> list[dict]:
    """Rows of (scope, metric, a, b, relative difference) for pooled and shared epochs; `ks`
    (scope -> KS distance, B against A) adds a `ks_distance` row per scope."""
    rows = []
    scopes = [("all", a.overall, b.overall)]
    b_by_epoch = {s.epoch: s for s in b.epochs}
    scopes += [(f"epoch {s.epoch}", s, b_by_epoch[s.epoch]) for s in a.epochs if s.epoch in b_by_epoch]
    for scope, sa, sb in scopes:
        metrics = COMPARED + (("cross_epoch_spearman",) if scope != "all" else ())
        for m in metrics:
            va, vb = getattr(sa, m), getattr(sb, m)
            rows.append({"scope": scope, "metric": m, "a": va, "b": vb, "rel_diff": relative_diff(va, vb)})
        if ks and scope in ks:
            rows.append({"scope": scope, "metric": "ks_distance", "a": None, "b": ks[scope], "rel_diff": None})
    return rows


def plot_length_cdf(trace: Trace, out: str | Path, title: str | None = None) -> Path:
    """Empirical CDF of response length per epoch (log x axis), written as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for e in trace.epochs:
        x = np.sort(trace.visit(e)["num_output_tokens"].to_numpy())
        y = np.arange(1, len(x) + 1) / len(x)
        ax.step(x, y, where="post", label=f"epoch {e} (mean {x.mean():,.0f})")
    ax.axvline(trace.meta.max_response_len, color="grey", ls="--", lw=1, label="max_response_len")
    ax.set_xscale("log")
    ax.set_xlabel("response length (tokens, log scale)")
    ax.set_ylabel("fraction of responses <= length")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title or f"Response length CDF: {trace.meta.model} ({trace.meta.source})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    try:
        return save_figure(fig, out)
    finally:
        plt.close(fig)
