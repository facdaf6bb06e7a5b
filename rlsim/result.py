"""A run's result: its per-request and per-step tables, its summary figures, and what produced it.

Shared by the simulator (`rlsim.sim.simulate`) and real mode (`rlsim.real.run`), which fill the
same `rlsim.records.Records` and summarize them the same way, so a simulated and a real run can be
compared figure by figure and written by the same `rlsim.report`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd


@dataclass
class Result:
    """Per-request and per-step tables, the summary, and what produced them."""

    policy: str
    config: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict[str, Any]
    segments: list[list[tuple[float, float]]] = field(default_factory=list)


def summarize(steps: pd.DataFrame, requests, num_instances: int, num_gpus: int) -> dict[str, Any]:  # noqa: ANN001
    """Run-level figures: epoch times, rollout share, time-weighted bubble, waste, staleness.
    `requests` is the per-request table or its columns (a dict of lists)."""
    epoch_time = steps.groupby("epoch")["timing_s/step"].sum()
    gen = steps["timing_s/gen"]
    trained_step = np.asarray(requests["trained_step"])
    staleness = np.asarray(requests["staleness"])[trained_step >= 0]
    total = float(steps["timing_s/step"].sum())
    bias, order = steps["trained_length_bias"], steps["length_order_bias"]
    trained_tokens = steps["response_length/mean"].fillna(0).mul(steps["num_samples"]).sum()
    return {
        "epoch_time_s": {int(e): float(t) for e, t in epoch_time.items()},
        "total_time_s": total,
        "gpu_hours": total * num_gpus / 3600,
        "num_steps": len(steps),
        "rollout_share": float(gen.sum() / total) if total else 0.0,
        "bubble_ratio": float((steps["bubble_ratio"] * gen).sum() / gen.sum()) if gen.sum() else 0.0,
        "slot_bubble_ratio": float((steps["slot_bubble_ratio"] * gen).sum() / gen.sum())
        if gen.sum() and steps["slot_bubble_ratio"].notna().all()
        else None,  # None where the engine does not count running sequences (real engines)
        "rollout_tokens_per_s": float(trained_tokens / gen.sum()) if gen.sum() else 0.0,
        "first_done_idle_ratio": float((steps["rollout/first_done_idle_ratio"] * gen).sum() / gen.sum())
        if gen.sum()
        else 0.0,
        "wasted_tokens": float(steps["wasted_tokens"].sum()),
        "staleness_max": float(steps["staleness/max"].max()),
        "staleness_mean": float(staleness.mean()) if len(staleness) else 0.0,
        "trained_length_bias": float(np.average(steps["trained_length_bias"], weights=steps["num_samples"])),
        "trained_length_bias_range": [float(bias.min()), float(bias.max())],
        "length_order_bias_range": [float(order.min()), float(order.max())],
        "num_requests": len(trained_step),
        "trained_samples": len(staleness),
        "preemptions": int(np.sum(requests["preemptions"])),
        "num_instances": num_instances,
    }
