"""The parts of `rlsim validate`'s difference: the replay, the iteration model, the machine.

Every part is its own computation (see `rlsim.real.validate`). The replay (JSON key `schedule`)
simulates the run with each iteration taking its measured time: it checks the schedule itself
(every simulated iteration's batch against the real one's, the finish order), and its time
difference is, by construction, the driver's time between iterations (the iteration walls tile
the engines' busy time and are charged one for one, so only the time no engine ran an iteration
is left). The iteration-model part compares the profile with the measured time of each iteration
the run executed, on the run's batches; the total compares the run with the plain simulation.
What the two errors do together is not measured on its own, so it is not shown (a remainder,
total minus the parts, would be zero or noise by construction, not a measurement).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from rlsim.calibration.fit import BUCKETS, _bucket, features
from rlsim.profile import Profile

# The columns of a run's iterations.parquet the decomposition reads.
ITERATION_NEEDS = (
    "instance", "time", "wall_s", "num_generation_requests", "num_ctx_requests", "num_ctx_tokens",
    "num_generation_tokens", "context_tokens",
)  # fmt: skip

# Others' CPU use (in cores) that differs this much between calibration and run is worth a warning.
LOAD_WARN_CPUS = 0.25
# A speed probe this much slower or faster during the run than during calibration, likewise.
PROBE_WARN = 0.05


def predicted_s(prof: Profile, its: pd.DataFrame) -> np.ndarray:
    """The profile's time for each recorded iteration, counted as the simulator counts it."""
    x = features(its)
    coef = np.array(
        [prof.t_w_s, prof.alpha_s, prof.beta_s, prof.gamma_s, prof.prefill_s_per_token, prof.prefill_request_s]
    )
    decode = its["num_generation_tokens"].to_numpy(float)
    return x @ coef + np.array([prof.compute_excess_s(n) for n in decode])


def iteration_model_part(
    prof: Profile, its: pd.DataFrame, n_instances: int, n_steps: int, real_m: dict[str, float]
) -> dict[str, Any]:
    """MAPE and signed error of the profile on the run's own iterations, by batch size, and the
    rollout and step time the summed error amounts to (per instance and step)."""
    pred, real = predicted_s(prof, its), its["wall_s"].to_numpy(float)
    ok = real > 0
    pred, real = pred[ok], real[ok]
    err = (pred - real) / real
    batch = (its["num_generation_requests"] + its["num_ctx_requests"]).to_numpy(float)[ok]
    by = {}
    for lo, hi in BUCKETS:
        m = (batch >= lo) & (batch <= hi)
        if m.any():
            by[_bucket(lo)] = {
                "iterations": int(m.sum()),
                "mape": round(float(np.abs(err[m]).mean()), 4),
                "signed_pct": round(100 * float(pred[m].sum() / real[m].sum() - 1), 2),
            }
    per_step = (pred.sum() - real.sum()) / max(n_instances, 1) / max(n_steps, 1)
    return {
        "iterations": int(ok.sum()),
        "mape": round(float(np.abs(err).mean()), 4),
        "total_time_pct": round(100 * float(pred.sum() / real.sum() - 1), 2),
        "by_batch": by,
        "rollout_time_pct": _pct(per_step, real_m["rollout_time_s"]),
        "step_time_pct": _pct(per_step, real_m["step_time_s"]),
    }


def finish_order(real: pd.DataFrame, sim: pd.DataFrame, real_steps: pd.DataFrame, sim_steps: pd.DataFrame) -> dict:
    """How the replayed simulation's per-request finish times agree with the run's: Kendall's
    tau of the finish order within each step (request-count weighted), the share of steps whose
    order is the same up to ties, and the median absolute difference of the finish times, each
    measured from its side's start of the step that launched the request."""
    def finishes(req: pd.DataFrame, st: pd.DataFrame) -> pd.DataFrame:
        start = dict(zip(st["step"].astype(int), st["time/start"].astype(float), strict=True))
        done = req.loc[(req["outcome"] == "finished") & req["step"].isin(start), ["request_id", "step", "finish_time"]]
        return done.assign(finish_time=done["finish_time"] - done["step"].map(start))

    a, b = finishes(real, real_steps), finishes(sim, sim_steps)
    both = a.merge(b, on=["request_id", "step"], suffixes=("_real", "_sim"))
    taus, weights, same = [], [], 0
    for _, g in both.groupby("step"):
        if len(g) < 2:
            continue
        r, s = g["finish_time_real"].to_numpy(), g["finish_time_sim"].to_numpy()
        tau = kendalltau(r, s).statistic
        if not math.isfinite(tau):  # every finish at one instant on one side
            continue
        taus.append(tau)
        weights.append(len(g))
        same += bool(((np.sign(r[:, None] - r[None, :]) * np.sign(s[:, None] - s[None, :])) >= 0).all())
    diff = (both["finish_time_sim"] - both["finish_time_real"]).abs()
    return {
        "matched_requests": int(len(both)),
        "finished_real": int(len(a)),
        "kendall_tau": round(float(np.average(taus, weights=weights)), 4) if taus else None,
        "steps_same_order": f"{same}/{len(taus)}",
        "finish_abs_diff_median_s": round(float(diff.median()), 5) if len(diff) else None,
    }


def driver_share(steps: pd.DataFrame, its: pd.DataFrame) -> float | None:
    """Share of the real rollout time in which no engine ran an iteration: the driver's own
    work (from a step's start to its first submit, from the last finish to the rollout
    decision, policy and reward handling while the engines wait), which the simulator does not
    charge; the schedule part's remainder."""
    total = covered = 0.0
    ends, walls = its["time"].to_numpy(float), its["wall_s"].to_numpy(float)
    for a, gen in zip(steps["time/start"].astype(float), steps["timing_s/gen"].astype(float), strict=True):
        b = a + gen
        m = (ends > a) & (ends - walls < b)
        spans = sorted(zip(np.maximum(ends[m] - walls[m], a), np.minimum(ends[m], b), strict=True))
        end = a
        for lo, hi in spans:  # the union of the iterations' intervals
            if hi > end:
                covered += hi - max(lo, end)
                end = hi
        total += gen
    return round(100 * (1 - covered / total), 2) if total > 0 else None


def decompose(
    prof: Profile,
    steps: pd.DataFrame,
    requests: pd.DataFrame,
    its: pd.DataFrame | None,
    rows: list[dict[str, Any]],
    sched_rows: list[dict[str, Any]] | None,
    replayed: Any,  # noqa: ANN401 - rlsim.sim.simulate.Result or None
    n_instances: int,
) -> dict[str, Any]:
    """The replay (`schedule`), iteration-model and total parts (rollout and step time)."""
    real_m = {r["metric"]: r["real"] for r in rows}
    total = {m: _diff(rows, m) for m in ("rollout_time_s", "step_time_s")}
    parts: dict[str, Any] = {
        "total": {"rollout_time_pct": total["rollout_time_s"], "step_time_pct": total["step_time_s"]}
    }
    if its is None or sched_rows is None:
        why = "the run's iterations.parquet lacks vLLM's batches (a run recorded by an older rlsim)"
        parts["schedule"] = parts["iteration_model"] = {"not_measured": why}
        return parts
    sched = {m: _diff(sched_rows, m) for m in ("rollout_time_s", "step_time_s")}
    replay = dict(replayed.summary.get("replay", {}))
    parts["schedule"] = {
        "rollout_time_pct": sched["rollout_time_s"],
        "step_time_pct": sched["step_time_s"],
        "rows": sched_rows,
        "iterations": {"simulated": replay.get("iterations", 0), "real": int(len(its)), **replay},
        "same_batch_share": round(replay["same_batch"] / replay["iterations"], 4) if replay.get("iterations") else None,
        "driver_time_pct": driver_share(steps, its),
        "finish_order": finish_order(requests, replayed.requests, steps, replayed.steps),
    }
    parts["iteration_model"] = iteration_model_part(prof, its, n_instances, len(steps), real_m)
    return parts


def load_part(prof: Profile, steps: pd.DataFrame, host: dict[str, Any] | None) -> dict[str, Any]:
    """The machine while the profile was calibrated and while the run ran: others' CPU use and
    the speed probe (`rlsim.hostload`), with a warning when others' use differs by
    `LOAD_WARN_CPUS` or more, or the probe by `PROBE_WARN` or more. `machine_pct` is what the
    probe alone predicts for the total: (calibration probe / run probe - 1), in percent."""
    calib = (prof.provenance or {}).get("host_load") or None
    run: dict[str, float] | None = None
    if "host/others_cpus" in steps.columns:
        run = {
            "host/others_cpus": round(float(steps["host/others_cpus"].mean()), 3),
            "host/load_1m": round(float(steps["host/load_1m"].mean()), 2),
        }
    for key, name in (("probe_ms", "host/probe_ms"), ("engine_probe_ms", "host/engine_probe_ms")):
        probes = [p[key] for p in (host or {}).get("probes", []) if p.get(key) and math.isfinite(p[key])]
        if probes:
            run = (run or {}) | {name: round(float(np.mean(probes)), 3)}
    out: dict[str, Any] = {"calibration": calib, "run": run, "machine_pct": None, "warning": None}
    warnings = []
    a, b = (calib or {}).get("host/others_cpus"), (run or {}).get("host/others_cpus")
    if a is not None and b is not None and math.isfinite(a) and math.isfinite(b) and abs(a - b) >= LOAD_WARN_CPUS:
        busier = "the run" if b > a else "calibration"
        warnings.append(f"other processes used {b:.2f} CPUs during the run and {a:.2f} during calibration: {busier} "
                        "shared the machine")  # fmt: skip
    # the engine probe (the same batch timed on the engine) where both sides have it, else the Python one
    key = "host/engine_probe_ms" if (calib or {}).get("host/engine_probe_ms") and (run or {}).get(
        "host/engine_probe_ms") else "host/probe_ms"  # fmt: skip
    out["probe"] = key.split("/")[1]
    pa, pb = (calib or {}).get(key), (run or {}).get(key)
    if pa and pb:
        out["machine_pct"] = round(100 * (pa / pb - 1), 2)
        if abs(pb / pa - 1) >= PROBE_WARN:
            slower = "slower" if pb > pa else "faster"
            warnings.append(
                f"the {out['probe'].replace('_ms', '').replace('_', ' ')} took {pb:.2f} ms during the run and "
                f"{pa:.2f} ms during calibration: the machine "
                f"itself was {abs(pb / pa - 1):.0%} {slower}, which alone moves the simulated total "
                f"{out['machine_pct']:+.1f}% against the real one"
            )
    if calib is None:
        warnings.append("the profile records no host load (calibrated before rlsim recorded it, or a shipped profile)")
    out["warning"] = "; ".join(warnings) or None
    return out


def _diff(rows: list[dict[str, Any]], metric: str) -> float | None:
    d = next(r["diff_pct"] for r in rows if r["metric"] == metric)
    return None if d is None else round(float(d), 2)


def _pct(delta_s: float, base_s: float) -> float | None:
    return round(100 * float(delta_s) / base_s, 2) if base_s else None
