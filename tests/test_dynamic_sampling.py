"""DAPO dynamic sampling (`+dynamic_sampling`): exactly P0 valid groups per step, the rest wasted."""

from __future__ import annotations

import numpy as np
import pytest

from rlsim.errors import RlsimError
from rlsim.trace.format import Trace
from tests.test_policies import make_trace, run


def _trace_with_rewards(num_prompts: int = 40, samples: int = 4) -> Trace:
    """Prompt p's samples: all wrong if p % 3 == 0, all right if p % 3 == 1, mixed if p % 3 == 2."""
    rng = np.random.default_rng(0)
    tr = make_trace(rng.integers(20, 400, (1, num_prompts, samples)))
    p, s = tr.table["prompt_id"].to_numpy(), tr.table["sample_idx"].to_numpy()
    tr.table["reward"] = np.where(p % 3 == 0, -1.0, np.where(p % 3 == 1, 1.0, np.where(s % 2 == 0, 1.0, -1.0)))
    return tr


@pytest.mark.parametrize("policy", ["sync", "async_partial", "rollpacker", "sortedrl(keep_groups=true)"])
def test_every_step_trains_exactly_p0_valid_groups(policy: str) -> None:
    """Each full step trains P0 groups whose rewards differ; all-equal groups are never trained,
    and every sample generated but not trained counts as wasted."""
    tr = _trace_with_rewards()
    req, steps, _ = run(f"{policy}+dynamic_sampling", tr, 4, 4)
    trained = req[req.trained_step >= 0]
    assert (trained.prompt_id % 3 == 2).all()  # only valid groups train
    per_step = trained.groupby("trained_step").prompt_id.nunique()
    assert (per_step.iloc[:-1] == 4).all() and per_step.iloc[-1] <= 4  # the last step may run out of prompts
    assert (trained.groupby("prompt_id").size() == 4).all()  # whole groups
    assert steps["dynamic_sampling/dropped_groups"].sum() > 0
    assert (steps["dynamic_sampling/num_gen_batches"] > 1).any()
    done = req[req.outcome != "in_flight"]
    untrained = done[done.trained_step < 0]
    assert steps["wasted_tokens"].sum() == untrained.num_output_tokens.sum() > 0


def test_max_num_gen_batches_bounds_the_step() -> None:
    """With one generation batch per step, a step trains the valid groups it found, fewer than P0."""
    req, steps, _ = run("sync+dynamic_sampling(max_num_gen_batches=1)", _trace_with_rewards(), 6, 4)
    assert (steps["dynamic_sampling/num_gen_batches"] == 1).all()
    assert steps["num_prompts"].max() < 6


def test_every_prompt_is_generated_once_per_epoch() -> None:
    """Dropped groups count as visited: the epoch hands out every prompt exactly once."""
    req, _, _ = run("sync+dynamic_sampling", _trace_with_rewards(), 4, 4)
    assert sorted(req.prompt_id.unique()) == list(range(40))
    assert (req.groupby("prompt_id").size() == 4).all()


def test_epochs_end_without_waiting_on_the_next_epochs_prompts() -> None:
    """At an epoch's end the step trains the valid groups it has (fewer than P0), even with no
    limit on generation batches: the next epoch's prompts wait for this one to train."""
    rng = np.random.default_rng(1)
    tr = make_trace(rng.integers(20, 400, (2, 40, 4)))
    p, s = tr.table["prompt_id"].to_numpy(), tr.table["sample_idx"].to_numpy()
    tr.table["reward"] = np.where(p % 3 == 2, np.where(s % 2 == 0, 1.0, -1.0), -1.0)
    req, steps, _ = run("sync+dynamic_sampling(max_num_gen_batches=0)", tr, 4, 4, epochs=2)
    trained = req[req.trained_step >= 0]
    surplus = steps.groupby("epoch")["dynamic_sampling/surplus_groups"].sum()
    # every one of the 13 valid groups of each epoch trains once or is discarded as surplus
    per_epoch = trained.groupby("epoch").prompt_id.nunique().add(surplus, fill_value=0)
    assert per_epoch.loc[[0, 1]].tolist() == [13, 13]
    assert (steps["dynamic_sampling/num_gen_batches"] <= 10).all()


def test_a_trace_without_rewards_is_one_sentence() -> None:
    with pytest.raises(RlsimError, match="needs rewards"):
        run("sync+dynamic_sampling", make_trace(np.full((1, 8, 4), 50)), 4, 4)


def test_single_trajectory_updates_refuse_dynamic_sampling() -> None:
    with pytest.raises(RlsimError, match="keep_groups=true"):
        run("sortedrl+dynamic_sampling", _trace_with_rewards(), 4, 4)


def test_bundled_trace_drops_about_as_many_groups_as_dapo_did() -> None:
    """The bundled trace's rewards drop 60% of 16-sample groups: the verl DAPO run dropped 68.4% of
    its 8-sample groups at the start of training, which the reward model reproduces at n = 8."""
    from rlsim.paths import default_trace
    from rlsim.trace.format import load

    t = load(default_trace(), columns=["reward"]).table
    first = t[t.epoch == 0]

    def dropped(n: int) -> float:
        g = first[first.sample_idx < n].groupby("prompt_id").reward
        return float((g.nunique() == 1).mean())

    assert dropped(8) == pytest.approx(0.684, abs=0.02)
    assert 0.55 < dropped(16) < 0.65
