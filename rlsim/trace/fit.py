"""Fit the length generator to a user's own log or trace (`rlsim trace fit`).

The result is a `Preset` (`rlsim.trace.presets`: the shipped copula form or the hierarchical one,
whichever reproduces the log better) saved as JSON, which `rlsim trace synth --preset
my.preset.json` generates from at any scale. What is fitted:

- the **length body**: log-length quantile knots at `FIT_LEVELS` (dense, so the body's shape,
  not a parametric guess, is what is reproduced);
- the **tail and clip mass at the cap**: responses at the cap are censored (their length had
  they not been cut is unknown), so knots stop below the clipped share `c` and one knot puts
  level `1 - c` exactly at the cap: a fresh draw reaches the cap with probability `c`;
- the **prompt share** of the latent (between-prompt share of variance of the lengths' normal
  scores), which sets the within-prompt spread; the fitted model's within-prompt CV and share of
  groups with a clipped sample are reported against the log's;
- **prompt lengths** (median, log spread, their correlation with the prompt's latent);
- **growth over steps** when the log spans steps (`step` column): a log-linear trend of the mean
  length per step, used only where it is larger than twice its standard error (a handful of
  steps rarely shows one), knots then describing the log's first step;
- `rho`, a prompt's latent carried to its next visit, where prompts are seen more than once;
  otherwise the presets' 0.9, and said;
- the reward model (solve rate by length) where the trace holds rewards.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy import special, stats

from rlsim.errors import RlsimError
from rlsim.trace.fit_check import check_fit, check_rows, synth_like
from rlsim.trace.format import Trace
from rlsim.trace.presets import Preset, fit_prompt_share, fit_reward_model

FIT_LEVELS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.035,
    *[round(0.05 * k, 2) for k in range(1, 20)],
    0.965,
    0.98,
    0.99,
    0.995,
    0.999,
)
DEFAULT_RHO = 0.9
MIN_RECURRING = 10  # prompts seen on consecutive visits needed to fit rho


def _normal_scores(x: np.ndarray) -> np.ndarray:
    ranks = stats.rankdata(x.ravel())
    return special.ndtri((ranks - 0.5) / ranks.size).reshape(x.shape)


def _groups(trace: Trace) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(the rows, sorted, first R of every group; lengths as visits x samples; prompt tokens,
    epoch and prompt per visit)."""
    df = trace.table.sort_values(["epoch", "prompt_id", "sample_idx"])
    n = trace.meta.samples_per_prompt
    df = df[df["sample_idx"] < n]
    lengths = df["num_output_tokens"].to_numpy(np.int64).reshape(-1, n)
    first = df.iloc[::n]
    return (
        df,
        lengths,
        first["num_prompt_tokens"].to_numpy(np.int64),
        first["epoch"].to_numpy(),
        first["prompt_id"].to_numpy(),
    )


def _growth(trace: Trace, notes: list[str]) -> tuple[float, tuple[int, ...], tuple[float, ...]]:
    """(log-slope per step, growth_steps, growth_mean) of the per-step mean length, or flat."""
    if "step" not in trace.table.columns:
        notes.append("growth: the trace has no `step` column, so no growth over steps is fitted")
        return 0.0, (), ()
    df = trace.table
    per_step = df.groupby("step")["num_output_tokens"].mean()
    if len(per_step) < 3:
        notes.append(f"growth: {len(per_step)} steps are too few to fit a trend; lengths held flat")
        return 0.0, (), ()
    steps = per_step.index.to_numpy(float)
    y = np.log(per_step.to_numpy(float))
    slope, intercept = np.polyfit(steps, y, 1)
    resid = y - (slope * steps + intercept)
    se = math.sqrt(resid.var(ddof=2) / ((steps - steps.mean()) ** 2).sum()) if len(steps) > 2 else math.inf
    rel = math.expm1(slope)
    if abs(slope) <= 2 * se:
        notes.append(
            f"growth: mean length changes {rel:+.1%} per step +- {se:.1%} over {len(steps)} steps, within noise; "
            "lengths held flat"
        )
        return 0.0, (), ()
    first, last = int(steps.min()), int(steps.max())
    span = (0, last - first)
    notes.append(f"growth: mean length changes {rel:+.2%} per step (+- {se:.2%}) over steps {first}-{last}; fitted")
    return float(slope), span, tuple(float(math.exp(slope * s)) for s in span)


RESID_LEVELS = (0.005, 0.02, 0.05, *[round(0.1 * k, 1) for k in range(1, 10)], 0.95, 0.98, 0.995)


def fit_preset(trace: Trace, name: str) -> tuple[Preset, list[str]]:
    """Fit a `Preset` to a trace (see module docstring); returns it and what the fit says.

    Two forms are fitted and the one whose synthetic draw is closer to the trace (KS distance
    plus the gaps in within-prompt CV, groups with a clipped sample and prompt share) is kept:
    the shipped presets' copula, and a hierarchical form (a prompt's log centre plus a residual
    whose spread depends on the centre), which is what long-reasoning logs need, where the
    prompt sets the length scale and samples of one prompt stay close to each other."""
    notes: list[str] = []
    table, lengths, prompt_tokens, epochs, prompt_ids = _groups(trace)
    cap = trace.meta.max_response_len
    if lengths.size < 40 or len(lengths) < 5:
        raise RlsimError(f"{lengths.size} responses in {len(lengths)} groups are too few to fit a length model")
    slope, growth_steps, growth_mean = _growth(trace, notes)
    shift = 0.0
    if growth_steps:  # describe the first step: undo the trend from each response's own step
        step = table["step"].to_numpy(float).reshape(lengths.shape)
        shift = slope * (step - step.min())
    logs = np.log(lengths.astype(float)) - shift
    clipped = lengths >= cap
    clip = float(clipped.mean())
    if clip > 0:
        notes.append(f"clip mass at the cap {cap:,}: {clip:.1%} of responses")
    share = fit_prompt_share(lengths)
    notes.insert(0, f"prompt share of the latent {share:.3f} (between-prompt share of the lengths' normal scores)")
    log_p = np.log(prompt_tokens.astype(float))
    common = dict(
        name=name,
        model=trace.meta.model,
        max_response_len=cap,
        prompt_share=round(share, 4),
        prompt_len_median=float(np.median(prompt_tokens)),
        prompt_len_sigma=round(float(log_p.std()), 4),
        growth_steps=growth_steps,
        growth_mean=tuple(round(g, 6) for g in growth_mean),
        fitted_to=f"{trace.meta.source}: {lengths.size:,} responses, {len(lengths):,} groups of {lengths.shape[1]}",
    )
    z_prompt = _normal_scores(log_p)
    candidates = {
        "copula": _copula(logs, clipped, cap, share, z_prompt, epochs, prompt_ids, common),
        "hierarchical": _calibrated_hierarchical(trace, logs, clipped, cap, z_prompt, epochs, prompt_ids, common),
    }
    scores = {}
    for form, preset in candidates.items():
        rows = {r["metric"]: r for r in check_fit(preset, trace)}
        gaps = [abs(rows[m]["b"] - rows[m]["a"]) for m in ("within_prompt_cv", "clipped_group_share", "prompt_share")
                if rows[m]["a"] is not None and rows[m]["b"] is not None]  # fmt: skip
        scores[form] = rows["ks_distance"]["b"] + sum(gaps)
    form = min(scores, key=scores.get)
    notes.append(
        f"form: {form} (distance to the log {scores[form]:.3f}; "
        + ", ".join(f"{k} {v:.3f}" for k, v in scores.items() if k != form)
        + "; KS plus the gaps in within-prompt CV, clipped groups and prompt share)"
    )
    preset = candidates[form]
    recurring = _consecutive_visits(epochs, prompt_ids)
    notes.append(
        f"rho {preset.rho:.3f} from {recurring:,} prompts seen on consecutive visits"
        if recurring >= MIN_RECURRING
        else f"rho: no prompt is seen on two visits, so rho is the presets' {DEFAULT_RHO}"
    )
    if "reward" in table.columns:
        preset = _with_rewards(table, preset, lengths, notes)
    return preset, notes


def _knots(values: np.ndarray, levels: tuple[float, ...], top: float, n: int) -> tuple[list[float], list[float]]:
    """(z, value) knots of the empirical quantiles at the levels below `top` (censored above)."""
    kept = [q for q in levels if q < top - 0.5 / n]
    return [float(special.ndtri(q)) for q in kept], [float(np.quantile(values, q)) for q in kept]


def _copula(logs, clipped, cap, share, z_prompt, epochs, prompt_ids, common) -> Preset:  # noqa: ANN001
    """The shipped presets' form: one quantile function of a latent shared within a prompt."""
    clip = float(clipped.mean())
    body = np.where(clipped, np.inf, logs)  # censored at the cap: above every body value
    z_knots, log_knots = _knots(body, FIT_LEVELS, 1.0 - clip, logs.size)
    if len(z_knots) < 2:
        raise RlsimError(f"{clip:.0%} of responses sit at the cap: too few below it to fit a length body")
    if clip > 0:
        z_knots.append(float(special.ndtri(1.0 - clip)))
        log_knots.append(max(math.log(cap), log_knots[-1]))
    latent_hat = _normal_scores(np.exp(logs)).mean(axis=1)
    n = logs.shape[1]
    reliability = math.sqrt((share + (1 - share) / n) / share) if share > 0 else 0.0
    corr = float(np.corrcoef(z_prompt, latent_hat)[0, 1])
    corr = float(np.clip(corr * reliability, -0.99, 0.99)) if np.isfinite(corr) else 0.0
    scale = (share + (1 - share) / n) / share if share > 0 else 0.0
    rho = _fit_rho(latent_hat, epochs, prompt_ids, scale)
    return Preset(
        **common,
        rho=rho,
        z_knots=tuple(round(z, 5) for z in z_knots),
        log_len_knots=tuple(round(v, 5) for v in np.maximum.accumulate(log_knots)),
        prompt_len_corr=round(corr, 4),
    )


def _calibrated_hierarchical(trace, logs, clipped, cap, z_prompt, epochs, prompt_ids, common) -> Preset:  # noqa: ANN001
    """The hierarchical form with `excess` chosen (bisection) so that its draw clips as often as
    the log does. A response cut at the cap would have run longer by an unknown amount; `excess`
    is that amount in log length, added to the residuals of the cut responses."""
    def build(excess: float) -> Preset:
        return _hierarchical(logs, clipped, cap, z_prompt, epochs, prompt_ids, common, excess)

    target = float(clipped.mean())
    if target == 0:
        return build(0.0)

    def clip_of(preset: Preset) -> float:
        return float((synth_like(preset, trace)["num_output_tokens"] >= cap).mean())

    lo, hi = 0.0, 4.0
    if clip_of(build(hi)) < target:
        return build(hi)
    for _ in range(14):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if clip_of(build(mid)) < target else (lo, mid)
    return build(round(hi, 4))


def _hierarchical(logs, clipped, cap, z_prompt, epochs, prompt_ids, common, excess) -> Preset:  # noqa: ANN001
    """A prompt's log centre (the median of its samples' log lengths, responses at the cap
    counting at the cap) from one quantile function of the prompt latent, plus a residual whose
    quantiles are fitted per tercile of the centre (the spread narrows as lengths near the cap);
    cut responses' residuals are raised by `excess` (see `_calibrated_hierarchical`)."""
    centre = np.median(logs, axis=1)
    z_knots, c_knots = _knots(centre, FIT_LEVELS, 1.0, len(centre))
    resid = logs - centre[:, None] + np.where(clipped, excess, 0.0)
    rz = [float(special.ndtri(q)) for q in RESID_LEVELS]
    n_bins = 3 if len(centre) >= 30 else 1
    edges = np.quantile(centre, [k / n_bins for k in range(1, n_bins)])
    which = np.digitize(centre, edges)
    rows = []
    for b in range(n_bins):
        r = resid[which == b].ravel()
        rows.append(tuple(round(v, 5) for v in np.maximum.accumulate(np.quantile(r, RESID_LEVELS))))
    latent_hat = _normal_scores(centre)
    corr = float(np.corrcoef(z_prompt, latent_hat)[0, 1])
    rho = _fit_rho(latent_hat, epochs, prompt_ids, 1.0)
    return Preset(
        **common,
        rho=rho,
        z_knots=tuple(round(z, 5) for z in z_knots),
        log_len_knots=tuple(round(v, 5) for v in np.maximum.accumulate(c_knots)),
        prompt_len_corr=round(float(np.clip(corr, -0.99, 0.99)) if np.isfinite(corr) else 0.0, 4),
        resid_z_knots=tuple(round(z, 5) for z in rz),
        resid_log_knots=tuple(rows),
        resid_bins=tuple(round(float(special.ndtri(k / n_bins)), 5) for k in range(1, n_bins)),
    )


def _consecutive_visits(epochs: np.ndarray, prompt_ids: np.ndarray) -> int:
    """How many visits follow the same prompt's visit in the previous epoch."""
    seen = set(zip(epochs.tolist(), prompt_ids.tolist(), strict=True))
    return sum((e - 1, p) in seen for e, p in seen)


def _fit_rho(latent_hat: np.ndarray, epochs: np.ndarray, prompt_ids: np.ndarray, scale: float) -> float:
    """Carry-over of a prompt's latent from one visit to the next: the correlation of its
    estimates on consecutive visits times `scale` (undoing the noise of an n-sample estimate);
    the presets' 0.9 where fewer than `MIN_RECURRING` prompts are seen twice."""
    by_visit = {(int(e), int(p)): v for e, p, v in zip(epochs, prompt_ids, latent_hat, strict=True)}
    pairs = [(by_visit[(e - 1, p)], v) for (e, p), v in by_visit.items() if (e - 1, p) in by_visit]
    if len(pairs) < MIN_RECURRING or scale <= 0:
        return DEFAULT_RHO
    a, b = np.array(pairs).T
    return round(float(np.clip(float(np.corrcoef(a, b)[0, 1]) * scale, 0.0, 1.0)), 4)


def _with_rewards(rows: pd.DataFrame, preset: Preset, lengths: np.ndarray, notes: list[str]) -> Preset:
    """Fit the reward model to which groups have mixed rewards, by quartile of mean log length."""
    rewards = rows["reward"].to_numpy(float).reshape(lengths.shape)
    kept = ~(rewards == rewards[:, :1]).all(axis=1)
    mean_log = np.log(lengths.astype(float)).mean(axis=1)
    quartile = np.digitize(mean_log, np.quantile(mean_log, [0.25, 0.5, 0.75]))
    by_q = np.array([kept[quartile == i].mean() if (quartile == i).any() else kept.mean() for i in range(4)])
    model = fit_reward_model(preset, by_q, lengths.shape[1], draws=50_000)
    notes.append(f"rewards: {kept.mean():.1%} of groups have mixed rewards; reward model (mu, tau, kappa) = {model}")
    return replace(preset, reward_model=model)


def fold_of(trace: Trace, folds: int, seed: int = 0) -> dict[int, int]:
    """prompt -> fold (0..folds-1), seeded, as equal in size as the prompt count allows."""
    prompts = np.unique(trace.table["prompt_id"].to_numpy())
    order = np.random.default_rng(seed).permutation(prompts)
    return {int(p): i % folds for i, p in enumerate(order)}


def cross_validate(trace: Trace, name: str, folds: int = 5, seed: int = 0) -> list[dict]:
    """Check rows (as `check_fit`) of a K-fold cross-validation: every fold's prompts are
    compared with a generator fitted to the other folds only, and the pooled draws of the K
    generators with the whole log, so no prompt is judged by a fit that saw it."""
    if folds < 2:
        raise RlsimError(f"cross-validation needs at least 2 folds, got {folds}")
    which = trace.table["prompt_id"].map(fold_of(trace, folds, seed)).to_numpy()
    if len(np.unique(which)) < folds:
        raise RlsimError(f"{trace.num_prompts} prompts are too few for {folds} folds")
    parts = []
    for k in range(folds):
        fit_on = Trace(trace.table[which != k].reset_index(drop=True), trace.meta)
        held = Trace(trace.table[which == k].reset_index(drop=True), trace.meta)
        preset, _ = fit_preset(fit_on, name)
        part = synth_like(preset, held, seed, min_prompts=1000)
        part["prompt_id"] += k * 10_000_000
        parts.append(part)
    pooled = Trace(pd.concat(parts, ignore_index=True), trace.meta)
    return check_rows(trace, pooled)
