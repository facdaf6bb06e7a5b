"""Dispatch: per-sample least-loaded placement, its batch accounting, and the other rules."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rlsim.driver.dispatch import least_loaded
from tests.test_policies import make_trace, run


def _greedy(counts: list[int], k: int) -> list[int]:
    """The rule as stated: one sample at a time to the fewest assigned, lowest index on ties."""
    c, out = list(counts), []
    for _ in range(k):
        i = min(range(len(c)), key=lambda j: (c[j], j))
        c[i] += 1
        out.append(i)
    return out


@given(st.lists(st.integers(0, 40), min_size=1, max_size=12), st.integers(0, 200))
def test_least_loaded_equals_one_at_a_time_greedy(counts: list[int], k: int) -> None:
    """The one-sort assignment is exactly the sample-by-sample greedy rule, counts included."""
    want = _greedy(counts, k)
    got_counts = list(counts)
    assert least_loaded(got_counts, k) == want
    assert got_counts == [c + want.count(i) for i, c in enumerate(counts)]


def test_per_sample_dispatch_spreads_a_prompts_samples() -> None:
    """By default each sample of a prompt is its own request: a group of 4 lands on 4 instances."""
    tr = make_trace(np.full((1, 8, 4), 50))
    req, _, _ = run("sync", tr, 8, 4)
    assert (req.groupby("prompt_id").instance.nunique() == 4).all()
    per_prompt, _, _ = run("sync", tr, 8, 4, dispatch="per_prompt")
    assert (per_prompt.groupby("prompt_id").instance.nunique() == 1).all()


def test_least_loaded_balances_a_whole_step() -> None:
    """A step launched at once is spread evenly (loads counted as the batch is placed), not sent
    to the instance that was least loaded before the batch."""
    tr = make_trace(np.full((1, 10, 4), 50))
    req, _, _ = run("sync", tr, 10, 4)
    per_instance = req[req.step == 0].instance.value_counts()
    assert sorted(per_instance.tolist()) == [10, 10, 10, 10]
    rr, _, _ = run("sync", tr, 10, 4, dispatch="round_robin")
    assert sorted(rr[rr.step == 0].instance.value_counts().tolist()) == [10, 10, 10, 10]


def test_least_loaded_fills_the_instance_that_freed_up() -> None:
    """Samples launched mid-step go to the instances with the fewest unfinished requests."""
    lengths = np.full((1, 12, 2), 10)
    lengths[0, :4, :] = 5000  # the first step's samples on some instances run long
    tr = make_trace(lengths)
    req, _, _ = run("async_partial", tr, 4, 2)
    late = req[req.launch_time > 0]
    assert len(late) > 0
    assert late.instance.nunique() > 1
