"""Parameter sweeps: one seeded simulation per point of a grid (`rlsim.plan.grid`, the grid file and its
checks).

Points run on any `concurrent.futures.Executor`: a process pool by default, Ray across machines
(`RayExecutor`). Each result row is the point's fields plus the simulation's summary figures. Rows
are written to the output Parquet file as points finish (atomically, whole file), so an
interrupted sweep keeps its rows, and running it again skips the points already there. Same grid,
same rows, whatever the executor and the order points finish in.
"""

from __future__ import annotations

import functools
import json
import os
import signal
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import pandas as pd

from rlsim.errors import RlsimError
from rlsim.files import atomic_save
from rlsim.paths import MATH17K_PROMPTS, bundled, default_trace
from rlsim.plan.grid import SYNTH_FIELDS, TRACE_FIELDS, Grid, point_configs, point_id, point_label, policy_string
from rlsim.sim.simulate import simulate
from rlsim.trace.format import load
from rlsim.trace.synth import SynthConfig, load_prompts, synthesize

SUMMARY_KEYS = (
    "epoch_time_s", "total_time_s", "gpu_hours", "num_steps", "rollout_share", "bubble_ratio",
    "wasted_tokens", "staleness_mean", "staleness_max", "trained_length_bias", "preemptions",
)  # fmt: skip


@functools.lru_cache(maxsize=8)
def _trace_for(key: str):  # noqa: ANN202 - cached per worker process
    """The point's trace: synthesised from the bundled DAPO-Math-17k prompts when any synthesis
    field is set, else the `trace` file, else the bundled default."""
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
    cluster, rl, engine = point_configs(point)
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


def _ignore_sigint() -> None:
    """A pool worker leaves Ctrl-C to the command: the command cancels what is pending and the
    workers end their point. A worker that took the SIGINT the terminal sends the whole group could
    be inside numba's compile, whose ctypes callback prints the KeyboardInterrupt as a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def make_executor(kind: str, workers: int | None, address: str | None = None) -> Executor:
    if kind == "process":
        return ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1, initializer=_ignore_sigint)
    if kind == "ray":
        return RayExecutor(address, workers)
    raise RlsimError(f"--executor must be process or ray, got {kind!r}")


def _read_rows(out: Path) -> list[dict[str, Any]]:
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
                f"{grid.source}: point {point_label(p)}: max_response_len={cap} exceeds the trace's cap {caps[path]}: "
                "the trace does not say how long responses would run past it"
            )


def _write_rows(out: Path, rows: list[dict[str, Any]], order: dict[str, int]) -> None:
    frame = pd.DataFrame(sorted(rows, key=lambda r: order.get(r["point_id"], len(order))))
    atomic_save(out, lambda tmp: frame.to_parquet(tmp, index=False))


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
