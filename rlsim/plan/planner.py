"""`rlsim plan`: search placement, rollout/train split, rollout TP, engine knobs and response cap
per policy, by successive halving, with error bars on the finalists.

Objectives: the fastest epoch within `gpu_budget` GPUs, or the fewest GPU-hours per epoch whose
epoch meets `target_epoch_hours` (both: the fewest GPU-hours under the target within the budget).

Search (successive halving, as HetRL does over placements): every candidate of the space
(`rlsim.plan.space`) is simulated for `min_steps` RL steps; per policy the best `1/eta` by the
objective go on to `eta` times as many steps, and so on up to `steps`. A candidate pruned early
that lies on the Pareto front (epoch hours against GPU-hours) is then simulated for `steps` too,
until every point of the front is; each policy's best at `steps` is its finalist. The finalists
are simulated again under `seeds - 1` further data-order seeds, and every figure printed for them
is the mean over seeds with its (min, max). A finalist ranks above another only when the other
is slower under every seed by more than the ratio band (`rlsim.bands`: how far rlsim's predicted
ratios of published pairs were off, the median; where no band is known, by any margin, the
seeds' order alone); a finalist's rank is the range of places those pairs leave it, a tie where
it holds more than one.

Epoch estimate from k simulated steps of durations d_0..d_{k-1} and n steps per epoch: the
first and last steps stand for themselves (the pipeline fills in the first, an async policy drains
in the last) and the mean of the others for the n - 2 between (k = 1: n d_0; k = 2: d_0 + (n-1) d_1).
A policy whose step is a local update on part of P0 (`fully_async`, `updates_per_step`) is
simulated for that many times the steps and its epoch has that many times the steps. For the
policies with a staleness bound, the search also tries each `staleness` value (`rlsim.plan.space`),
and a policy's candidates at every bound compete as that policy's. Searched under both rollout
engines (`--rollout-engine vllm,sglang`), a policy under each engine is searched as a policy of its
own ("sync under sglang"), so the answer gives each engine's best configuration side by side.

Every estimate is cached by its configuration (candidate, RL step, steps, seed, and digests of the
trace file, the profile and rlsim's own source) in a JSON-lines file, so a second question over an
overlapping space reuses the first's points, and a changed simulator never reuses stale ones.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

from policies.registry import make_policy, parse_policy
from rlsim.bands import for_prediction
from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.errors import RlsimError
from rlsim.plan.cache import PlanCache, code_digest, digest
from rlsim.plan.config import PlanConfig
from rlsim.plan.space import Candidate, SearchSpace, candidates, clip_ratio, with_staleness
from rlsim.plan.sweep import _trace_for
from rlsim.profile import _resolve, load_profile
from rlsim.sim.simulate import simulate
from rlsim.trace.format import Trace


def steps_per_epoch(trace: Trace, prompts_per_step: int) -> int:
    first = trace.table.loc[trace.table["epoch"] == trace.epochs[0], "prompt_id"].nunique()
    return math.ceil(first / prompts_per_step)


def rungs(cfg: PlanConfig, n_steps: int) -> list[int]:
    """Steps simulated at each rung: min_steps, x eta, ..., up to the last rung's."""
    last = min(cfg.steps or n_steps, n_steps)
    out, s = [], min(cfg.min_steps, last)
    while s < last:
        out.append(s)
        s *= cfg.eta
    return [*out, last]


def epoch_estimate_s(durations: Sequence[float], n_steps: int) -> float:
    d = list(durations)
    if len(d) == 1 or n_steps == 1:
        return d[0] * n_steps
    if len(d) == 2 or n_steps == 2:
        return d[0] + (n_steps - 1) * d[1]
    return d[0] + (n_steps - 2) * float(np.mean(d[1:-1])) + d[-1]


def score(row: dict[str, Any], cfg: PlanConfig) -> tuple[int, float]:
    """Lower is better: (0, GPU-hours) meeting the target, (1, epoch hours) missing it; with a
    budget alone, (0, epoch hours)."""
    if row.get("error"):
        return (2, math.inf)
    if cfg.target_epoch_hours is None:
        return (0, row["epoch_hours"])
    if row["epoch_hours"] <= cfg.target_epoch_hours:
        return (0, row["gpu_hours"])
    return (1, row["epoch_hours"])


def run_configs(
    c: Candidate, rl: dict[str, Any], steps: int, seed: int
) -> tuple[ClusterConfig, RLConfig, EngineConfig]:
    """What a candidate is simulated as: its cluster, the RL settings (`rl`, the run's own, at the
    candidate's response cap, for `steps` steps under `seed`) and its engine."""
    run_rl = RLConfig(**{**rl, "max_response_len": c.max_response_len, "epochs": 1, "max_steps": steps, "seed": seed})
    cluster = ClusterConfig(num_gpus=c.num_gpus, profile=c.profile, placement=c.placement, train_gpus=c.train_gpus)
    return cluster, run_rl, c.engine_config()


def estimate(trace_path: str, cand: dict[str, Any], rl: dict[str, Any], steps: int, seed: int) -> dict[str, Any]:
    """Simulate one candidate for `steps` steps under `seed` (in a worker); its estimate as a row.
    A configuration the simulator refuses (a request larger than the KV cache...) is a row with
    `error`, not a failure of the search."""
    c = Candidate(**cand)
    trace = _trace_for(json.dumps({"trace": trace_path}))
    n_steps = steps_per_epoch(trace, rl["prompts_per_step"])
    # a policy whose step is a local update on part of P0 (fully_async) runs as many more steps
    per_step = getattr(make_policy(c.policy), "updates_per_step", None)
    k = per_step(rl["prompts_per_step"]) if per_step is not None else 1.0
    run_steps = math.ceil(steps * k) if k != 1.0 else steps
    n_steps = max(1, round(n_steps * k)) if k != 1.0 else n_steps
    cluster, run_rl, engine = run_configs(c, rl, run_steps, seed)
    row: dict[str, Any] = {**cand, "steps_simulated": steps, "seed": seed, "steps_per_epoch": n_steps}
    try:
        res = simulate(trace, c.policy, cluster, run_rl, tables=False, engine_cfg=engine)
    except RlsimError as exc:
        return {**row, "error": str(exc)}
    ends = res.steps["time/end"].to_numpy()
    durations = np.diff(np.concatenate([[0.0], ends])).tolist()
    epoch_s = epoch_estimate_s(durations, n_steps)
    s = res.summary
    row.update(epoch_hours=epoch_s / 3600, gpu_hours=epoch_s / 3600 * c.num_gpus, step_s=durations,
               rollout_share=s["rollout_share"], preemptions=s["preemptions"], error=None)  # fmt: skip
    return row


def pareto(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows no other row beats on both epoch hours and GPU-hours, fastest first."""
    pts = sorted((r for r in rows if not r.get("error")), key=lambda r: (r["epoch_hours"], r["gpu_hours"]))
    front, best_gh = [], math.inf
    for r in pts:
        if r["gpu_hours"] < best_gh - 1e-12:
            front.append(r)
            best_gh = r["gpu_hours"]
    return front


def plan(
    trace_path: str | Path,
    space: SearchSpace,
    profile: str,
    rl: RLConfig,
    config: PlanConfig,
    executor: Executor | None = None,
    cache: PlanCache | None = None,
    on_done: Callable[[dict], None] | None = None,
    engine: EngineConfig | None = None,
    on_start: Callable[[int], None] | None = None,
    framework: str | None = None,
) -> dict[str, Any]:
    """Search `space` for `config`'s objective; see the module docstring. Returns the finalists
    (`answers`, one per policy, with seed spreads, ranks and ties), the best (in target mode, the
    best that meets the target under every seed), the Pareto front and every row simulated (`rows`,
    each candidate at the last rung it reached). `on_start` is told how many estimates the halving
    plans (the front's early points may add a few); `on_done` sees each estimate, cached or not.
    `engine` holds the engine settings the search does not vary; `framework` (a `--from` config's)
    sets the kind of the finalists' error and ratio bands (`rlsim.bands`)."""
    for p in space.policies:
        parse_policy(p)
    cands = candidates(space, profile, config.gpu_budget, engine)
    # a policy's candidates at every staleness bound compete as one policy's; searched under more than
    # one rollout engine, a policy under each engine competes on its own (each gets its finalist)
    by_policy = {v: p for p in space.policies for v in with_staleness(p, space.staleness)}
    several = len(space.rollout_engines) > 1

    def group_of(c: Candidate) -> str:
        p = by_policy[c.policy]
        return f"{p} under {c.engine.get('rollout_engine', 'vllm')}" if several else p

    names = list(dict.fromkeys(map(group_of, cands)))
    trace_path = str(trace_path)
    trace = _trace_for(json.dumps({"trace": trace_path}))
    for cap in space.max_response_len:
        if cap > trace.meta.max_response_len:
            raise RlsimError(
                f"--max-response-len {cap} exceeds the trace's cap {trace.meta.max_response_len}: the trace does not "
                "say how long responses would run past it"
            )
    n_steps = steps_per_epoch(trace, rl.prompts_per_step)
    steps_at = rungs(config, n_steps)
    if on_start:
        per_policy = [sum(group_of(c) == p for c in cands) for p in names]
        planned = 0
        for _ in steps_at:  # every candidate, then the best 1/eta per policy each round
            planned += sum(per_policy)
            per_policy = [max(1, math.ceil(n / config.eta)) if n else 0 for n in per_policy]
        on_start(planned + sum(1 for n in per_policy if n) * (config.seeds - 1))
    cache = cache if cache is not None else PlanCache(None)
    lengths = trace.table.loc[trace.table["epoch"] == trace.epochs[0], "num_output_tokens"].to_numpy()
    clips = {cap: clip_ratio(lengths, cap) for cap in space.max_response_len}
    rl_d = {k: v for k, v in dataclasses.asdict(rl).items() if k not in ("epochs", "max_steps", "seed")}
    base_key = {"trace": digest(trace_path), "code": code_digest(), "rl": rl_d,
                "profiles": {p: digest(_profile_path(p)) for p in {c.profile for c in cands}}}  # fmt: skip

    simulated = [0]

    def run(jobs: list[tuple[Candidate, int, int]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any] | None] = [None] * len(jobs)
        todo = []
        for i, (c, steps, seed) in enumerate(jobs):
            key = json.dumps({**base_key, "cand": c.key(), "steps": steps, "seed": seed}, sort_keys=True)
            hit = cache.get(key)
            if hit is not None:
                out[i] = hit
                if on_done:
                    on_done(hit)
            else:
                todo.append((i, key, (trace_path, dataclasses.asdict(c), rl_d, steps, seed)))
        if executor is None:
            results = ((i, key, estimate(*args)) for i, key, args in todo)
        else:
            futs = {executor.submit(estimate, *args): (i, key) for i, key, args in todo}
            results = ((*futs[f], f.result()) for f in as_completed(futs))
        for i, key, row in results:
            simulated[0] += 1
            cache.put(key, row)
            out[i] = row
            if on_done:
                on_done(row)
        return [r for r in out if r is not None]

    alive: dict[str, list[Candidate]] = {p: [c for c in cands if group_of(c) == p] for p in names}
    latest: dict[str, dict[str, Any]] = {}
    for k, steps in enumerate(steps_at):
        jobs = [(c, steps, rl.seed) for p in names for c in alive[p]]
        rows = run(jobs)
        for (c, _, _), row in zip(jobs, rows, strict=True):
            latest[c.key()] = row
        if k < len(steps_at) - 1:
            for p in names:
                ranked = sorted(alive[p], key=lambda c: score(latest[c.key()], config))
                ranked = [c for c in ranked if not latest[c.key()].get("error")]
                alive[p] = ranked[: max(1, math.ceil(len(ranked) / config.eta))] if ranked else []
    # The Pareto front is reported at the last round's steps: a candidate pruned early that sits
    # on the front is simulated as long as the finalists (and may then become its policy's best).
    fields = Candidate.__dataclass_fields__
    promoted = 0
    while True:
        early = [Candidate(**{f: r[f] for f in fields}) for r in pareto(list(latest.values()))]
        early = [c for c in early if latest[c.key()]["steps_simulated"] < steps_at[-1]]
        if not early:
            break
        promoted += len(early)
        for c, row in zip(early, run([(c, steps_at[-1], rl.seed) for c in early]), strict=True):
            latest[c.key()] = row
            alive[group_of(c)].append(c)
    finalists: dict[str, Candidate] = {}
    for p in names:
        ok = [c for c in alive[p] if not latest[c.key()].get("error")]
        if ok:
            finalists[p] = min(ok, key=lambda c: score(latest[c.key()], config))
    rows_all = [{**r, "clip_ratio": clips[r["max_response_len"]]} for r in latest.values()]
    if not finalists:
        first = next(r["error"] for r in rows_all if r.get("error"))
        raise RlsimError(f"no candidate of the search space can run: {first}")
    extra = [(c, steps_at[-1], rl.seed + s) for c in finalists.values() for s in range(1, config.seeds)]
    by_seed = {(c.key(), rl.seed): latest[c.key()] for c in finalists.values()}
    for (c, _, seed), row in zip(extra, run(extra), strict=True):
        by_seed[(c.key(), seed)] = row
    seeds = [rl.seed + s for s in range(config.seeds)]

    def bands(c: Candidate) -> dict[str, Any]:
        return for_prediction(load_profile(c.profile), c.engine.get("rollout_engine", "vllm"), framework)

    answers = _answers(finalists, by_seed, seeds, config, clips, bands)
    front = pareto(rows_all)
    meeting = [a for a in answers if config.target_epoch_hours is None or a["meets_target"]]
    best = meeting[0] if meeting else None
    return {
        "objective": {"target_epoch_hours": config.target_epoch_hours, "gpu_budget": config.gpu_budget},
        "profile": profile, "tp_profiles": {c.tp: c.profile for c in cands},
        "rungs": steps_at, "seeds": seeds, "steps_per_epoch": n_steps,
        "num_candidates": len(cands), "simulated": simulated[0], "promoted": promoted,
        "cache_hits": cache.hits, "answers": answers, "best": best, "pareto": front, "rows": rows_all,
        "no_answer": [p for p in names if p not in finalists],
    }  # fmt: skip


def _profile_path(name: str) -> Path:
    return _resolve(name)


def _answers(
    finalists: dict[str, Candidate],
    by_seed: dict[tuple[str, int], dict[str, Any]],
    seeds: list[int],
    cfg: PlanConfig,
    clips: dict[int, float],
    bands: Callable[[Candidate], dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One row per finalist: mean and (min, max) over seeds, rank per seed, best first, and ties
    (`_ties`: one ranks above another only where the other is slower under every seed by more
    than the ratio band that `bands` gives each finalist, with its error band:
    `rlsim.bands.for_prediction`)."""
    names = list(finalists)
    ranks = {p: [] for p in names}
    for seed in seeds:
        order = sorted(names, key=lambda p: score(by_seed[(finalists[p].key(), seed)], cfg))
        for r, p in enumerate(order, 1):
            ranks[p].append(r)
    out = []
    for p in names:
        c = finalists[p]
        rows = [by_seed[(c.key(), s)] for s in seeds]
        eh = [r["epoch_hours"] for r in rows]
        gh = [r["gpu_hours"] for r in rows]
        meets = None if cfg.target_epoch_hours is None else all(e <= cfg.target_epoch_hours for e in eh)
        out.append({
            **dataclasses.asdict(c), "label": c.label(), "clip_ratio": clips[c.max_response_len],
            "epoch_hours": float(np.mean(eh)), "epoch_hours_range": (min(eh), max(eh)),
            "gpu_hours": float(np.mean(gh)), "gpu_hours_range": (min(gh), max(gh)),
            "epoch_hours_by_seed": eh, "rank_by_seed": ranks[p],
            "meets_target": meets, "rollout_share": float(np.mean([r["rollout_share"] for r in rows])),
            "_scores": [score(r, cfg) for r in rows], **(bands(c) if bands else {}),
        })  # fmt: skip
    out.sort(key=lambda a: (float(np.mean(a["rank_by_seed"])), a["policy"]))
    _ties(out)
    return out


def apart(upper: list[tuple[int, float]], lower: list[tuple[int, float]], ratio_pct: float | None) -> bool:
    """Whether `lower` (scores by seed) ranks below `upper` beyond doubt: under every seed it is in
    a worse class (missing a target the other meets), or in the same class slower by more than the
    ratio band (`ratio_pct`, percent; None: by any margin, the seeds' order alone)."""
    margin = 1 + (ratio_pct or 0) / 100
    for (cu, vu), (cl, vl) in zip(upper, lower, strict=True):
        if cl < cu or (cl == cu and not vl > vu * margin):
            return False
    return True


def _ratio_pct(a: dict[str, Any]) -> float | None:
    band = a.get("ratio_band") or {}
    return band.get("median_abs_pct") if band.get("enough") else None


def _ties(answers: list[dict[str, Any]]) -> None:
    """Ranks with ties, in place, pair by pair (a tie is never passed on: two finalists apart stay
    apart whatever lies between them): a finalist's ranks run from one past those `apart` above it
    to the last but those `apart` below it, each pair by the wider of its two ratio bands
    (`rank`: its place in the order, `rank_range`, `tie` where the range holds more than one)."""
    n = len(answers)

    def sure(u: dict[str, Any], lo: dict[str, Any]) -> bool:
        known = [x for x in (_ratio_pct(u), _ratio_pct(lo)) if x is not None]
        return apart(u["_scores"], lo["_scores"], max(known) if known else None)

    for i, a in enumerate(answers):
        above = sum(sure(b, a) for j, b in enumerate(answers) if j != i)
        below = sum(sure(a, b) for j, b in enumerate(answers) if j != i)
        a["rank"] = i + 1
        a["rank_range"] = (above + 1, n - below)
        a["tie"] = above + 1 != n - below
    for a in answers:
        del a["_scores"]
