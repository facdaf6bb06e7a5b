"""How a real run's directory holds its configuration (`RealConfig`, `rlsim.real.config`, with the
simulator's): its config.json turned back into the simulator's configs, profile and instance count.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rlsim.config import ClusterConfig, EngineConfig
from rlsim.errors import RlsimError
from rlsim.profile import Profile, TrainCost, profile_from_dict

ENGINE_COLUMNS = (
    "vllm/queued_ts", "vllm/scheduled_ts", "vllm/first_token_ts", "vllm/last_token_ts", "vllm/num_preemptions",
)  # fmt: skip


def read_run_config(run_dir: Path, missing: str = "is not a run directory") -> dict[str, Any]:
    """A real run's config.json, or one sentence saying why `run_dir` does not hold one."""
    path = run_dir / "config.json"
    if not path.exists():
        raise RlsimError(f"{run_dir} {missing} (no config.json)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RlsimError(f"{path} is not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError:
        raise RlsimError(f"{path} is not UTF-8 text") from None
    if not isinstance(config, dict):
        raise RlsimError(f"{path} must hold a JSON object, not {type(config).__name__}")
    if config.get("mode") != "real":
        raise RlsimError(f"{run_dir} is not a real run (rlsim run --real writes one)")
    return config


def num_instances(cluster: ClusterConfig, rollout_tp: int) -> int:
    if cluster.rollout_gpus % rollout_tp:
        raise RlsimError(f"{cluster.rollout_gpus} rollout GPUs are not divisible by --rollout-tp {rollout_tp}")
    return cluster.rollout_gpus // rollout_tp


def run_profile(profile: Profile, train: str) -> Profile:
    """The profile a run times training with: `train=none` makes training and sync free, and so
    does `train=grpo`, whose phases are measured, not modeled."""
    if train in ("none", "grpo"):
        return dataclasses.replace(
            profile, train=TrainCost(0.0, 1.0, 1.0, 0.0), weight_sync_s=0.0, model_facts={}, gpu_facts={}
        )
    return profile


def run_engine_config(config: dict[str, Any]) -> EngineConfig:
    """The engine settings a real run used (runs written before they were recorded had prefix
    caching off and never slept; older ones kept max_num_seqs with the RealConfig)."""
    settings = dict(config.get("EngineConfig", {"enable_prefix_caching": False, "free_cache_engine": False}))
    legacy = config.get("RealConfig", {}).pop("max_num_seqs", None)
    if legacy is not None and settings.get("max_num_seqs") is None:
        settings["max_num_seqs"] = legacy
    return EngineConfig(**settings)


def run_profile_engine(profile: Profile, engine: EngineConfig) -> Profile:
    """The profile a real run's driver follows: its engine under the run's settings (the KV
    capacity is the real engines' own, not re-derived)."""
    return dataclasses.replace(profile, engine=engine.over(profile.engine))


def profile_from(raw: dict) -> Profile:
    return profile_from_dict(raw, "run config profile")
