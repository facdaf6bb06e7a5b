"""Sweep grids: the cartesian product of config fields, each point checked before any runs.

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
`max_num_seqs`, `max_num_batched_tokens`, `enable_prefix_caching`, `free_cache_engine`, ... (every
`rlsim.config.EngineConfig` field: the engine);
`policy` (a policy string, knobs included) and
`knobs.NAME` (a knob added to the point's policy string, e.g. `knobs.eta_p: [1.0, 1.5]`); `trace`
(a Parquet path) or `preset`, `rho`, `num_prompts`, `trace_epochs`, `prompt_share`, `start_step`,
`clip_ratio` (as in `rlsim trace synth`: a synthetic
trace from the DAPO-Math-17k prompts, its lengths drawn up to the point's `max_response_len`,
generated once per worker and cached). Every point is checked before any runs: an unknown
field, an empty list, a wrong type or an impossible config is one `RlsimError` naming the file.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from policies.registry import parse_policy
from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.errors import RlsimError
from rlsim.profile import load_profile
from rlsim.step_costs import with_engine

CLUSTER_FIELDS = {"gpus": int, "profile": str, "placement": str, "train_gpus": int, "dispatch": str}
RL_FIELDS = {
    "prompts_per_step": int, "samples_per_prompt": int, "max_response_len": int, "epochs": int,
    "max_steps": int, "seed": int, "reward_latency_s": float, "reward_workers": int, "use_kl_loss": bool,
}  # fmt: skip
# every EngineConfig field, with the type a grid value must have (`None` aside)
ENGINE_FIELDS = {
    name: next(t for t in typing.get_args(hint) or (hint,) if t is not type(None))
    for name, hint in typing.get_type_hints(EngineConfig).items()
}
TRACE_FIELDS = {
    "trace": str, "preset": str, "rho": float, "num_prompts": int, "trace_epochs": int, "prompt_share": float,
    "start_step": int, "clip_ratio": float,
}  # fmt: skip
FIELDS: dict[str, type] = {**CLUSTER_FIELDS, **RL_FIELDS, **ENGINE_FIELDS, **TRACE_FIELDS, "policy": str}
KNOB_PREFIX = "knobs."

@dataclass(frozen=True)
class Grid:
    """A parsed grid: the points (dicts of field -> value) in product order."""

    source: str
    points: tuple[dict[str, Any], ...]


def check_value(where: str, field: str, value: Any) -> Any:  # noqa: ANN401
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


def check_field(where: str, field: str) -> None:
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
        base["trace"] = check_value(where, "trace", data["trace"])
    for field, value in fixed.items():
        check_field(where, field)
        base[field] = check_value(where, field, value)
    axes: list[tuple[str, list]] = []
    for field, values in grid.items():
        check_field(where, field)
        if not isinstance(values, list):
            raise RlsimError(f"{where}: grid field {field} must be a list, got {values!r}")
        if not values:
            raise RlsimError(f"{where}: grid field {field} is an empty list, so the sweep has no points")
        axes.append((field, [check_value(where, field, v) for v in values]))
    points = []
    for combo in itertools.product(*(vals for _, vals in axes)):
        point = dict(base)
        point.update(zip((f for f, _ in axes), combo, strict=True))
        points.append(point)
    grid_ = Grid(where, tuple(points))
    for p in grid_.points:
        point_configs(p, where)  # every point's config is valid before any simulation runs
    return grid_


def load_grid(path: Path) -> Grid:
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


def point_configs(point: dict[str, Any], where: str = "grid"):  # noqa: ANN202
    try:
        kw = {k: point[k] for k in CLUSTER_FIELDS if k in point}
        if "gpus" in kw:
            kw["num_gpus"] = kw.pop("gpus")
        cluster = ClusterConfig(**kw)
        rl = RLConfig(**{k: point[k] for k in RL_FIELDS if k in point})
        engine = EngineConfig(**{k: point[k] for k in ENGINE_FIELDS if k in point})
        parse_policy(policy_string(point))
        prof = with_engine(load_profile(cluster.profile), engine)
        cluster.num_instances(prof.instance_gpus)
    except RlsimError as exc:
        raise RlsimError(f"{where}: point {point_label(point)}: {exc}") from None
    return cluster, rl, engine


def point_label(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def point_id(point: dict[str, Any]) -> str:
    """A stable key of a point (its fields, sorted): how a resumed sweep knows what is done."""
    return hashlib.sha1(json.dumps(point, sort_keys=True, default=str).encode()).hexdigest()[:16]


SYNTH_FIELDS = ("preset", "rho", "num_prompts", "prompt_share", "trace_epochs", "start_step", "clip_ratio")
