"""Replay: a real run's measured iteration times in place of the model's (`SimEngine(iteration_times=...)`,
what `rlsim validate` uses to separate scheduling from timing): the
k-th iteration of instance i takes the measured time of the k-th iteration that instance ran in
a real run, instead of the profile's prediction; it runs one iteration at a time, and counts how
many of its iterations had the same batch as the real one they took their time from (decode
requests and prefill tokens), and how many ran past the recording (those fall back to the model).
"""

from __future__ import annotations

from collections.abc import Sequence


class Replay:
    """Per instance, (seconds, decode requests, prefill tokens) of each recorded iteration."""

    COUNTS = ("iterations", "same_batch", "past_recording")

    def __init__(self, iteration_times: Sequence[Sequence[tuple[float, int, int]]]) -> None:
        self.recorded = [list(t) for t in iteration_times]
        self.pos = [0] * len(self.recorded)
        self.counts = dict.fromkeys(self.COUNTS, 0)

    def took(self, i: int, out, modeled: float) -> float:  # noqa: ANN001 - the scheduler's Scheduled
        """The measured time of instance i's next recorded iteration (the model's past its end)."""
        rec, k = self.recorded[i], self.pos[i]
        self.counts["iterations"] += 1
        if k >= len(rec):
            self.counts["past_recording"] += 1
            return modeled
        self.pos[i] = k + 1
        took, decodes, prefill = rec[k]
        if decodes == out.num_decodes and prefill == out.prefill_tokens:
            self.counts["same_batch"] += 1
        return took
