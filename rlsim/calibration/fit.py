"""Fit a profile to calibration records: the iteration model, KV capacity, training cost, spec.

    rlsim calibrate fit DIR -o profile.json [--max-mape 0.15] [--force] [--name NAME]

The iteration model (docs/architecture.md, "The model of time"),

    t = T_w + alpha * B + beta * C + gamma * N_dec + prefill * N_pre + prefill_request * R_pre

(R_pre the requests an iteration prefills, vLLM's `num_ctx_requests`; the first iteration of a cell
is timed from the cells' submission, so `prefill_request` holds each request's `add_request` as well
as its scheduling and input preparation) is fitted by non-negative least squares on relative error
to the `grid` iterations of `rlsim calibrate decode`, each row divided by its measured time (so no
regime of short or long iterations dominates the shape), and then scaled as a whole so that the
fitted iterations' predicted total equals their measured total. Iteration times are skewed (an
occasional slow iteration, never a fast one), so the relative fit tracks the typical iteration, and
the simulator, which adds iteration times up, under-predicted every total by 5-8% (the held-out
total error of the tiny CPU model's grids); the scale makes the model one of the mean iteration.
`target="median"` keeps the unscaled fit, for comparison. The
iterations of `rlsim calibrate spec` join the grid when present (speculative steps verify more tokens than they have
sequences, which is what separates alpha from gamma; without them alpha is folded into gamma and
set to 0). A quarter of the iterations, drawn with a fixed seed, are held out: the MAPE on them,
overall and per batch-size bucket, is the profile's `fit_error`, beside the grid's own repeat
noise (each cell is measured twice: the same iteration of the two repeats has the same batch,
so their difference is the machine's, and no model of these features can do better than it).
The held-out iterations' summed time per batch bucket, predicted against measured, is the
model's own error by regime: the noise of single iterations averages out of a sum of hundreds,
and a term the model lacks shows there (with beta, gamma or the prefill term left out of the
tiny CPU model's fit, a bucket's total moved by 9-17%; with all of them, by 2% or less).
The `workload` phase, which the fit never sees, is then replayed in the simulator with the
fitted profile and its predicted total time compared with the measured one.

Pure numpy/scipy: fitting needs no vLLM.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.errors import RlsimError
from rlsim.files import read_json_object
from rlsim.profile import profile_from_dict
from rlsim.sim.simulate import simulate
from rlsim.trace.format import Trace, TraceMeta

COEFFS = ("t_w_s", "alpha_s", "beta_s", "gamma_s", "prefill_s_per_token", "prefill_request_s")
BUCKETS = ((1, 1), (2, 4), (5, 16), (17, 64), (65, 256), (257, 10**9))


@dataclass(frozen=True, slots=True)
class Records:
    """One calibration directory, checked to be about one model."""

    path: Path
    facts: dict[str, Any]
    iterations: pd.DataFrame
    workload: dict[str, Any] | None
    train: dict[str, Any] | None
    spec: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class FitResult:
    coeffs: dict[str, float]
    mape: float
    mape_by_batch: dict[str, float]
    heldout_total_error: float
    n_fit: int
    n_holdout: int
    alpha_identified: bool
    notes: tuple[str, ...] = field(default_factory=tuple)
    noise: float | None = None  # the grid's repeat noise as a MAPE (None: records without cell ids)
    # summed predicted / summed measured time - 1 of each batch bucket's held-out iterations: the
    # model's own error by regime, which the host's noise averages out of (hundreds of iterations)
    total_error_by_batch: dict[str, float] = field(default_factory=dict)


def load_records(path: str | Path) -> Records:
    """Read a calibration directory; one sentence on anything missing or mixed."""
    path = Path(path)
    if not path.is_dir():
        raise RlsimError(f"{path} is not a calibration records directory")
    facts_path = path / "facts.json"
    if not facts_path.exists():
        raise RlsimError(f"{path} has no facts.json; run rlsim calibrate decode --out {path} first")
    facts = read_json_object(facts_path)
    for key in ("model", "hardware", "tensor_parallel_size", "kv_capacity_tokens", "block_size", "max_num_seqs",
                "max_num_batched_tokens", "num_gpu_blocks"):  # fmt: skip
        if key not in facts:
            raise RlsimError(f"{facts_path} lacks '{key}': not written by rlsim calibrate decode or ops")
    model = facts.get("model")
    frames = []
    for name in ("iterations.parquet", "spec_iterations.parquet"):
        if (path / name).exists():
            try:
                frames.append(pd.read_parquet(path / name))
            except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
                raise RlsimError(f"{path / name} is not a readable Parquet file ({str(exc).splitlines()[0]})") from None
            need = ("phase", "step_s", *ITERATION_COLUMNS)
            missing = [c for c in need if c not in frames[-1].columns]
            if missing:
                raise RlsimError(f"{path / name} lacks column '{missing[0]}': not calibration records")
    if not frames:
        raise RlsimError(f"{path} has no iterations.parquet")
    extra: dict[str, Any] = {}
    for name in ("workload.json", "train.json", "spec.json"):
        f = path / name
        extra[name] = read_json_object(f) if f.exists() else None
        other = (extra[name] or {}).get("model")
        if other is not None and other != model:
            raise RlsimError(
                f"{f} was measured on model {other}, but {facts_path} on {model}: records from another model"
            )
    return Records(
        path,
        facts,
        pd.concat(frames, ignore_index=True),
        extra["workload.json"],
        extra["train.json"],
        extra["spec.json"],
    )


ITERATION_COLUMNS = (
    "num_generation_requests", "num_ctx_requests", "context_tokens", "num_ctx_tokens", "num_generation_tokens",
)  # fmt: skip


def features(df: pd.DataFrame) -> np.ndarray:
    """Columns [1, B, C, N_dec, N_pre, R_pre] as the simulator counts them."""
    b = df["num_generation_requests"].to_numpy(float) + df["num_ctx_requests"].to_numpy(float)
    c = df["context_tokens"].to_numpy(float) + df["num_ctx_tokens"].to_numpy(float)
    pre = [df[k].to_numpy(float) for k in ("num_generation_tokens", "num_ctx_tokens", "num_ctx_requests")]
    return np.column_stack([np.ones(len(df)), b, c, *pre])


def _bucket(b: float) -> str:
    for lo, hi in BUCKETS:
        if lo <= b <= hi:
            return f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi < 10**9 else f">{lo - 1}")
    return "?"


def repeat_noise(df: pd.DataFrame) -> float | None:
    """The MAPE a perfect model of these features would still pay: the grid measures every cell
    `grid_repeats` times, and the k-th iteration of two repeats of a cell has the same batch.
    For a pair, |y1 - y2| / (y1 + y2) is half the difference of their relative errors; times
    sqrt(2) it estimates the mean absolute relative error of one measurement. None for records
    written before cells were numbered."""
    if "cell" not in df.columns:
        return None
    grid = df[(df["phase"] == "grid") & (df["num_generation_requests"] + df["num_ctx_requests"] > 0)].copy()
    if grid.empty:
        return None
    grid["k"] = grid.groupby("cell").cumcount()
    # the n-th measurement of a cell (batch, prompt length): cells were numbered in measuring order
    first = grid.groupby(["cell_batch", "cell_prompt_len"])["cell"].transform("min")
    a = grid[grid["cell"] == first].set_index(["cell_batch", "cell_prompt_len", "k"])["step_s"]
    b = grid[grid["cell"] != first].groupby(["cell_batch", "cell_prompt_len", "k"])["step_s"].first()
    both = a.to_frame("a").join(b.rename("b"), how="inner")
    if both.empty:
        return None
    rel = (both["a"] - both["b"]).abs() / (both["a"] + both["b"])
    return float(np.sqrt(2.0) * rel.mean())


def fit_iterations(df: pd.DataFrame, seed: int = 0, holdout: float = 0.25, target: str = "mean") -> FitResult:
    """NNLS on relative error over the model-running iterations; held-out MAPE. `target`:
    "mean" (scaled to the measured total: unbiased sums) or "median" (unscaled)."""
    if target not in ("mean", "median"):
        raise RlsimError(f"fit target must be 'mean' or 'median', got {target!r}")
    usable = (df["num_generation_requests"] + df["num_ctx_requests"]) > 0
    keep = df["phase"] == "grid"
    if "method" in df.columns:
        # HistoSpec's verify steps only (other drafters' own costs are not the model's), and not
        # the first iterations of each fresh engine (warm-up, JIT compilation).
        spec = (df["phase"] == "spec") & (df["method"] == "histospec")
        warm = df[spec].groupby(["method", "visit"]).cumcount() < 2
        keep |= spec & ~warm.reindex(df.index, fill_value=True)
    rows = df[usable & keep]
    if len(rows) < 20:
        raise RlsimError(f"only {len(rows)} usable iterations; run a larger grid")
    x, y = features(rows), rows["step_s"].to_numpy(float)
    rng = np.random.default_rng(seed)
    test = rng.random(len(rows)) < holdout
    notes = []
    # Decode-only steps compute one token per sequence, so B and N_dec move together; verify
    # steps (N_dec > decode sequences) are what tell alpha from gamma.
    alpha_ok = bool((rows["num_generation_tokens"] > rows["num_generation_requests"]).any())
    cols = [0, 1, 2, 3, 4, 5] if alpha_ok else [0, 2, 3, 4, 5]
    if not alpha_ok:
        notes.append("alpha not identifiable without speculative iterations (B = N_dec): folded into gamma")
    xf, yf = x[~test][:, cols], y[~test]
    sol, _ = nnls(xf / yf[:, None], np.ones(len(yf)))
    if target == "mean" and (xf @ sol).sum() > 0:
        sol = sol * (yf.sum() / (xf @ sol).sum())  # the same shape, scaled to the measured total
    coef = np.zeros(len(COEFFS))
    coef[cols] = sol
    pred = x @ coef
    err = np.abs(pred - y) / y
    batches = x[:, 1]
    by, total_by = {}, {}
    for lo, hi in BUCKETS:
        m = test & (batches >= lo) & (batches <= hi)
        if m.any():
            by[_bucket(lo)] = round(float(err[m].mean()), 4)
            total_by[_bucket(lo)] = round(float(pred[m].sum() / y[m].sum() - 1.0), 4)
    return FitResult(
        coeffs=dict(zip(COEFFS, (float(v) for v in coef), strict=True)),
        mape=float(err[test].mean()),
        mape_by_batch=by,
        heldout_total_error=float(pred[test].sum() / y[test].sum() - 1.0),
        n_fit=int((~test).sum()),
        n_holdout=int(test.sum()),
        alpha_identified=alpha_ok,
        notes=tuple(notes),
        noise=repeat_noise(df),
        total_error_by_batch=total_by,
    )


def train_cost(train: dict[str, Any] | None) -> tuple[dict[str, float], float, str]:
    """(profile `train` block, weight_sync_s, provenance line) from rlsim calibrate train's record."""
    if train is None:
        raise RlsimError("no train.json in the records; run rlsim calibrate train --model ... --out DIR")
    if float(train.get("achieved_flops_per_device", 0)) <= 0:
        raise RlsimError("train.json holds no positive training cost; run rlsim calibrate train again")
    block = {
        "flops_per_token": float(train["flops_per_token"]),
        "peak_flops_per_gpu": float(train["achieved_flops_per_device"]),
        "mfu": 1.0,
        "fixed_s": float(train["fixed_s"]),
    }
    note = (
        f"measured forward+backward: {train['seconds_per_token'] * 1e3:.4g} ms per trained token "
        f"on {train['hardware']} (achieved FLOP/s stands in for peak x MFU)"
    )
    if float(train.get("forward_s_per_token", 0)) > 0:  # the run's trainer, its phases apart
        block |= {"forward_fixed_s": float(train["forward_fixed_s"]),
                  "forward_s_per_token": float(train["forward_s_per_token"]),
                  "padded_micro_batch_tokens": int(train.get("padded_micro_batch_tokens", 0))}  # fmt: skip
        note = (
            f"measured with {train.get('trainer', 'the trainer')} on {train['hardware']}"
            f"{f' ({t} threads)' if (t := train.get('trainer_threads')) else ''}: old_log_prob "
            f"{train['forward_s_per_token'] * 1e3:.4g} ms per padded token + {train['forward_fixed_s']:.3g} s, "
            f"update_actor {train['seconds_per_token'] * 1e3:.4g} ms per token + {train['fixed_s']:.3g} s "
            f"(achieved FLOP/s stands in for peak x MFU), update_weights {train['weight_sync_s']:.3g} s "
            f"({train.get('weight_sync_measured', 'measured')})"
        )
    return block, float(train["weight_sync_s"]), note


def acceptance_prob(summary: dict[str, Any]) -> float | None:
    """Per-token acceptance probability of the simulator's chain model from vLLM's per-position
    counters: accepted tokens at position i over the drafts that reached i with every earlier
    token accepted (estimated as accepted(i-1) x drafted(i) / drafted(i-1))."""
    counts = summary.get("per_pos_counts", [])
    acc = [a for a, _ in counts]
    dr = [d for _, d in counts]
    if not dr or dr[0] == 0:
        return None
    trials = dr[0] + sum(acc[i - 1] * dr[i] / dr[i - 1] for i in range(1, len(dr)) if dr[i - 1])
    p = sum(acc) / trials if trials else 0.0
    return min(max(p, 0.0), 0.99)


def build_profile(rec: Records, fit: FitResult, name: str | None = None) -> dict[str, Any]:
    """The profile JSON: fitted coefficients, engine facts, training cost, provenance."""
    f = rec.facts
    train, sync_s, train_note = train_cost(rec.train)
    prof: dict[str, Any] = {
        "name": name or f"calibrated-{Path(str(f['model'])).name}-tp{f['tensor_parallel_size']}",
        "hardware": f["hardware"],
        "model": f["model"],
        "tensor_parallel_size": int(f["tensor_parallel_size"]),
        **{k: round(v, 12) for k, v in fit.coeffs.items()},
        "kv_capacity_tokens": int(f["kv_capacity_tokens"]),
        "block_size": int(f["block_size"]),
        "max_num_seqs": int(f["max_num_seqs"]),
        "max_num_batched_tokens": int(f["max_num_batched_tokens"]),
        # the scheduler the measured engine ran (records from before it was recorded: from the hardware)
        "async_scheduling": bool(f["async_scheduling"]) if "async_scheduling" in f else None,
        "train": train,
        "weight_sync_s": sync_s,
        "provenance": {
            "kind": "calibrated",
            "measured_at": f.get("measured_at"),
            "fitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": f.get("host"),
            "hardware": f["hardware"],
            "vllm_version": f.get("vllm_version"),
            "torch_version": f.get("torch_version"),
            "dtype": f.get("dtype"),
            "kv_capacity": f"(num_gpu_blocks {f['num_gpu_blocks']} - 1 null block) x block_size {f['block_size']}",
            "grid": f.get("grid"),
            "host_load": f.get("host_load"),  # others' CPU use while the grid was measured
            "train": train_note,
            "notes": list(fit.notes) + ([f"not measured: {f['not_measured']}"] if f.get("not_measured") else []),
            "source": f.get("source", "rlsim calibrate decode (vLLM)"),
            "records": str(rec.path),
            "script": "rlsim calibrate decode / rlsim calibrate spec / rlsim calibrate train; rlsim calibrate fit",
        },
        "fit_error": {
            "heldout_mape": round(fit.mape, 4),
            "heldout_mape_by_batch": fit.mape_by_batch,
            "heldout_total_time_error": round(fit.heldout_total_error, 4),
            "heldout_total_time_error_by_batch": fit.total_error_by_batch,
            "grid_repeat_noise": None if fit.noise is None else round(fit.noise, 4),
            "iterations_fit": fit.n_fit,
            "iterations_heldout": fit.n_holdout,
        },
    }
    if rec.spec:
        keys = ("mean_acceptance_length", "acceptance_rate", "per_position")
        prof["spec"] = {k: rec.spec[k] for k in keys if k in rec.spec}
        p = acceptance_prob(rec.spec["results"]["histospec"].get("visit2", {}))
        if p is not None:
            prof["spec"]["acceptance_prob"] = round(p, 4)
            prof["spec"]["source"] = "HistoSpec drafter under vLLM, second visit (rlsim calibrate spec)"
    return prof


def replay_workload(rec: Records, profile: dict[str, Any]) -> tuple[float, float] | None:
    """(measured, simulated) total time of the held-out workload phase, or None if absent."""
    if not rec.workload:
        return None

    reqs = pd.DataFrame(rec.workload["requests"])
    n_s = int(reqs["sample_idx"].max()) + 1
    n_p = int(reqs["prompt_id"].nunique())
    cap = int(reqs["max_tokens"].max())
    table = pd.DataFrame(
        {
            "epoch": np.zeros(len(reqs), dtype=np.int32),
            "prompt_id": reqs["prompt_id"].to_numpy(np.int64),
            "sample_idx": reqs["sample_idx"].to_numpy(np.int32),
            "num_prompt_tokens": reqs["num_prompt_tokens"].to_numpy(np.int32),
            "num_output_tokens": reqs["max_tokens"].to_numpy(np.int32),
            "finish_reason": "length",
        }
    )
    trace = Trace(
        table,
        TraceMeta(
            model=str(profile["model"]),
            max_response_len=cap,
            samples_per_prompt=n_s,
            source="real:calibration-workload",
        ),
    )
    prof = profile_from_dict(profile)
    cluster = ClusterConfig(num_gpus=prof.tensor_parallel_size, profile=prof.name)
    rl = RLConfig(
        prompts_per_step=n_p, samples_per_prompt=n_s, max_response_len=cap, epochs=1, max_steps=1, reward_latency_s=0.0
    )
    # The calibration engine ran with prefix caching off and never slept: so does the replay.
    engine_cfg = EngineConfig(enable_prefix_caching=False, free_cache_engine=False)
    res = simulate(trace, "sync", cluster, rl, profile=prof, engine_cfg=engine_cfg)
    return float(rec.workload["measured_total_s"]), float(res.steps["timing_s/gen"].iloc[0])


def with_workload_replay(rec: Records, profile: dict[str, Any]) -> tuple[dict[str, Any], tuple[float, float] | None]:
    """The profile with its workload replay in `fit_error` (measured and simulated seconds, the
    repeats' spread: the instrument's own noise, and the host's load), and the replay's raw
    (measured, simulated) seconds; the profile as it was, and None, where the records hold no
    workload phase."""
    replay = replay_workload(rec, profile)
    if replay is None:
        return profile, None
    measured, simulated = replay
    totals = [float(t) for t in rec.workload.get("measured_totals_s", [measured])]
    profile["fit_error"]["workload_replay"] = {
        "measured_s": round(measured, 4),
        "measured_totals_s": [round(t, 4) for t in totals],
        # The instrument's own noise: a replay error well inside it says nothing either way.
        "repeat_spread": round(max(totals) / min(totals) - 1.0, 4),
        "simulated_s": round(simulated, 4),
        "error": round(simulated / measured - 1.0, 4),
        "load_average": rec.workload.get("load_average"),
    }
    return profile, replay


def fit_gate(result: FitResult, max_mape: float, force: bool) -> str | None:
    """`rlsim calibrate fit`'s gate on the held-out MAPE: one sentence refusing a fit above
    `max_mape` (unless `force`), or a note where the grid's repeat noise explains all but half of
    it: a machine that was noisy, not a model that is wrong (the error beyond the noise is what
    the gate holds the model to); None where the fit passes."""
    if result.mape <= max_mape or force:
        return None
    if result.noise is not None and result.mape - result.noise <= max_mape / 2:
        return (
            f"held-out MAPE {result.mape:.1%} exceeds --max-mape {max_mape:.0%}, but the grid's repeat noise is "
            f"{result.noise:.1%}: the model's own error, {result.mape - result.noise:.1%}, is within "
            f"{max_mape / 2:.1%}; fitted anyway (a quieter machine gives a tighter profile)"
        )
    beyond = "" if result.noise is None else f", {result.mape - result.noise:.1%} beyond the grid's noise"
    raise RlsimError(
        f"held-out MAPE {result.mape:.1%} exceeds --max-mape {max_mape:.0%}{beyond}; profile not written "
        "(measure a larger grid, or pass --force)"
    )
