"""`PlanConfig`: a plan's objective and its successive halving, each field with its option's help.

Its own module, importing nothing of rlsim but the base (its errors and configs), so that the
command line declares `rlsim plan`'s options from it (`rlsim.cli.engine_options.config_options`)
without loading the simulator when it starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlsim.config import option_field as _knob
from rlsim.errors import RlsimError


@dataclass(frozen=True, slots=True)
class PlanConfig:
    """The plan's objective and its successive halving."""

    target_epoch_hours: float | None = _knob(
        None, "Objective: the fewest GPU-hours per epoch with an epoch within this many hours."
    )
    gpu_budget: int | None = _knob(None, "Objective: the fastest epoch on at most this many GPUs.")
    steps: int = _knob(6, "Steps simulated per finalist (0: the whole epoch).")  # the last rung's
    min_steps: int = _knob(2, "Steps simulated per candidate in the first round of halving.")
    eta: int = _knob(3, "Each round keeps the best 1/eta per policy, at eta times the steps.")
    seeds: int = _knob(3, "Data-order seeds the finalists are simulated under (error bars).")

    def __post_init__(self) -> None:
        t, b = self.target_epoch_hours, self.gpu_budget
        if t is None and b is None:
            raise RlsimError(
                "give an objective: --gpu-budget N (fastest epoch) or --target-epoch-hours H (fewest GPU-hours)"
            )
        if t is not None and not (math.isfinite(t) and t > 0):
            raise RlsimError(f"--target-epoch-hours must be a positive number, got {t}")
        if b is not None and b < 1:
            raise RlsimError(f"--gpu-budget must be a positive number of GPUs, got {b}")
        if self.steps < 0 or self.min_steps < 1:
            raise RlsimError(f"--steps must be >= 0 and --min-steps >= 1, got {self.steps} and {self.min_steps}")
        if self.steps and self.min_steps > self.steps:
            raise RlsimError(f"--min-steps {self.min_steps} is above --steps {self.steps}")
        if self.eta < 2:
            raise RlsimError(f"--eta must be >= 2, got {self.eta}")
        if self.seeds < 1:
            raise RlsimError(f"--seeds must be >= 1, got {self.seeds}")
