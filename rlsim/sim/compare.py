"""`compare(...)`: several policies on the same trace, cluster and work, one summary row each.

Policies are independent simulations, so they run on any `concurrent.futures.Executor` (a
process pool by default: `rlsim compare` on all policies uses every core). Each row is the
policy's `Result.summary` plus `policy` and `speedup_vs_sync` (total time of `sync` over this
policy's, when `sync` is among the rows). Same configs and seed, same rows, whatever the executor.

`compare_seeds` runs the comparison under several data-order seeds and reports each time with its
spread, and a policy whose rank changes between seeds as a tie rather than a winner.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from typing import Any

import numpy as np

from policies.registry import parse_policy
from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.sim.simulate import simulate
from rlsim.trace.format import Trace

# Relative simulation cost per policy (measured on the bundled trace), used only to submit the
# slowest first so the pool's workers finish together; unknown names count as 1.
_COST_HINT = {"sortedrl": 2.5, "rollpacker": 1.7, "seer": 1.5, "oracle": 1.4, "histopipe": 1.4, "async_partial": 1.4}


def _row(  # noqa: ANN202
    trace: Trace, name: str, cluster: ClusterConfig, rl: RLConfig, engine: EngineConfig, tools=None  # noqa: ANN001
):
    return {"policy": name, **simulate(trace, name, cluster, rl, tables=False, engine_cfg=engine, tools=tools).summary}


def compare(
    trace: Trace,
    names: Sequence[str],
    cluster: ClusterConfig,
    rl: RLConfig,
    workers: int | None = None,
    executor: Executor | None = None,
    on_done: Callable[[str], None] | None = None,
    engine_cfg: EngineConfig | None = None,
    tools=None,  # noqa: ANN001 - rlsim.driver.turns.ToolConfig (a multi-turn trace's tool workers)
) -> list[dict[str, Any]]:
    """One summary row per policy, in the order given. `workers=1` runs in this process."""
    engine_cfg = engine_cfg or EngineConfig()

    for name in names:
        parse_policy(name)  # fail fast, before any simulation starts
    workers = workers or min(os.cpu_count() or 1, len(names))
    rows: dict[str, dict[str, Any]] = {}
    if executor is None and workers <= 1:
        for name in names:
            rows[name] = _row(trace, name, cluster, rl, engine_cfg, tools)
            if on_done:
                on_done(name)
    else:
        pool = executor or ProcessPoolExecutor(max_workers=workers)
        try:
            order = sorted(names, key=lambda n: -_COST_HINT.get(n.split("+")[0].split("(")[0], 1.0))
            futures = {pool.submit(_row, trace, name, cluster, rl, engine_cfg, tools): name for name in order}
            for fut in as_completed(futures):
                rows[futures[fut]] = fut.result()
                if on_done:
                    on_done(futures[fut])
        finally:
            if executor is None:
                pool.shutdown(cancel_futures=True)
    out = [rows[n] for n in names]
    base = rows.get("sync")
    for r in out:
        r["speedup_vs_sync"] = base["total_time_s"] / r["total_time_s"] if base else None
    return out


def compare_seeds(
    trace: Trace,
    names: Sequence[str],
    cluster: ClusterConfig,
    rl: RLConfig,
    seeds: int,
    workers: int | None = None,
    on_done: Callable[[str], None] | None = None,
    engine_cfg: EngineConfig | None = None,
    tools=None,  # noqa: ANN001
) -> list[dict[str, Any]]:
    """`compare` over `seeds` data orders (seeds rl.seed, rl.seed + 1, ...), aggregated by `aggregate`."""
    runs = [
        compare(trace, names, cluster, dataclasses.replace(rl, seed=rl.seed + k), workers, on_done=on_done,
                engine_cfg=engine_cfg, tools=tools)  # fmt: skip
        for k in range(seeds)
    ]
    return aggregate(runs, [rl.seed + k for k in range(seeds)])


def aggregate(runs: Sequence[Sequence[dict[str, Any]]], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """One row per policy from the same comparison under several seeds: the first seed's row with
    the times and speedup replaced by their mean, their (min, max) beside them, the policy's rank
    by total time under each seed, and `tie` when that rank changes between seeds (the order
    between it and another policy is noise, not a result)."""
    out = []
    ranks = []
    for run in runs:
        order = np.argsort([r["total_time_s"] for r in run], kind="stable")
        rank = np.empty(len(run), dtype=int)
        rank[order] = np.arange(1, len(run) + 1)
        ranks.append(rank)
    for i, first in enumerate(runs[0]):
        rows = [run[i] for run in runs]
        total = [r["total_time_s"] for r in rows]
        row = dict(first)
        row["seeds"] = list(seeds)
        row["total_time_s"] = float(np.mean(total))
        row["total_time_s_range"] = (min(total), max(total))
        row["total_time_s_by_seed"] = total
        epochs = sorted({e for r in rows for e in r["epoch_time_s"]})
        per = {e: [r["epoch_time_s"].get(e, np.nan) for r in rows] for e in epochs}
        row["epoch_time_s"] = {e: float(np.mean(v)) for e, v in per.items()}
        row["epoch_time_s_range"] = {e: (float(np.min(v)), float(np.max(v))) for e, v in per.items()}
        speed = [r["speedup_vs_sync"] for r in rows]
        if all(s is not None for s in speed):
            row["speedup_vs_sync"] = float(np.mean(speed))
            row["speedup_vs_sync_range"] = (min(speed), max(speed))
        row["rank_by_seed"] = [int(rk[i]) for rk in ranks]
        row["tie"] = len(set(row["rank_by_seed"])) > 1
        out.append(row)
    return out
