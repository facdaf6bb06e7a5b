"""What a run records: one row per request and one row per RL step, with veRL's metric names.

Per step (docs/simulate.md, the run directory): `timing_s/gen` (step start to the rollout decision),
`timing_s/reward` (reward time not hidden behind rollout), `timing_s/old_log_prob`,
`timing_s/ref`, `timing_s/update_actor`, `timing_s/update_weights`, `timing_s/rollout_sleep`,
`timing_s/rollout_wake_up` (`rlsim.step_costs`), `timing_s/step`, `response_length/mean|max|clip_ratio` of trained
samples, `response/aborted_ratio`, `perf/throughput` (trained tokens / step time / GPUs), plus
`bubble_ratio` (idle instance-time / (instances x gen time); idle = running no request),
`slot_bubble_ratio` (1 - running sequences integrated over the gen phase / (instances x
`max_num_seqs` x gen time): an oversubscribed engine's idle batch slots; NaN where the engine
does not count them),
`wasted_tokens` (generated in this step for samples never trained), `staleness/max|mean`
(policy versions between launch and training), `trained_length_bias` (mean trained length /
mean length of the same visits' first R0 samples in the trace: which samples of a prompt
train), `length_order_bias` (mean trained length / mean over every prompt of the epoch: which
prompts train when, e.g. SortedRL's short-first micro-curriculum) and
`rollout/first_done_idle_ratio` (share of the gen phase the first instance to go idle stays idle),
and over the whole step, with veRL fully-async's names, `trainer/idle_ratio` (step start to the
update's start, over the step) and `rollouter/idle_ratio` (instance time running no request),
beside the marks `time/train_start`, `time/sync_start` and `time/sync_begin` (a sync that stops
the rollout: the update done; the rollout stopped and the weights moving).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rlsim.protocol import Request

REQUEST_FIELDS = (
    "request_id",
    "step",
    "epoch",
    "prompt_id",
    "sample_idx",
    "instance",
    "policy_version",
    "num_prompt_tokens",
    "launch_time",
    "first_token_time",
    "finish_time",
    "num_output_tokens",
    "finish_reason",
    "outcome",
    "trained_step",
    "staleness",
    "preemptions",
    "kept_tokens",
)

_REQUEST = Request._fields
_FLOAT_FIELDS = frozenset({"launch_time", "first_token_time", "finish_time"})
_TEXT_FIELDS = frozenset({"finish_reason", "outcome"})


@dataclass
class StepWindow:
    """Time marks of one step, and instance busy time at its start and at the rollout decision."""

    step: int
    start: float
    engine: object
    busy_start: list[float] = field(init=False)
    slots_start: float = field(init=False)
    slots_gen: float = float("nan")
    busy_gen: list[float] = field(default_factory=list)
    last_busy: list[float] = field(default_factory=list)
    gen_end: float = 0.0
    reward_end: float = 0.0
    cost: object = None  # rlsim.step_costs.StepCost
    end: float = 0.0
    extra: dict = field(default_factory=dict)  # further step metrics (dynamic sampling)
    train_start: float = float("nan")  # the trainer starts the update (samples and rewards in)
    sync_start: float | None = None  # the update done, a sync that stops the rollout begins
    sync_begin: float | None = None  # the rollout stopped (drained or interrupted): weights move
    busy_end: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.engine.num_instances
        self.busy_start = [self.engine.busy_time(i) for i in range(n)]
        self.slots_start = _seq_time(self.engine)

    def mark_gen_end(self, engine) -> None:  # noqa: ANN001
        self.gen_end = engine.now
        n = engine.num_instances
        self.busy_gen = [engine.busy_time(i) for i in range(n)]
        self.slots_gen = _seq_time(engine)
        segs = getattr(engine, "segments", None)
        self.last_busy = []
        for i in range(n):
            # segments run in time order: the newest one inside the step's rollout ends last, so
            # scan back from the newest, not past the step's start (an epoch's history is not
            # rescanned every step)
            last = self.start
            for s, e in reversed(segs(i) if segs else []):
                if e <= self.start:
                    break
                if s < self.gen_end:
                    last = min(e, self.gen_end)
                    break
            self.last_busy.append(last)

    def close(self, reward_end: float, cost, end: float) -> None:  # noqa: ANN001 - a StepCost
        self.reward_end, self.cost, self.end = reward_end, cost, end
        self.busy_end = [self.engine.busy_time(i) for i in range(self.engine.num_instances)]


def column(col: array) -> np.ndarray:
    """A typed column as a numpy array over the same memory (held only while the column does
    not grow: an array exporting its buffer cannot be resized)."""
    return np.frombuffer(col, dtype=col.typecode)


def _seq_time(engine) -> float:  # noqa: ANN001
    """Sequence-seconds run by every instance so far (NaN for an engine that does not count)."""
    seq = getattr(engine, "seq_time", None)
    return sum(seq(i) for i in range(engine.num_instances)) if seq else float("nan")


class Records:
    """Columnar per-request records (indexed by request id) and per-step metric rows."""

    def __init__(self) -> None:
        # numbers in typed arrays (8 bytes a value, not a pointer to an object): an epoch of a
        # 10x trace records millions of requests
        self.cols: dict[str, list | array] = {
            f: array("d") if f in _FLOAT_FIELDS else [] if f in _TEXT_FIELDS else array("q") for f in REQUEST_FIELDS
        }
        self.num_output_tokens = self.cols["num_output_tokens"]
        self.steps: list[dict] = []
        self.reused_samples = 0  # samples launched past the trace's count, reusing its samples
        self.multi_turn: dict | None = None  # a multi-turn trace's run metrics (rlsim.driver.turns)

    def launch(self, reqs, now: float, step: int) -> None:  # noqa: ANN001 - a RequestBatch
        """Record a batch of launched requests (one extend per column: the hot path of an epoch)."""
        c, k = self.cols, len(reqs)
        fields = dict(zip(_REQUEST, reqs.columns, strict=True))
        c["num_output_tokens"].extend(array("q", fields["kept_tokens"]))
        for name in (
            "request_id",
            "epoch",
            "prompt_id",
            "sample_idx",
            "instance",
            "policy_version",
            "num_prompt_tokens",
            "kept_tokens",
        ):
            c[name].extend(array("q", fields[name]))  # (built from a list in C, then copied)
        for name, value in (
            ("step", step), ("launch_time", now), ("first_token_time", np.nan), ("finish_time", np.nan),
            ("finish_reason", ""), ("outcome", "in_flight"),
            ("trained_step", -1), ("staleness", -1), ("preemptions", 0),
        ):  # fmt: skip
            col = c[name]
            col.extend(array(col.typecode, [value]) * k if isinstance(col, array) else [value] * k)

    def engine_aborts(self) -> dict[str, int]:
        """Requests the engine aborted of its own accord, by reason (not a policy's aborts)."""
        c, out = self.cols, {}
        for outcome, reason in zip(c["outcome"], c["finish_reason"], strict=True):
            if outcome == "aborted" and reason != "abort":
                out[reason] = out.get(reason, 0) + 1
        return out

    def continued(self, rid: int) -> None:
        """An ended chunk whose response a later request continues (its tokens are not waste)."""
        self.cols["outcome"][rid] = "continued"

    def preempted(self, rid: int) -> None:
        self.cols["preemptions"][rid] += 1

    def step_done(self, w: StepWindow, ids, requests, version: int, index, r0: int, num_gpus: int) -> None:  # noqa: ANN001
        c = self.cols
        rows = np.fromiter(ids, np.int64, len(ids))
        lengths = column(c["num_output_tokens"])[rows].astype(float)
        reasons = [c["finish_reason"][r] for r in ids]
        # `requests`: the driver's RequestTable, read by column
        q_epoch, q_prompt = column(requests.epoch)[rows].tolist(), column(requests.prompt_id)[rows].tolist()
        stale = (version - column(requests.policy_version)[rows]).astype(float)
        column(c["trained_step"])[rows] = w.step
        column(c["staleness"])[rows] = stale.astype(np.int64)
        visits = set(zip(q_epoch, q_prompt, strict=True))
        unbiased = np.mean(index.unbiased_means(visits, r0)) if visits else np.nan
        gen = w.gen_end - w.start
        n = len(w.busy_start)
        busy = sum(b1 - b0 for b0, b1 in zip(w.busy_start, w.busy_gen, strict=True))
        busy_step = sum(b1 - b0 for b0, b1 in zip(w.busy_start, w.busy_end, strict=True))
        idle_first = (w.gen_end - min(w.last_busy)) / gen if gen > 0 and w.last_busy else 0.0
        step_time = w.end - w.start
        slots = getattr(w.engine, "max_num_seqs", 0)
        tokens = float(lengths.sum() + column(requests.num_prompt_tokens)[rows].sum())
        self.steps.append(
            {
                "step": w.step,
                "epoch": int(max(set(q_epoch), key=q_epoch.count)) if q_epoch else -1,
                "time/start": w.start,
                "time/end": w.end,
                "timing_s/gen": gen,
                "timing_s/reward": max(0.0, w.reward_end - w.gen_end - w.cost.rollout_sleep),
                **w.cost.columns(),
                "timing_s/step": step_time,
                "time/train_start": w.train_start,
                "time/sync_start": np.nan if w.sync_start is None else w.sync_start,
                "time/sync_begin": np.nan if w.sync_begin is None else w.sync_begin,
                # veRL fully-async's names, over the whole step: the trainer idles until the
                # update can start (samples and rewards in); the rollout idles where an
                # instance runs no request
                "trainer/idle_ratio": (w.train_start - w.start) / step_time if step_time > 0 else 0.0,
                "rollouter/idle_ratio": max(0.0, 1.0 - busy_step / (n * step_time)) if step_time > 0 and n else 0.0,
                "response_length/mean": float(lengths.mean()) if len(lengths) else np.nan,
                "response_length/max": float(lengths.max()) if len(lengths) else np.nan,
                "response_length/clip_ratio": float(np.mean([x == "length" for x in reasons])) if reasons else 0.0,
                "num_prompts": len(set(q_prompt)),
                "num_samples": len(ids),
                "perf/throughput": tokens / step_time / num_gpus if step_time else 0.0,
                "bubble_ratio": 1.0 - busy / (n * gen) if gen > 0 else 0.0,
                "slot_bubble_ratio": 1.0 - (w.slots_gen - w.slots_start) / (n * slots * gen)
                if gen > 0 and slots
                else float("nan"),
                "rollout/first_done_idle_ratio": idle_first,
                "staleness/max": float(stale.max()) if len(stale) else 0.0,
                "staleness/mean": float(stale.mean()) if len(stale) else 0.0,
                "trained_length_bias": float(lengths.mean() / unbiased) if len(lengths) else np.nan,
                "length_order_bias": float(lengths.mean() / index.epoch_mean(max(set(q_epoch), key=q_epoch.count), r0))
                if len(lengths)
                else np.nan,
                **w.extra,
            }
        )

    def finalize(self) -> None:
        """Count wasted tokens per step: generated for samples that were never trained."""
        c = self.cols
        n = len(self.steps) + 1
        step = np.minimum(np.asarray(c["step"], dtype=np.int64), len(self.steps))
        outcome = np.asarray(c["outcome"])
        tokens = np.asarray(c["num_output_tokens"], dtype=float)
        tokens -= np.asarray(c["kept_tokens"], dtype=float)  # what each request generated itself
        wasted_mask = (np.asarray(c["trained_step"]) < 0) & (outcome != "in_flight") & (outcome != "continued")
        launched = np.bincount(step, minlength=n)
        aborted = np.bincount(step, weights=(outcome == "aborted").astype(float), minlength=n)
        wasted = np.bincount(step, weights=np.where(wasted_mask, tokens, 0.0), minlength=n)
        for row in self.steps:
            s = row["step"]
            row["wasted_tokens"] = float(wasted[s])
            row["response/aborted_ratio"] = float(aborted[s] / launched[s]) if launched[s] else 0.0

    def requests_frame(self) -> pd.DataFrame:
        return pd.DataFrame({k: np.asarray(v) if isinstance(v, array) else v for k, v in self.cols.items()})

    def steps_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.steps)
