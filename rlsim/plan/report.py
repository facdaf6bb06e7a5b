"""What `rlsim plan` shows: the finalists as a table with their seed spreads, the Pareto front of
epoch time against GPU-hours, and a plot of every candidate simulated with that front."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rlsim.files import save_figure
from rlsim.plan.space import Candidate
from rlsim.report import fit_title
from rlsim.text import counted


def spread(mean: float, rng: tuple[float, float], fmt: str = ".2f") -> str:
    """`2.31 ± 0.04`: the mean and half its min-max spread over seeds."""
    half = (rng[1] - rng[0]) / 2
    return f"{mean:{fmt}} ± {half:{fmt}}" if half > 0 else f"{mean:{fmt}}"


def share(v: float) -> str:
    """A clip ratio readable at the sizes it has: 0%, 0.001%, 2.5%."""
    if v == 0:
        return "0%"
    return f"{v:.3%}" if v < 1e-3 else f"{v:.1%}"


def objective_text(result: dict[str, Any]) -> str:
    o = result["objective"]
    parts = []
    if o["target_epoch_hours"] is not None:
        parts.append(f"fewest GPU-hours with an epoch within {o['target_epoch_hours']:g} h")
    else:
        parts.append("fastest epoch")
    if o["gpu_budget"] is not None:
        parts.append(f"on at most {counted(o['gpu_budget'], 'GPU')}")
    return " ".join(parts)


def answer_rows(result: dict[str, Any]) -> list[list[str]]:
    """policy, configuration, epoch (h), GPU-hours, clip ratio, rank (the range of places the ratio band
    leaves it, a tie where it holds more than one), meets target."""
    out = []
    for a in result["answers"]:
        lo, hi = a["rank_range"]
        rank = f"#{lo}-{hi} tie" if a["tie"] else f"#{lo}"
        meets = "-" if a["meets_target"] is None else ("yes" if a["meets_target"] else "no")
        out.append([
            a["policy"], a["label"], str(a["max_response_len"]), share(a["clip_ratio"]),
            spread(a["epoch_hours"], a["epoch_hours_range"]), spread(a["gpu_hours"], a["gpu_hours_range"], ".0f"),
            rank, meets,
        ])  # fmt: skip
    return out


def band_lines(result: dict[str, Any]) -> list[str]:
    """The finalists' error band (their epoch times) and ratio band (their ranking), once each
    where the finalists share them (they differ only by rollout engine)."""
    from rlsim.bands import band_text, ratio_text

    out = []
    for a in {str(a["error_band"]["kind"]): a for a in result["answers"]}.values():
        out.append(f"epoch times: {band_text(a['error_band'])}")
    for a in {str(a["ratio_band"]): a for a in result["answers"]}.values():
        how = (
            "a finalist ranks above another only where the other is slower under every seed by more than its median"
            if a["ratio_band"]["enough"]
            else "the seeds' order alone ranks"
        )
        out.append(f"ranks: {ratio_text(a['ratio_band'])}; {how}")
    return out


def pareto_rows(result: dict[str, Any]) -> list[list[str]]:
    fields = Candidate.__dataclass_fields__
    out = []
    for r in result["pareto"]:
        c = Candidate(**{k: r[k] for k in fields})
        out.append([r["policy"], c.label(), str(r["max_response_len"]), f"{r['epoch_hours']:.2f}",
                    f"{r['gpu_hours']:.0f}", str(r["steps_simulated"])])  # fmt: skip
    return out


def plot_plan(result: dict[str, Any], out) -> None:  # noqa: ANN001
    """Write `plan_figure` to `out`."""
    fig = plan_figure(result)
    import matplotlib.pyplot as plt

    try:
        save_figure(fig, out)
    finally:
        plt.close(fig)


def plan_figure(result: dict[str, Any]):  # noqa: ANN201 - a matplotlib Figure
    """Every candidate simulated (epoch hours against GPU-hours per epoch, one colour per policy,
    faint), the Pareto front as a step line, the finalists with their seed spreads as error bars,
    and the target as a horizontal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    fig, ax = plt.subplots(figsize=(10.5, 5), dpi=120)
    policies = list(dict.fromkeys(r["policy"] for r in result["rows"]))
    colours = {p: f"C{i % 10}" for i, p in enumerate(policies)}
    markers = "osD^vP*X"
    for i, p in enumerate(policies):
        pts = [r for r in result["rows"] if r["policy"] == p and not r.get("error")]
        ax.scatter([r["gpu_hours"] for r in pts], [r["epoch_hours"] for r in pts], s=14, alpha=0.3,
                   color=colours[p], marker=markers[i % len(markers)], label=f"{p}: candidates")  # fmt: skip
    front = sorted(result["pareto"], key=lambda r: r["gpu_hours"])
    if front:
        ax.step([r["gpu_hours"] for r in front], [r["epoch_hours"] for r in front], where="post", color="black",
                lw=1.2, label="Pareto front")  # fmt: skip
    for a in result["answers"]:
        (elo, ehi), (glo, ghi) = a["epoch_hours_range"], a["gpu_hours_range"]
        i = policies.index(a["policy"]) if a["policy"] in policies else 0
        ax.errorbar(a["gpu_hours"], a["epoch_hours"], xerr=[[a["gpu_hours"] - glo], [ghi - a["gpu_hours"]]],
                    yerr=[[a["epoch_hours"] - elo], [ehi - a["epoch_hours"]]], fmt=markers[i % len(markers)],
                    color=colours.get(a["policy"], "C0"), ms=8, mec="black", capsize=3,
                    label=f"{a['policy']}: {a['label']}")  # fmt: skip
    target = result["objective"]["target_epoch_hours"]
    if target is not None:
        ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:g} h")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(log_ticks(*ax.get_xlim())))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("GPU-hours per epoch")
    ax.set_ylabel("epoch time (hours)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, which="both", alpha=0.3)
    fit_title(fig, ax, f"Plan: {objective_text(result)} ({Path(str(result['profile'])).stem} family)", fontsize=10)
    return fig


def log_ticks(lo: float, hi: float, most: int = 10) -> list[float]:
    """Ticks for a log axis over [lo, hi]: round numbers, as many as fit `most` labels. A range within
    a decade gets linear steps (60, 80, 100, 120, 140: its upper end labelled too), a wider one
    1-2-5 steps per decade or fewer."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    if hi / lo < 10:
        steps = MaxNLocator(nbins=min(most, 6), steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi)
        return [float(f"{t:.6g}") for t in np.asarray(steps) if lo <= t <= hi]
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    for subs in ((1, 2, 3, 5, 7), (1, 2, 5), (1, 3), (1,)):
        ticks = [t for t in (s * 10.0**k for k in decades for s in subs) if lo <= t <= hi]
        if len(ticks) <= most:
            return ticks
    return ticks
