"""The event-jumping fast path against `--exact` (one iteration at a time), every policy.

The workload is a slice of the bundled trace over two epochs (so HistoSpec drafts and history-
based placement act), on a KV cache tight enough to preempt, in both placements. Colocated
training pauses the engines mid-jump: the test asserts that it did, and that no more requests
finish inside training windows on the fast path than iteration by iteration.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from policies.registry import REGISTRY
from rlsim.config import ClusterConfig, RLConfig
from rlsim.paths import default_trace
from rlsim.sim.simulate import simulate
from rlsim.trace.format import Trace, load

POLICIES = [*REGISTRY, *(f"{p}+histospec" for p in REGISTRY), "histopipe(cross_step=true)", "sortedrl(mode=partial)"]
PLACEMENTS = {
    "colocated": ClusterConfig(num_gpus=16, profile="h100-qwen2.5-32b-tp2"),
    "disaggregated": ClusterConfig(
        num_gpus=24, profile="h100-qwen2.5-32b-tp2", placement="disaggregated", train_gpus=8
    ),
}
RL = RLConfig(prompts_per_step=64, samples_per_prompt=16, epochs=2)
CARRY = ("histopipe(cross_step=true)", "async_partial", "sortedrl(mode=partial)")  # run into training


@functools.lru_cache(maxsize=1)
def _slice() -> Trace:
    tr = load(default_trace(), columns=[])
    keep = np.sort(tr.table["prompt_id"].unique())[:160]
    table = tr.table[tr.table["prompt_id"].isin(keep)].reset_index(drop=True)
    return Trace(table, tr.meta)


def _finished_in_training(res) -> int:  # noqa: ANN001 - a Result
    """Requests whose finish falls strictly inside a step's training window."""
    st, t = res.steps, res.requests["finish_time"].to_numpy()
    gen_end = (st["time/start"] + st["timing_s/gen"]).to_numpy()
    return int(sum(((t > a + 1e-9) & (t < b - 1e-9)).sum() for a, b in zip(gen_end, st["time/end"], strict=True)))


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("policy", POLICIES)
def test_fast_path_matches_exact(policy: str, placement: str) -> None:
    """Total time within 0.5% of --exact; training pauses interrupt jumps, as they do iterations."""
    cluster = PLACEMENTS[placement]
    fast = simulate(_slice(), policy, cluster, RL)
    exact = simulate(_slice(), policy, cluster, RL, exact=True)
    assert fast.summary["total_time_s"] == pytest.approx(exact.summary["total_time_s"], rel=0.005)
    assert fast.summary["num_steps"] == exact.summary["num_steps"]
    assert _finished_in_training(fast) <= _finished_in_training(exact)
    assert fast.summary["wake_reprefill_tokens"] == exact.summary["wake_reprefill_tokens"]
    if placement == "colocated" and policy.split("+")[0] in CARRY:
        assert fast.summary["pause_interrupts"] > 0  # the workload exercises a pause mid-jump
        assert fast.summary["wake_reprefill_tokens"] > 0  # and carried requests re-prefill


def test_the_slice_preempts_and_drafts() -> None:
    """The workload is tight enough to preempt, and HistoSpec has a second visit to draft from."""
    res = simulate(_slice(), "sortedrl+histospec", PLACEMENTS["colocated"], RL)
    assert res.summary["preemptions"] > 0
    assert len(res.summary["epoch_time_s"]) == 2
    first, second = (g["timing_s/gen"].sum() for _, g in res.steps.groupby("epoch"))
    plain = simulate(_slice(), "sortedrl", PLACEMENTS["colocated"], RL).steps
    assert second < plain[plain["epoch"] == 1]["timing_s/gen"].sum()  # drafts speed the second visit
