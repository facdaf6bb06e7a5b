"""`rlsim plan`: the fewest GPUs that train an epoch within a target time, per policy.

For each policy and each candidate GPU count (powers of two in the range, at multiples of the
profile's tensor parallel size) the first `steps` RL steps of an epoch are simulated and the
epoch time is estimated as their mean step time x the epoch's steps (`steps=0` simulates the
whole epoch). The answer per policy is the fewest GPUs whose estimate meets the target, with the
GPU-hours per epoch there; the best policy is the one that meets the target on the fewest GPUs,
ties broken by GPU-hours. Epoch time falls with GPUs but not always monotonically (instances
change how a batch splits), so every candidate is simulated rather than bisected.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.errors import RlsimError
from rlsim.trace import Trace


@dataclass(frozen=True, slots=True)
class PlanConfig:
    target_epoch_hours: float
    min_gpus: int = 8
    max_gpus: int = 256
    steps: int = 6  # steps simulated per candidate (0: the whole epoch)

    def __post_init__(self) -> None:
        if self.target_epoch_hours <= 0:
            raise RlsimError(f"--target-epoch-hours must be positive, got {self.target_epoch_hours}")
        if not 0 < self.min_gpus <= self.max_gpus:
            raise RlsimError(f"the GPU range {self.min_gpus}..{self.max_gpus} is empty")
        if self.steps < 0:
            raise RlsimError(f"--steps must be >= 0, got {self.steps}")


def parse_range(text: str) -> tuple[int, int]:
    """`8..256` -> (8, 256); `64` -> (64, 64)."""
    lo, sep, hi = text.partition("..")
    try:
        a, b = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise RlsimError(f"--gpus must look like 8..256 or 64, got {text!r}") from None
    if a < 1 or b < a:
        raise RlsimError(f"--gpus must be a range of at least 1 GPU, low end first, got {text!r}")
    return a, b


def candidates(min_gpus: int, max_gpus: int, tp: int) -> list[int]:
    """Powers of two in [min, max] and both ends, rounded up to whole instances of `tp` GPUs."""
    vals = {min_gpus, max_gpus} | {2**k for k in range(20) if min_gpus <= 2**k <= max_gpus}
    out = [v for v in sorted({math.ceil(v / tp) * tp for v in vals}) if v <= max_gpus]
    if not out:
        raise RlsimError(
            f"--gpus {min_gpus}..{max_gpus} holds no whole rollout instance: the profile runs at TP {tp}, so give a "
            f"range that includes a multiple of {tp}"
        )
    return out


def steps_per_epoch(trace: Trace, prompts_per_step: int) -> int:
    first = trace.table.loc[trace.table["epoch"] == trace.epochs[0], "prompt_id"].nunique()
    return math.ceil(first / prompts_per_step)


def _estimate(
    trace_path: str, policy: str, gpus: int, profile: str, rl: RLConfig, steps: int, engine: EngineConfig
) -> dict[str, Any]:
    from rlsim.simulate import simulate
    from rlsim.sweep import _trace_for

    trace = _trace_for(json.dumps({"trace": trace_path}))
    cluster = ClusterConfig(num_gpus=gpus, profile=profile)
    n_steps = steps_per_epoch(trace, rl.prompts_per_step)
    run_rl = dataclasses.replace(rl, epochs=1, max_steps=min(steps, n_steps) if steps else None)
    s = simulate(trace, policy, cluster, run_rl, tables=False, engine_cfg=engine).summary
    epoch_s = s["total_time_s"] / s["num_steps"] * n_steps
    return {"policy": policy, "gpus": gpus, "epoch_hours": epoch_s / 3600, "gpu_hours": epoch_s / 3600 * gpus,
            "steps_simulated": s["num_steps"], "steps_per_epoch": n_steps}  # fmt: skip


def plan(
    trace_path: str | Path,
    policies: Sequence[str],
    profile: str,
    rl: RLConfig,
    config: PlanConfig,
    executor: Executor | None = None,
    on_done: Callable[[dict], None] | None = None,
    engine: EngineConfig | None = None,
) -> dict[str, Any]:
    """Estimates for every (policy, GPUs) candidate, the answer per policy and the best policy."""
    from policies.registry import parse_policy
    from rlsim.profile import load_profile
    from rlsim.step_costs import with_engine

    for p in policies:
        parse_policy(p)
    engine = engine or EngineConfig()
    tp = with_engine(load_profile(profile), engine).tensor_parallel_size  # an impossible memory setting fails here
    gpus = candidates(config.min_gpus, config.max_gpus, tp)
    jobs = [(p, g) for p in policies for g in gpus]
    rows: list[dict[str, Any]] = []
    if executor is None:
        for p, g in jobs:
            rows.append(_estimate(str(trace_path), p, g, profile, rl, config.steps, engine))
            if on_done:
                on_done(rows[-1])
    else:
        futs = [executor.submit(_estimate, str(trace_path), p, g, profile, rl, config.steps, engine) for p, g in jobs]
        for f in as_completed(futs):
            rows.append(f.result())
            if on_done:
                on_done(rows[-1])
    rows.sort(key=lambda r: (list(policies).index(r["policy"]), r["gpus"]))
    answers = []
    for p in policies:
        ok = [r for r in rows if r["policy"] == p and r["epoch_hours"] <= config.target_epoch_hours]
        best = min(ok, key=lambda r: r["gpus"]) if ok else None
        answers.append({"policy": p, "gpus": best and best["gpus"], "epoch_hours": best and best["epoch_hours"],
                        "gpu_hours": best and best["gpu_hours"]})  # fmt: skip
    meeting = [a for a in answers if a["gpus"] is not None]
    best = min(meeting, key=lambda a: (a["gpus"], a["gpu_hours"])) if meeting else None
    return {"target_epoch_hours": config.target_epoch_hours, "profile": profile, "candidates": gpus,
            "rows": rows, "answers": answers, "best": best}  # fmt: skip


def plot_plan(result: dict[str, Any], out) -> None:  # noqa: ANN001
    """Epoch time against GPUs per policy, with the target as a horizontal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    markers, styles = "osD^vP*X", ("-", "--", "-.", ":")
    for k, a in enumerate(result["answers"]):
        pts = [r for r in result["rows"] if r["policy"] == a["policy"]]
        ax.plot([r["gpus"] for r in pts], [r["epoch_hours"] for r in pts], marker=markers[k % len(markers)],
                ls=styles[k % len(styles)], label=a["policy"])  # fmt: skip
    ax.axhline(result["target_epoch_hours"], color="black", ls="--", lw=1, label="target")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(result["candidates"]))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(bottom=0)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("epoch time (hours)")
    ax.set_title(f"Epoch time vs GPUs ({result['profile']})")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
