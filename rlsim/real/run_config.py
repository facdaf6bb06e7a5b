"""A real run's configuration: `RealConfig` (model, lengths, training, calibration, resume) and how
the run directory's config.json turns back into the simulator's configs, profile and instance count.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlsim.config import ClusterConfig, EngineConfig
from rlsim.errors import RlsimError
from rlsim.profile import Profile, TrainCost, profile_from_dict
from rlsim.real.engine import LENGTH_MODES
from rlsim.real.trainer import TrainerConfig

TRAIN_MODES = ("modeled", "none", "grpo")
ENGINE_COLUMNS = (
    "vllm/queued_ts", "vllm/scheduled_ts", "vllm/first_token_ts", "vllm/last_token_ts", "vllm/num_preemptions",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RealConfig:
    """What a real run adds to the simulator's configs: the model and how to drive it."""

    model: str
    lengths: str = "replay"
    train: str = "modeled"
    rollout_tp: int = 1
    temperature: float = 1.0
    max_model_len: int | None = None
    dtype: str | None = None
    ray_address: str | None = None
    histospec_k: int = 16
    calibrate: str | None = None  # a decode grid measured on the run's engines (rlsim.real.run_calibration)
    # train=grpo (rlsim.real.trainer): veRL's actor settings
    lr: float = 1e-6
    old_log_prob: str = "recompute"
    ppo_mini_batch_size: int | None = None
    ppo_max_token_len_per_gpu: int = 16384
    device: str = "cpu"
    kl_loss_coef: float = 0.001  # with RLConfig.use_kl_loss
    save_freq: int = 1  # steps between checkpoints (driver, and with train=grpo the actor's model and optimizer)
    # train=grpo, a control: each batch's rewards permuted among its samples before the update, so
    # that nothing but noise is learned (a run that gains anyway learns from something else)
    shuffle_rewards: bool = False
    # a multi-turn task (rlsim.trace.tasks.AgentTask): its tool's latency and how many calls run at once
    tool_latency_s: float = 0.5
    tool_workers: int | None = None

    def __post_init__(self) -> None:
        if self.lengths not in LENGTH_MODES:
            raise RlsimError(f"--lengths must be one of {', '.join(LENGTH_MODES)}, got {self.lengths!r}")
        if self.train not in TRAIN_MODES:
            raise RlsimError(f"--train must be one of {', '.join(TRAIN_MODES)}, got {self.train!r}")
        if self.rollout_tp <= 0:
            raise RlsimError(f"rollout_tp must be positive, got {self.rollout_tp}")
        if self.train == "grpo":
            self.trainer_config()  # one sentence for a learning rate that is not positive, and the like
        if isinstance(self.save_freq, bool) or not isinstance(self.save_freq, int) or self.save_freq <= 0:
            raise RlsimError(f"--save-freq must be a positive number of steps, got {self.save_freq!r}")
        if not (math.isfinite(self.tool_latency_s) and self.tool_latency_s >= 0):
            raise RlsimError(f"--tool-latency-s must be a finite number >= 0, got {self.tool_latency_s}")
        if self.tool_workers is not None and self.tool_workers <= 0:
            raise RlsimError(f"--tool-workers must be positive, got {self.tool_workers}")
        if self.calibrate is not None and self.calibrate not in ("small", "default"):
            raise RlsimError(f"--calibrate must be small or default (the decode grids), got {self.calibrate!r}")


    def trainer_config(self):  # noqa: ANN201 - rlsim.real.trainer.TrainerConfig
        return TrainerConfig(
            lr=self.lr, old_log_prob=self.old_log_prob, ppo_mini_batch_size=self.ppo_mini_batch_size,
            ppo_max_token_len_per_gpu=self.ppo_max_token_len_per_gpu, device=self.device,
            kl_loss_coef=self.kl_loss_coef, temperature=self.temperature,
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
