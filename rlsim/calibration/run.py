"""Framework terms calibrated on a user's own logged runs (`rlsim calibrate run`).

A run's log (veRL's `timing_s/*` names, which NeMo RL's and rlsim's own logs are written in too)
times each phase of every step. Each named term of `rlsim.derive.terms` is fitted only from the
phases that identify it, on the run's profile (derived, or measured by `rlsim calibrate`):

- `layer_iteration_s` (`iteration_overhead_s` on a profile without model facts): from
  `timing_s/gen` with the run's lengths; each engine iteration pays it per layer, so the phase is
  linear in it;
- `forward_mfu`: from `timing_s/old_log_prob` and `timing_s/ref`, the forward-only passes (or the
  two together, `timing_s/log_probs`), which go as 1/MFU of their FLOPs;
- `train_mfu`: from `timing_s/update_actor`, forward and backward, as 1/MFU;
- `refit_per_tensor_s`: from `timing_s/update_weights`, linear in it (per weight tensor of a refit).

Each phase is simulated twice, at the profile's values and with every term moved, and per step
the phase is the line (in the term, or in 1/MFU) through the two: the simulator's scheduling
does not depend on these terms for a synchronous run, so the line is exact there (and the held
out steps say how close it is for the others). The term is then the least-squares value over the
fitting steps, pooled over runs; a last simulation at the kept terms gives the held-out residual.

A log with only `timing_s/step` (a published table) identifies one term: the one whose phase
carries the largest share of the simulated step, fitted from the step time (the output says
which and why). A term the log cannot identify (its phase not logged, or the simulated phase not
depending on it) is refused in one sentence and keeps its derived value.

Uncertainty: every `hold_out_every`-th step after the first is held out of the fit and reported
phase by phase; each term's 90% interval is a bootstrap over runs where there are several, else
a block bootstrap over the run's steps (blocks of about the cube root of their number, the
usual rate for a block's length), its percentiles expanded for the few units resampled
(`expanded_tail`). A run
with fewer than 4 steps after the first is refused; a term whose interval includes 0, or is wider
than +/-50% of its value, or an MFU above 1, is not written, with the reason. The first step is
never fitted (a run's first step warms its engines and caches).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.derive.terms import Terms, derivation_digest
from rlsim.errors import RlsimError
from rlsim.profile import profile_from_dict
from rlsim.sim.simulate import simulate
from rlsim.trace.format import Trace

MIN_STEPS = 4  # after the first
GEN, STEP = "timing_s/gen", "timing_s/step"
# the forward-only passes, apart (veRL's) or together (NeMo RL's policy_and_reference_logprobs)
FORWARD = ("timing_s/old_log_prob", "timing_s/ref", "timing_s/log_probs")
UPDATE, REFIT = "timing_s/update_actor", "timing_s/update_weights"
PHASES = (GEN, *FORWARD, UPDATE, REFIT, STEP)


@dataclass(frozen=True)
class LoggedRun:
    """One logged run as the simulator replays it: its lengths, mode, cluster, RL settings and
    engine, the raw profile the terms lie over, and its metrics (one row per step: `step` and
    veRL's phase names)."""

    name: str
    trace: Trace
    policy: str
    cluster: ClusterConfig
    rl: RLConfig
    engine: EngineConfig
    profile: dict
    metrics: pd.DataFrame
    lengths: str  # where the lengths came from: the run's own, or the stand-in's description


@dataclass(frozen=True)
class TermSpec:
    """A term, the phases that identify it, whether a phase goes as it or as its reciprocal, and
    the step it is moved by to draw each step's line."""

    name: str
    phases: tuple[str, ...]
    reciprocal: bool
    why: str


@dataclass
class Calibration:
    """What `calibrate` found: the terms kept (with their intervals), the refused ones with the
    reason, the held-out residual per phase, and how many steps of how many runs it rests on."""

    terms: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    refused: dict[str, str]
    held_out: dict[str, dict[str, float]]
    runs: list[dict[str, Any]]
    steps: int
    hold_out_every: int
    derivation: dict[str, str]
    notes: list[str] = field(default_factory=list)

    def fitted_on(self) -> str:
        names = ", ".join(r["name"] for r in self.runs)
        return (f"calibrated on {self.steps} steps of {len(self.runs)} run{'s' if len(self.runs) > 1 else ''} "
                f"({names}); every {self.hold_out_every}th step after the first held out")  # fmt: skip

    def to_json(self, version: str) -> dict[str, Any]:
        """The terms file (`--terms FILE`): the kept terms, and what they rest on."""
        step = self.held_out.get(STEP, {})
        return {
            "terms": self.terms,
            "fitted_on": self.fitted_on(),
            "basis": "calibrated",
            "rlsim_version": version,
            "derivation": self.derivation,
            "calibration": {
                "runs": self.runs, "steps": self.steps, "hold_out_every": self.hold_out_every,
                "intervals_90": {k: list(v) for k, v in self.intervals.items()}, "refused": self.refused,
                "held_out": self.held_out, "step_residual_pct": step.get("worst_abs_pct"), "notes": self.notes,
            },
        }  # fmt: skip


def term_specs(raw: dict) -> list[TermSpec]:
    """The terms a run on this profile can identify, with their phases."""
    layers = float((raw.get("model_facts") or {}).get("num_layers", 0))
    gen = "layer_iteration_s" if layers else "iteration_overhead_s"
    return [
        TermSpec(gen, (GEN,), False, "generation time, each engine iteration paying it"
                 + (" per layer" if layers else " (a measured profile states no layers)")),
        TermSpec("forward_mfu", FORWARD, True, "the forward-only passes (old log-probs, reference)"),
        TermSpec("train_mfu", (UPDATE,), True, "the update (forward and backward)"),
        TermSpec("refit_per_tensor_s", (REFIT,), False, "the weight update, per tensor"),
    ]  # fmt: skip


def _base(raw: dict, spec: TermSpec) -> float | None:
    """The term's value in the profile as given (None: it does not apply to this profile)."""
    train = raw.get("train") or {}
    if spec.name == "forward_mfu":
        return float(train.get("forward_mfu") or train.get("mfu", 0)) or None
    if spec.name == "train_mfu":
        return float(train.get("mfu", 0)) or None
    if spec.name == "refit_per_tensor_s":
        v = (raw.get("gpu_facts") or {}).get("weight_sync_per_tensor_s")
        return float(v) if v is not None and raw.get("model_facts") else None
    return 0.0


def _moved(spec: TermSpec, base: float) -> float:
    """The value a term is moved to (an MFU halved; a time per unit up by a step of its scale)."""
    if spec.reciprocal:
        return base / 2
    return base + {"layer_iteration_s": 1e-4, "iteration_overhead_s": 1e-3}.get(spec.name, max(1e-3, base))


def _g(spec: TermSpec, v: float) -> float:
    return 1.0 / v if spec.reciprocal else v


def _terms_of(values: dict[str, float]) -> Terms:
    return Terms(**values)


def _simulate(run: LoggedRun, values: dict[str, float]) -> pd.DataFrame:
    """The run simulated with `values` laid over its profile: one row per logged step."""
    raw = _terms_of(values).apply(run.profile) if values else run.profile
    prof = profile_from_dict(raw, run.name)
    res = simulate(run.trace, run.policy, run.cluster, run.rl, profile=prof, engine_cfg=run.engine)
    steps = sorted(int(s) for s in run.metrics["step"])
    if len(res.steps) < len(steps):  # the lengths run out before the log does: say so, never fit a part
        raise RlsimError(
            f"{run.name}: its lengths ({run.lengths}) give {len(res.steps)} steps of {run.rl.prompts_per_step} "
            f"prompts, and the log has {len(steps)}: give lengths for every logged step"
        )
    out = res.steps.iloc[: len(steps)].assign(step=steps).set_index("step")
    return out.assign(**{"timing_s/log_probs": out["timing_s/old_log_prob"] + out["timing_s/ref"]})


def _logged(run: LoggedRun, phase: str) -> pd.Series | None:
    if phase not in run.metrics.columns:
        return None
    s = run.metrics.set_index("step")[phase].astype(float)
    return None if s.isna().all() else s


def _split(steps: Sequence[int], every: int) -> tuple[list[int], list[int]]:
    """(fitting steps, held-out steps): the first step is neither; every `every`-th after it is held out."""
    later = sorted(steps)[1:]
    held = [s for j, s in enumerate(later, 1) if j % every == 0]
    return [s for s in later if s not in held], held


def calibrate(
    runs: Sequence[LoggedRun],
    hold_out_every: int = 4,
    bootstrap: int = 1000,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> Calibration:
    """Fit the terms `term_specs` names on `runs` jointly (the module docstring)."""
    say = progress or (lambda _m: None)
    if not runs:
        raise RlsimError("calibrate needs at least one logged run")
    if hold_out_every < 2:
        raise RlsimError(f"--hold-out-every must be at least 2, got {hold_out_every}")
    for run in runs:
        n = len(run.metrics) - 1
        if n < MIN_STEPS:
            raise RlsimError(
                f"{run.name} logs {max(n, 0)} step{'s' if n != 1 else ''} after the first: a calibration needs at "
                f"least {MIN_STEPS} (the first warms the engines), so no term is fitted"
            )
    specs = term_specs(runs[0].profile)
    if any([s.name for s in term_specs(r.profile)] != [s.name for s in specs] for r in runs[1:]):
        raise RlsimError("the runs' profiles differ in kind (derived and measured): calibrate them apart")
    step_only = all(all(_logged(r, p) is None for p in PHASES if p != STEP) for r in runs)
    refused: dict[str, str] = {}
    notes: list[str] = []
    bases: dict[str, float] = {}
    for spec in specs:
        b = [_base(r.profile, spec) for r in runs]
        if any(v is None for v in b):
            refused[spec.name] = (
                "the profile measures its weight sync as a whole (weight_sync_s), with no tensor count to price"
                if spec.name == "refit_per_tensor_s" else "the profile states no trainer MFU to move"
            )
        else:
            bases[spec.name] = float(np.mean(b))
    say("simulating each run at the profile's terms")
    base_sims = [_simulate(r, {}) for r in runs]
    if step_only:  # one term: the phase with the largest share of the simulated step
        shares = {}
        for spec in specs:
            if spec.name in bases:
                cols = [p for p in spec.phases if p != "timing_s/log_probs"]  # (that is their sum)
                shares[spec.name] = sum(float(sim[[c for c in cols if c in sim]].sum().sum()) for sim in base_sims)
        chosen = max(shares, key=shares.get)
        total = sum(float(sim[STEP].sum()) for sim in base_sims)
        spec0 = next(s for s in specs if s.name == chosen)
        notes.append(
            f"the logs time only the step, which identifies one term: {chosen}, because its phase ({spec0.why}) is "
            f"{shares[chosen] / total:.0%} of the simulated step, the largest share; the others keep their values"
        )
        for spec in specs:
            if spec.name != chosen and spec.name not in refused:
                refused[spec.name] = "a step-only log identifies one term (see the note)"
        fit_specs = [TermSpec(spec0.name, (STEP,), spec0.reciprocal, spec0.why)]
    else:
        fit_specs = [s for s in specs if s.name not in refused]
    moved = {s.name: _moved(s, bases[s.name]) for s in fit_specs}
    say("simulating each run with every term moved")
    moved_sims = [_simulate(r, moved) for r in runs]
    # per run, per term: the steps' (logged, a, b) on the fitting and the held-out steps
    rows: dict[str, list[list[list[tuple[float, float, float]]]]] = {s.name: [] for s in fit_specs}  # run, step
    fitting, held = {}, {}
    for r, s0, s1 in zip(runs, base_sims, moved_sims, strict=True):
        fitting[r.name], held[r.name] = _split(list(s0.index), hold_out_every)
        for spec in fit_specs:
            g0, g1 = _g(spec, bases[spec.name]), _g(spec, moved[spec.name])
            per_step: dict[int, list[tuple[float, float, float]]] = {}  # a step's phases stay together
            for phase in spec.phases:
                real = _logged(r, phase)
                if real is None or phase not in s0.columns:
                    continue
                for st in fitting[r.name]:
                    if st in real.index and not math.isnan(real[st]):
                        b = (float(s1.at[st, phase]) - float(s0.at[st, phase])) / (g1 - g0)
                        a = float(s0.at[st, phase]) - b * g0
                        per_step.setdefault(st, []).append((float(real[st]), a, b))
            rows[spec.name].append([per_step[st] for st in sorted(per_step)])
    terms: dict[str, float] = {}
    intervals: dict[str, tuple[float, float]] = {}
    rng = np.random.default_rng(seed)
    for spec in fit_specs:
        per_run = rows[spec.name]
        flat = [x for pr in per_run for step in pr for x in step]
        if not flat:
            logged = " or ".join(spec.phases)
            refused[spec.name] = f"no run logs {logged} on its fitting steps, the phase that identifies it"
            continue
        if sum(b * b for _, _, b in flat) <= 1e-30:
            refused[spec.name] = f"the simulated {' and '.join(spec.phases)} do not depend on it in these runs"
            continue
        z = _solve(flat)
        draws, units = _bootstrap(per_run, rng, bootstrap)
        value, interval, why = _judge(spec, z, draws, units)
        if why:
            refused[spec.name] = why
        else:
            terms[spec.name] = value
            intervals[spec.name] = interval
    say("simulating each run at the calibrated terms")
    final = [_simulate(r, terms) for r in runs]
    held_out = _residuals(runs, final, held)
    n_steps = sum(len(f) + len(h) for f, h in zip(fitting.values(), held.values(), strict=True))
    described = [{"name": r.name, "policy": r.policy, "steps": len(r.metrics), "lengths": r.lengths,
                  "profile": r.profile.get("name", "")} for r in runs]  # fmt: skip
    derivation = {str(r.profile.get("name", r.name)): derivation_digest(r.profile) for r in runs}
    return Calibration(terms, intervals, refused, held_out, described, n_steps, hold_out_every, derivation, notes)


def _solve(rows: Sequence[tuple[float, float, float]]) -> float:
    """The least-squares z of logged = a + b z over the rows."""
    num = sum(b * (real - a) for real, a, b in rows)
    den = sum(b * b for _, _, b in rows)
    return num / den


def _bootstrap(
    per_run: list[list[list[tuple[float, float, float]]]], rng: np.random.Generator, n: int
) -> tuple[np.ndarray, int]:
    """z over `n` resamples (of the runs where there are several, else of blocks of the one run's
    steps), and how many units (runs or blocks) were resampled."""
    runs = [[x for step in pr for x in step] for pr in per_run if pr]
    if len(runs) > 1:
        units = runs
    else:
        steps = next(pr for pr in per_run if pr)  # the one run's fitting steps, in order, each its phases
        size = max(1, math.floor(len(steps) ** (1 / 3)))
        units = [[x for step in steps[i : i + size] for x in step] for i in range(0, len(steps), size)]
    out = []
    for _ in range(n):
        sample = [x for i in rng.integers(0, len(units), len(units)) for x in units[i]]
        if sum(b * b for _, _, b in sample) > 0:
            out.append(_solve(sample))
    return np.asarray(out), len(units)


def expanded_tail(units: int, level: float = 0.90) -> float:
    """The tail probability of the expanded percentile interval (Hesterberg, "What Teachers Should
    Know About the Bootstrap", The American Statistician 69(4), 2015): a percentile bootstrap over
    few units is too narrow, by the factor sqrt(n / (n - 1)) t_{n-1} / z; its percentiles are
    taken at Phi(-sqrt(n / (n - 1)) t_{n-1, (1 + level) / 2}) instead of (1 - level) / 2."""
    from scipy import stats

    if units < 2:
        return 0.0
    t = float(stats.t.ppf((1 + level) / 2, units - 1))
    return float(stats.norm.cdf(-math.sqrt(units / (units - 1)) * t))


def _judge(
    spec: TermSpec, z: float, draws: np.ndarray, units: int
) -> tuple[float, tuple[float, float], str | None]:
    """The term's value and 90% interval from z and its bootstrap, or the reason it is not written."""
    tail = 100 * expanded_tail(units)
    lo_z, hi_z = (float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail))) if len(draws) else (z, z)
    if spec.reciprocal:
        if z <= 0 or lo_z <= 0:
            return 0.0, (0.0, 0.0), (
                "the logged phase is no longer than what the profile charges besides the FLOPs (its 90% interval "
                "reaches an infinite MFU), so the MFU is not identified"
            )
        value, interval = 1.0 / z, (1.0 / hi_z, 1.0 / lo_z)
    else:
        value, interval = z, (lo_z, hi_z)
    text = f"{value:.4g} (90% interval {interval[0]:.4g} to {interval[1]:.4g})"
    if not spec.reciprocal and interval[0] <= 0:
        return value, interval, (
            f"its fit {text} includes 0 or less: the run is no slower than the profile here, so no term is written"
        )
    if max(value - interval[0], interval[1] - value) > 0.5 * abs(value):
        return value, interval, f"its fit {text} is wider than +/-50% of its value: the steps disagree too much"
    if spec.reciprocal and value > 1:
        return value, interval, (
            f"its fit {text} is above 1: the run's phase was faster than the profile's FLOPs at its peak "
            "(on a measured profile: faster than measured), so the profile, not the term, is off"
        )
    return value, interval, None


def _residuals(runs: Sequence[LoggedRun], final: Sequence[pd.DataFrame], held: dict[str, list[int]]) -> dict:
    """Per phase, the simulated against the logged on the held-out steps: median and worst |error|
    per step (percent), the signed error of their sums, and how many steps."""
    out: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        errs, real_sum, sim_sum = [], 0.0, 0.0
        for r, sim in zip(runs, final, strict=True):
            real = _logged(r, phase)
            if real is None or phase not in sim.columns:
                continue
            for st in held[r.name]:
                if st in real.index and st in sim.index and real[st] > 0:
                    errs.append(100.0 * (float(sim.at[st, phase]) / float(real[st]) - 1))
                    real_sum += float(real[st])
                    sim_sum += float(sim.at[st, phase])
        if errs:
            out[phase] = {"steps": len(errs), "median_abs_pct": float(np.median(np.abs(errs))),
                          "worst_abs_pct": float(np.max(np.abs(errs))),
                          "sum_pct": 100.0 * (sim_sum / real_sum - 1) if real_sum else 0.0}  # fmt: skip
    return out
