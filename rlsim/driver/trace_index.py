"""TraceIndex: the driver's O(1) look-up of a visit's sample lengths, prompt tokens and rewards.

The policy never sees it: the driver reads each launched sample's target length here, and the
step records use its unbiased means to measure the length bias a policy's selection causes.
"""

from __future__ import annotations

import numpy as np

from rlsim.trace.format import Trace


class TraceIndex:
    """O(1) lookup of a visit's sample lengths: rows are sorted by (epoch, prompt, sample)."""

    def __init__(self, trace: Trace, cap: int | None = None) -> None:
        df = trace.table
        self.cap = cap or trace.meta.max_response_len
        self.epochs = trace.epochs
        self.samples = trace.meta.samples_per_prompt
        self.out = df["num_output_tokens"].to_numpy(np.int64)
        self.prompt_tokens = df["num_prompt_tokens"].to_numpy(np.int64)
        # the same columns read as Python ints, a launch's rows at a time (no numpy scalar per read)
        self.out_ints, self.prompt_ints = memoryview(self.out), memoryview(self.prompt_tokens)
        self.reward_time = df["reward_time_s"].to_numpy(float) if "reward_time_s" in df.columns else None
        self.reward = df["reward"].to_numpy(float) if "reward" in df.columns else None
        ep, pid = df["epoch"].to_numpy(), df["prompt_id"].to_numpy()
        starts = np.flatnonzero(np.r_[True, (np.diff(ep) != 0) | (np.diff(pid) != 0)])
        self.start = {(int(ep[s]), int(pid[s])): int(s) for s in starts}
        self.prompts_by_epoch = {e: np.unique(pid[ep == e]) for e in self.epochs}
        # A real log's steps: prompts of an epoch in the order the log generated them.
        self.logged_order: dict[int, np.ndarray] | None = None
        if "step" in df.columns:
            st = df["step"].to_numpy()[starts]
            ep_s, pid_s = ep[starts], pid[starts]
            self.logged_order = {
                e: pid_s[ep_s == e][np.lexsort((pid_s[ep_s == e], st[ep_s == e]))] for e in self.epochs
            }
        self._epoch_mean: dict[tuple[int, int], float] = {}

    def length(self, epoch: int, prompt_id: int, sample_idx: int) -> tuple[int, int]:
        s = self.start[(epoch, prompt_id)] + sample_idx
        return int(self.out[s]), int(self.prompt_tokens[s])

    def reward_of(self, epoch: int, prompt_id: int, sample_idx: int) -> float:
        return float(self.reward[self.start[(epoch, prompt_id)] + sample_idx])

    def reward_time_s(self, epoch: int, prompt_id: int, sample_idx: int, default: float) -> float:
        if self.reward_time is None:
            return default
        return float(self.reward_time[self.start[(epoch, prompt_id)] + sample_idx])

    def unbiased_means(self, visits, n: int) -> np.ndarray:  # noqa: ANN001 - an iterable of (epoch, prompt)
        """Mean length (at the run's cap) of each visit's first n samples, in the visits' order: what
        training on that prompt without selection would see (one gather: a step trains thousands)."""
        starts = np.fromiter((self.start[v] for v in visits), np.int64)
        return np.minimum(self.out[starts[:, None] + np.arange(n)], self.cap).mean(axis=1)

    def epoch_mean(self, epoch: int, n: int) -> float:
        """Mean length (at the run's cap) of the first n samples of every prompt of an epoch."""
        key = (epoch, n)
        if key not in self._epoch_mean:
            starts = np.array([s for (e, _), s in self.start.items() if e == epoch])
            rows = (starts[:, None] + np.arange(n)[None, :]).ravel()
            self._epoch_mean[key] = float(np.minimum(self.out[rows], self.cap).mean())
        return self._epoch_mean[key]
