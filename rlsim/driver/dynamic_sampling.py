"""DAPO dynamic sampling as a feature of any policy (`POLICY+dynamic_sampling`).

DAPO (arXiv 2503.14476, section 3.2; veRL's `algorithm.filter_groups`) drops every group whose
rewards are all equal (all right or all wrong: zero advantage, no gradient) and keeps generating
until P0 valid groups exist, at most `max_num_gen_batches` generation batches per step (DAPO's
recipe: 10); valid groups beyond P0 are discarded. Here a generation batch is one round of the
policy's own launches (`on_step_start` again, with the weights unchanged), and a group is the
samples of one prompt visit in the batch the policy asked to train. Dropped and surplus samples
are generated and never trained, so they count as wasted tokens, and their prompts count as
visited for the epoch, as DAPO's dataloader does. Rewards come from the trace's `reward` column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rlsim.config import DynamicSamplingConfig
from rlsim.errors import RlsimError


@dataclass
class GroupFilter:
    """One step's valid groups, gathered over its generation batches."""

    config: DynamicSamplingConfig
    prompts_per_step: int
    kept: list[tuple[tuple[int, int], list[int]]] = field(default_factory=list)  # (visit, request ids)
    gen_batches: int = 0
    dropped: int = 0

    def add(
        self, groups: dict[tuple[int, int], list[int]], reward_of: Callable[[int], float]
    ) -> list[tuple[int, int]]:
        """Take one generation batch's groups; return the visits dropped (rewards all equal)."""
        self.gen_batches += 1
        out = []
        for visit, ids in groups.items():
            if len({reward_of(r) for r in ids}) > 1:
                self.kept.append((visit, ids))
            else:
                out.append(visit)
        self.dropped += len(out)
        return out

    @property
    def done(self) -> bool:
        limit = self.config.max_num_gen_batches
        return len(self.kept) >= self.prompts_per_step or (limit > 0 and self.gen_batches >= limit)

    def take(self) -> tuple[list[int], list[tuple[int, int]], dict[str, float]]:
        """(request ids to train, surplus visits discarded, step metrics); resets the filter."""
        keep, surplus = self.kept[: self.prompts_per_step], self.kept[self.prompts_per_step :]
        ids = [r for _, group in keep for r in group]
        seen = len(self.kept) + self.dropped
        stats = {
            "dynamic_sampling/num_gen_batches": float(self.gen_batches),
            "dynamic_sampling/dropped_groups": float(self.dropped),
            "dynamic_sampling/dropped_ratio": self.dropped / seen if seen else 0.0,
            "dynamic_sampling/surplus_groups": float(len(surplus)),
        }
        self.kept, self.gen_batches, self.dropped = [], 0, 0
        return ids, [v for v, _ in surplus], stats


def check_rewards(columns: Sequence[str]) -> None:
    if "reward" not in columns:
        raise RlsimError(
            "dynamic sampling needs rewards: the trace has no 'reward' column (rlsim trace synth "
            "with the dapo preset writes one; a real run's recorded trace has one)"
        )
