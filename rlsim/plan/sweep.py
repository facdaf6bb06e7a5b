"""Parameter sweeps: the cartesian product of config fields, one seeded simulation per point.

A grid file (YAML):

    trace: traces/math17k.parquet        # or synthesise one per point: preset / rho / num_prompts
    fixed:                                # fields every point shares
      epochs: 1
      max_steps: 8
    grid:                                 # a list per field; the sweep is their product
      gpus: [16, 32, 64]
      policy: [sync, rollpacker, "sortedrl(mode=partial)"]
      max_response_len: [8192, 20480]

Point fields: `gpus`, `profile`, `placement`, `train_gpus`, `dispatch` (cluster);
`prompts_per_step`, `samples_per_prompt`, `max_response_len`, `epochs`, `max_steps`, `seed`,
`reward_latency_s`, `reward_workers`, `use_kl_loss` (RL step); `gpu_memory_utilization`,
`max_num_seqs`, `max_num_batched_tokens`, `enable_prefix_caching`, `free_cache_engine` (engine);
`policy` (a policy string, knobs included) and
`knobs.NAME` (a knob added to the point's policy string, e.g. `knobs.eta_p: [1.0, 1.5]`); `trace`
(a Parquet path) or `preset`, `rho`, `num_prompts`, `trace_epochs`, `prompt_share`, `start_step`,
`clip_ratio` (as in `rlsim trace synth`: a synthetic
trace from the DAPO-Math-17k prompts, its lengths drawn up to the point's `max_response_len`,
generated once per worker and cached). Every point is checked before any runs: an unknown
field, an empty list, a wrong type or an impossible config is one `RlsimError` naming the file.

Points run on any `concurrent.futures.Executor`: a process pool by default, Ray across machines
(`RayExecutor`). Each result row is the point's fields plus the simulation's summary figures. Rows
are written to the output Parquet file as points finish (atomically, whole file), so an
interrupted sweep keeps its rows, and running it again skips the points already there. Same grid,
same rows, whatever the executor and the order points finish in.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlsim.errors import RlsimError

CLUSTER_FIELDS = {"gpus": int, "profile": str, "placement": str, "train_gpus": int, "dispatch": str}
RL_FIELDS = {
    "prompts_per_step": int, "samples_per_prompt": int, "max_response_len": int, "epochs": int,
    "max_steps": int, "seed": int, "reward_latency_s": float, "reward_workers": int, "use_kl_loss": bool,
}  # fmt: skip
ENGINE_FIELDS = {
    "gpu_memory_utilization": float, "max_num_seqs": int, "max_num_batched_tokens": int,
    "enable_prefix_caching": bool, "free_cache_engine": bool, "block_size": int, "enable_chunked_prefill": bool,
}  # fmt: skip
TRACE_FIELDS = {
    "trace": str, "preset": str, "rho": float, "num_prompts": int, "trace_epochs": int, "prompt_share": float,
    "start_step": int, "clip_ratio": float,
}  # fmt: skip
FIELDS: dict[str, type] = {**CLUSTER_FIELDS, **RL_FIELDS, **ENGINE_FIELDS, **TRACE_FIELDS, "policy": str}
KNOB_PREFIX = "knobs."
SUMMARY_KEYS = (
    "epoch_time_s", "total_time_s", "gpu_hours", "num_steps", "rollout_share", "bubble_ratio",
    "wasted_tokens", "staleness_mean", "staleness_max", "trained_length_bias", "preemptions",
)  # fmt: skip


@dataclass(frozen=True)
class Grid:
    """A parsed grid: the points (dicts of field -> value) in product order."""

    source: str
    points: tuple[dict[str, Any], ...]


def _check_value(where: str, field: str, value: Any) -> Any:  # noqa: ANN401
    if field.startswith(KNOB_PREFIX):
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise RlsimError(f"{where}: {field} must be a number or a word, got {value!r}")
        return value
    want = FIELDS[field]
    if field == "max_steps" and value is None:
        return None
    if want is bool:
        if not isinstance(value, bool):
            raise RlsimError(f"{where}: {field} must be true or false, got {value!r}")
        return value
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, want):
        raise RlsimError(f"{where}: {field} must be {want.__name__}, got {value!r}")
    return value


def _check_field(where: str, field: str) -> None:
    if field not in FIELDS and not (field.startswith(KNOB_PREFIX) and len(field) > len(KNOB_PREFIX)):
        known = ", ".join(sorted(FIELDS))
        raise RlsimError(f"{where}: unknown field {field!r} (known: {known}, and knobs.NAME)")


def parse_grid(data: Any, where: str = "grid") -> Grid:  # noqa: ANN401
    """Check a grid document (the YAML's mapping) and expand it into points."""
    if not isinstance(data, dict):
        raise RlsimError(f"{where}: expected a mapping with 'grid' (and optional 'fixed', 'trace')")
    extra = set(data) - {"grid", "fixed", "trace"}
    if extra:
        raise RlsimError(f"{where}: unknown top-level key {sorted(extra)[0]!r} (expected grid, fixed, trace)")
    grid = data.get("grid")
    fixed = data.get("fixed") or {}
    if not isinstance(grid, dict) or not grid:
        raise RlsimError(f"{where}: 'grid' must map at least one field to a list of values")
    if not isinstance(fixed, dict):
        raise RlsimError(f"{where}: 'fixed' must map fields to single values")
    base: dict[str, Any] = {}
    if "trace" in data:
        base["trace"] = _check_value(where, "trace", data["trace"])
    for field, value in fixed.items():
        _check_field(where, field)
        base[field] = _check_value(where, field, value)
    axes: list[tuple[str, list]] = []
    for field, values in grid.items():
        _check_field(where, field)
        if not isinstance(values, list):
            raise RlsimError(f"{where}: grid field {field} must be a list, got {values!r}")
        if not values:
            raise RlsimError(f"{where}: grid field {field} is an empty list, so the sweep has no points")
        axes.append((field, [_check_value(where, field, v) for v in values]))
    points = []
    for combo in itertools.product(*(vals for _, vals in axes)):
        point = dict(base)
        point.update(zip((f for f, _ in axes), combo, strict=True))
        points.append(point)
    grid_ = Grid(where, tuple(points))
    for p in grid_.points:
        _configs(p, where)  # every point's config is valid before any simulation runs
    return grid_


def load_grid(path: Path) -> Grid:
    import yaml

    if not path.is_file():
        raise RlsimError(f"{path}: no such grid file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise RlsimError(f"{path} is not UTF-8 text (a grid is a YAML file)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark else ""
        raise RlsimError(f"{path} is not valid YAML{line}") from None
    return parse_grid(data, str(path))


def policy_string(point: dict[str, Any]) -> str:
    """The point's policy with its `knobs.*` fields added: `rollpacker(eta_p=1.5)`."""
    name = point.get("policy", "sync")
    knobs = {k[len(KNOB_PREFIX) :]: v for k, v in sorted(point.items()) if k.startswith(KNOB_PREFIX)}
    if not knobs:
        return name
    head, plus, spec = name.partition("+")
    extra = ",".join(f"{k}={v}" for k, v in knobs.items())
    head = f"{head[:-1]},{extra})" if head.endswith(")") else f"{head}({extra})"
    return head + plus + spec


def _configs(point: dict[str, Any], where: str = "grid"):  # noqa: ANN202
    from policies.registry import parse_policy
    from rlsim.config import ClusterConfig, EngineConfig, RLConfig
    from rlsim.profile import load_profile
    from rlsim.step_costs import with_engine

    try:
        kw = {k: point[k] for k in CLUSTER_FIELDS if k in point}
        if "gpus" in kw:
            kw["num_gpus"] = kw.pop("gpus")
        cluster = ClusterConfig(**kw)
        rl = RLConfig(**{k: point[k] for k in RL_FIELDS if k in point})
        engine = EngineConfig(**{k: point[k] for k in ENGINE_FIELDS if k in point})
        parse_policy(policy_string(point))
        prof = with_engine(load_profile(cluster.profile), engine)
        cluster.num_instances(prof.tensor_parallel_size)
    except RlsimError as exc:
        raise RlsimError(f"{where}: point {_label(point)}: {exc}") from None
    return cluster, rl, engine


def _label(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def point_id(point: dict[str, Any]) -> str:
    """A stable key of a point (its fields, sorted): how a resumed sweep knows what is done."""
    return hashlib.sha1(json.dumps(point, sort_keys=True, default=str).encode()).hexdigest()[:16]


SYNTH_FIELDS = ("preset", "rho", "num_prompts", "prompt_share", "trace_epochs", "start_step", "clip_ratio")


@functools.lru_cache(maxsize=8)
def _trace_for(key: str):  # noqa: ANN202 - cached per worker process
    """The point's trace: synthesised from the bundled DAPO-Math-17k prompts when any synthesis
    field is set, else the `trace` file, else the bundled default."""
    from rlsim.paths import MATH17K_PROMPTS, bundled, default_trace
    from rlsim.trace.format import load
    from rlsim.trace.synth import SynthConfig, load_prompts, synthesize

    spec = json.loads(key)
    if not any(k in spec for k in SYNTH_FIELDS):
        return load(spec.get("trace") or default_trace())
    config = SynthConfig(
        preset=spec.get("preset", "dapo-qwen2.5-32b"), rho=spec.get("rho"), prompt_share=spec.get("prompt_share"),
        epochs=spec.get("trace_epochs", 2), samples_per_prompt=spec["samples_per_prompt"],
        num_prompts=spec.get("num_prompts"), seed=spec["seed"], max_response_len=spec["max_response_len"],
        start_step=spec.get("start_step", 0), clip_ratio=spec.get("clip_ratio"),
    )  # fmt: skip
    return synthesize(config, load_prompts(bundled(MATH17K_PROMPTS)))


def run_point(point: dict[str, Any]) -> dict[str, Any]:
    """Simulate one point; the row is its fields, its id and the summary figures."""
    from rlsim.sim.simulate import simulate

    cluster, rl, engine = _configs(point)
    trace_key = {k: point[k] for k in TRACE_FIELDS if k in point}
    if any(k in trace_key for k in SYNTH_FIELDS):
        # lengths are drawn up to the point's cap, so a 32k point has a 32k tail
        trace_key.update(samples_per_prompt=rl.samples_per_prompt, seed=rl.seed, max_response_len=rl.max_response_len)
    trace = _trace_for(json.dumps(trace_key, sort_keys=True))
    res = simulate(trace, policy_string(point), cluster, rl, tables=False, engine_cfg=engine)
    s = res.summary
    row = {"point_id": point_id(point), **{k: point.get(k) for k in sorted(point)}}
    row["policy_string"] = policy_string(point)
    for k in SUMMARY_KEYS:
        v = s[k]
        row[k] = json.dumps(v) if isinstance(v, dict) else v
    epochs = s["epoch_time_s"]
    row["first_epoch_time_h"] = epochs[min(epochs)] / 3600 if epochs else None
    row["sim_wall_s"] = s["sim_wall_s"]
    return row


class RayExecutor(Executor):
    """A `concurrent.futures.Executor` over Ray tasks (`ray.init(address=...)` for a cluster):
    each `submit` is one remote task; its `ObjectRef.future()` is the returned Future."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise RlsimError("the ray executor needs Ray: pip install -e '.[cluster]'") from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            kw: dict[str, Any] = {"address": address} if address else {"num_cpus": num_cpus}
            ray.init(log_to_driver=False, include_dashboard=False, **kw)
        self._remote: dict[Callable, Any] = {}

    def submit(self, fn, /, *args, **kwargs) -> Future:  # noqa: ANN001
        remote = self._remote.get(fn)
        if remote is None:
            remote = self._remote[fn] = self.ray.remote(fn)
        return remote.remote(*args, **kwargs).future()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if self.started:
            self.ray.shutdown()


def make_executor(kind: str, workers: int | None, address: str | None = None) -> Executor:
    if kind == "process":
        return ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1)
    if kind == "ray":
        return RayExecutor(address, workers)
    raise RlsimError(f"--executor must be process or ray, got {kind!r}")


def _read_rows(out: Path) -> list[dict[str, Any]]:
    import pandas as pd

    if not out.exists():
        return []
    try:
        frame = pd.read_parquet(out)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise RlsimError(f"{out} exists but is not a sweep result ({str(exc).splitlines()[0]})") from None
    if "point_id" not in frame.columns:
        raise RlsimError(f"{out} is a Parquet file but not a sweep result (no point_id column); choose another --out")
    return frame.to_dict("records")


def check_caps(grid: Grid) -> None:
    """Refuse, before any point runs, a point whose `max_response_len` exceeds its trace file's
    cap (synthesised traces are drawn up to the point's cap and need no check)."""
    from rlsim.paths import default_trace
    from rlsim.trace.format import load

    caps: dict[str, int] = {}
    for p in grid.points:
        if any(k in p for k in SYNTH_FIELDS):
            continue
        path = str(p.get("trace") or default_trace())
        if path not in caps:
            caps[path] = load(path, columns=[]).meta.max_response_len
        cap = p.get("max_response_len")
        if cap is not None and cap > caps[path]:
            raise RlsimError(
                f"{grid.source}: point {_label(p)}: max_response_len={cap} exceeds the trace's cap {caps[path]}: "
                "the trace does not say how long responses would run past it"
            )


def _write_rows(out: Path, rows: list[dict[str, Any]], order: dict[str, int]) -> None:
    import pandas as pd

    frame = pd.DataFrame(sorted(rows, key=lambda r: order.get(r["point_id"], len(order))))
    tmp = out.with_name(out.name + ".tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(out)


def existing_rows(grid: Grid, out: Path, keep_other_grids: bool = False) -> tuple[list[dict], list[dict]]:
    """`out`'s rows, read once: those of `grid`'s points (an earlier, maybe interrupted, run) and
    those of another grid, which a sweep never rewrites or drops. Rows of another grid are refused
    in one sentence unless `keep_other_grids`."""
    ids = {point_id(p) for p in grid.points}
    rows, others = [], []
    for r in _read_rows(out):
        (rows if r.get("point_id") in ids else others).append(r)
    if others and not keep_other_grids:
        raise RlsimError(
            f"{out} holds {len(others)} rows of another grid; choose another --out, or pass --force to add "
            "this grid's rows beside them (they are kept as they are)"
        )
    return rows, others


def run_sweep(
    grid: Grid,
    out: Path,
    executor: Executor | None = None,
    on_done: Callable[[dict], None] | None = None,
    keep_other_grids: bool = False,
) -> list[dict[str, Any]]:
    """Run every point of `grid` not already in `out`; rows land in `out` as they finish.
    Returns every row of this grid (earlier and new), in grid order. `executor=None` runs in this
    process. An `out` holding rows of another grid is refused unless `keep_other_grids`, which
    keeps those rows, unchanged, after this grid's."""
    order = {point_id(p): i for i, p in enumerate(grid.points)}
    rows, others = existing_rows(grid, out, keep_other_grids)
    done = {r["point_id"] for r in rows}
    todo = [p for p in grid.points if point_id(p) not in done]
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        _write_rows(out, rows + others, order)

    if executor is None:
        for p in todo:
            rows.append(run_point(p))
            save()
            if on_done:
                on_done(rows[-1])
    else:
        futures = [executor.submit(run_point, p) for p in todo]
        try:
            for fut in as_completed(futures):
                rows.append(fut.result())
                save()
                if on_done:
                    on_done(rows[-1])
        except BaseException:
            # Ctrl-C or a failed point: drop the work not started, keep every row already saved.
            for fut in futures:
                fut.cancel()
            raise
    return sorted(rows, key=lambda r: order[r["point_id"]])
