"""The event-jumping fast path against `--exact` (one iteration at a time), every policy.

The workload is a slice of the bundled trace over two epochs (so HistoSpec drafts and history-
based placement act), on an engine at `gpu_memory_utilization` 0.45, whose KV cache is tight
enough that every policy preempts, in both placements. The two paths must agree at full strength:
every time of every request and every step within a relative 1e-9, and every count (preemptions,
aborts, wasted tokens, tokens, outcomes, instances) equal. Each case also asserts that it
exercises what it claims: preemptions under every policy, aborts under the policies that abort,
and a training pause that interrupts a jump under the policies that carry requests into training.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest

from policies.registry import REGISTRY
from rlsim.config import ClusterConfig, EngineConfig, RLConfig
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
KV_TIGHT = EngineConfig(gpu_memory_utilization=0.45)
CARRY = ("histopipe(cross_step=true)", "async_partial", "sortedrl(mode=partial)")  # run into training
INTERRUPT = ("fully_async", "areal")  # their syncs stop the rollout and free the KV of requests in flight
ABORT = ("rollpacker", "sortedrl")  # abort the tail of a step
RTOL = 1e-9


@functools.lru_cache(maxsize=1)
def _slice() -> Trace:
    tr = load(default_trace(), columns=[])
    keep = np.sort(tr.table["prompt_id"].unique())[:160]
    table = tr.table[tr.table["prompt_id"].isin(keep)].reset_index(drop=True)
    return Trace(table, tr.meta)


def assert_tables_match(fast: pd.DataFrame, exact: pd.DataFrame, what: str) -> None:
    """Same rows and columns; times within a relative 1e-9 (NaN where NaN), ratios and other
    floats within 1e-9 relative or 1e-12 absolute (a ratio of 0 may come out as -2e-16), every
    other column equal."""
    assert list(fast.columns) == list(exact.columns), what
    assert len(fast) == len(exact), what
    for col in fast.columns:
        a, b = fast[col].to_numpy(), exact[col].to_numpy()
        if np.issubdtype(a.dtype, np.floating):
            atol = 0.0 if "time" in col else 1e-12
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=atol, err_msg=f"{what}: {col}")
        else:
            assert (a == b).all(), f"{what}: {col} differs in {int((a != b).sum())} rows"


DISAGGREGATED_ONLY = ("fully_async", "areal")
CASES = [(p, pl) for pl in PLACEMENTS for p in POLICIES
         if pl == "disaggregated" or p.split("(")[0].split("+")[0] not in DISAGGREGATED_ONLY]  # fmt: skip


@pytest.mark.parametrize(("policy", "placement"), CASES)
def test_fast_path_matches_exact(policy: str, placement: str) -> None:
    """Every request's and every step's times within 1e-9 of --exact, every count equal."""
    cluster = PLACEMENTS[placement]
    fast = simulate(_slice(), policy, cluster, RL, engine_cfg=KV_TIGHT)
    exact = simulate(_slice(), policy, cluster, RL, exact=True, engine_cfg=KV_TIGHT)
    assert_tables_match(fast.requests, exact.requests, "requests")
    assert_tables_match(fast.steps, exact.steps, "steps")
    for key in ("preemptions", "wasted_tokens", "num_requests", "trained_samples", "num_steps",
                "wake_reprefill_tokens", "prefix_hit_tokens", "reused_samples"):  # fmt: skip
        assert fast.summary[key] == exact.summary[key], key
    assert fast.summary["total_time_s"] == pytest.approx(exact.summary["total_time_s"], rel=RTOL, abs=0)
    # What the case exercises, counted on the fast path (equal on both, by the asserts above).
    base = policy.split("+")[0]
    assert fast.summary["preemptions"] > 0, "the KV-tight engine preempts under every policy"
    if base in ABORT:
        assert (fast.requests["outcome"] == "aborted").sum() > 0, f"{base} aborts"
        assert fast.summary["wasted_tokens"] > 0
    if base in INTERRUPT:
        assert fast.summary["wake_reprefill_tokens"] > 0, "requests interrupted by a sync re-prefill"
    if placement == "colocated" and base in CARRY:
        assert fast.summary["pause_interrupts"] > 0, "a training pause interrupts a jump"
        assert fast.summary["wake_reprefill_tokens"] > 0, "and carried requests re-prefill"


def test_the_slice_drafts_on_its_second_visit() -> None:
    """HistoSpec has a second visit to draft from, and its drafts speed that visit."""
    res = simulate(_slice(), "sortedrl+histospec", PLACEMENTS["colocated"], RL)
    assert len(res.summary["epoch_time_s"]) == 2
    second = res.steps[res.steps["epoch"] == 1]["timing_s/gen"].sum()
    plain = simulate(_slice(), "sortedrl", PLACEMENTS["colocated"], RL).steps
    assert second < plain[plain["epoch"] == 1]["timing_s/gen"].sum()


def test_a_wrong_fast_path_fails_the_comparison() -> None:
    """The comparison can fail: a finish time moved by one part in 1e8 is caught."""
    res = simulate(_slice(), "sync", PLACEMENTS["colocated"], RL, engine_cfg=KV_TIGHT)
    moved = res.requests.copy()
    moved.loc[moved.index[-1], "finish_time"] *= 1 + 1e-8
    with pytest.raises(AssertionError):
        assert_tables_match(moved, res.requests, "requests")
