"""`RealConfig`: what a real run adds to the simulator's configs, each field with its option's help.

Its own module, importing nothing of rlsim but the base (its errors and configs), so that the
command line declares `rlsim run --real`'s options from it (`rlsim.cli.engine_options.config_options`)
without loading the real mode when it starts; the run directory's config is `rlsim.real.run_config`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlsim.config import option_field as _knob
from rlsim.errors import RlsimError

LENGTH_MODES = ("replay", "free")  # the trace's lengths exactly, or natural generation (`rlsim.real.engine`)
TRAIN_MODES = ("modeled", "none", "grpo")


@dataclass(frozen=True, slots=True)
class RealConfig:
    """What a real run adds to the simulator's configs: the model and how to drive it."""

    model: str | None = _knob(None, "Model path or Hugging Face id (in the local cache).")
    lengths: str = _knob("replay", "replay: the trace's lengths exactly; free: natural generation.")
    train: str = _knob(
        "modeled", "modeled: wait the profile's train + sync time; none: skip; grpo: train the model for real "
        "(GRPO/DAPO in torch, weights pushed into the engines every step; needs --lengths free).",
    )  # fmt: skip
    rollout_tp: int = _knob(1, "Tensor parallel size of each vLLM instance.")
    temperature: float = _knob(1.0, "Sampling temperature.")
    max_model_len: int | None = _knob(None, "vLLM max_model_len (default: the model's).")
    dtype: str | None = None
    ray_address: str | None = _knob(None, "Ray cluster address for instances across nodes.")
    histospec_k: int = 16
    calibrate: str | None = _knob(
        None,
        "Measure rlsim calibrate decode's grid (small or default) on the run's own engines before its steps "
        "(the run uses that fit) and between them (rlsim validate uses that one).",
    )  # a decode grid measured on the run's engines (rlsim.real.run_calibration)
    # train=grpo (rlsim.real.trainer): veRL's actor settings
    lr: float = _knob(1e-6, "With --train grpo: AdamW learning rate.")
    old_log_prob: str = _knob(
        "recompute", "With --train grpo: recompute (a trainer forward pass, veRL's default) or rollout (the engines' "
        "sampled log-probs).",
    )  # fmt: skip
    ppo_mini_batch_size: int | None = _knob(
        None, "With --train grpo: samples per optimizer step (default: the step's whole batch)."
    )
    ppo_max_token_len_per_gpu: int = _knob(16384, "With --train grpo: tokens per micro-batch.")
    device: str = _knob("cpu", "With --train grpo: the trainer's torch device (cpu, cuda).")
    kl_loss_coef: float = _knob(0.001, "With --use-kl-loss and --train grpo: the KL loss weight.")
    # steps between checkpoints (driver, and with train=grpo the actor's model and optimizer)
    save_freq: int = _knob(
        1, "Steps between checkpoints (the driver's, and with --train grpo the model's and optimizer's); a resumed "
        "run starts again after the last one.",
    )  # fmt: skip
    # train=grpo, a control: each batch's rewards permuted among its samples before the update, so
    # that nothing but noise is learned (a run that gains anyway learns from something else)
    shuffle_rewards: bool = _knob(
        False, "With --train grpo, a control: permute each batch's rewards among its samples before the update "
        "(seeded), so the run should learn nothing.", "--shuffle-rewards",
    )  # fmt: skip
    # a multi-turn task (rlsim.trace.tasks.AgentTask): its tool's latency and how many calls run at once
    tool_latency_s: float = _knob(
        0.5, "A multi-turn task's tool: seconds each call takes (tool-lookup's lookup).", "--tool-latency-s"
    )
    tool_workers: int | None = _knob(
        None, "A multi-turn task's tool workers: calls that run at once (default: no limit)."
    )

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
        from rlsim.real.trainer import TrainerConfig

        return TrainerConfig(
            lr=self.lr, old_log_prob=self.old_log_prob, ppo_mini_batch_size=self.ppo_mini_batch_size,
            ppo_max_token_len_per_gpu=self.ppo_max_token_len_per_gpu, device=self.device,
            kl_loss_coef=self.kl_loss_coef, temperature=self.temperature,
        )  # fmt: skip
