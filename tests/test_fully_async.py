"""Fully-async RL: veRL's `fully_async` and NeMo RL's `k_step_off`, held to what they claim.

- k_step_off(k): no sample trains more than k versions after its launch, and k is reached;
  `one_step_off` is k_step_off(k=1), the same run to the byte.
- fully_async: production never runs ahead of veRL's threshold, recomputed from the records (not
  from the policy's counter); this bounds samples produced per sync, not version lag, which here
  exceeds the syncs' spacing.
- the recorded `trainer/idle_ratio` and `rollouter/idle_ratio` agree with the ratios recomputed
  from the run's Perfetto trace (its trainer and instance slices).
- the partial ratio does not fall as the threshold rises, over a stated grid.
- on uniform lengths each new policy, in the configuration its documentation calls equivalent to
  one_step_off (areal at its defaults), is within 5% of one_step_off on the same (disaggregated)
  placement; fully_async at its defaults is not held to it (measured +4.7%: a sync every four
  local updates, each paying the update's fixed cost, against no old log-prob pass).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from policies.registry import make_policy
from rlsim.config import ClusterConfig, RLConfig
from rlsim.errors import RlsimError
from rlsim.report import write_run_dir
from rlsim.sim.simulate import simulate
from tests.test_fast_vs_exact import _slice
from tests.test_policies import make_trace

# 160 prompts of the bundled trace, two epochs; 8 rollout instances (TP 2) and 8 training GPUs
DISAGG = ClusterConfig(num_gpus=24, profile="h100-qwen2.5-32b-tp2", placement="disaggregated", train_gpus=8)
RL = RLConfig(prompts_per_step=64, samples_per_prompt=16, epochs=2)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_k_step_off_staleness_is_bounded_by_k_and_reaches_it(k: int) -> None:
    res = simulate(_slice(), f"k_step_off(k={k})", DISAGG, RL)
    trained = res.requests[res.requests.trained_step >= 0]
    # bounded, and the bound is used (an epoch here is three batches and a barrier: 2 ahead at most)
    assert trained.staleness.max() == min(k, 2)
    assert res.summary["trained_samples"] == 2 * 160 * 16  # every prompt trains once per epoch


def test_one_step_off_is_k_step_off_of_one() -> None:
    a = simulate(_slice(), "one_step_off", DISAGG, RL)
    b = simulate(_slice(), "k_step_off(k=1)", DISAGG, RL)
    assert a.steps.equals(b.steps) and a.requests.equals(b.requests)
    assert make_policy("one_step_off").same_as == "k_step_off(k=1)"


def _consumed_at(res) -> pd.Series:  # noqa: ANN001
    """Each visit's consumption time: the trainer takes its group when the update is decided."""
    steps = res.steps.set_index("step")
    when = steps["time/start"] + steps["timing_s/gen"]
    trained = res.requests[res.requests.trained_step >= 0]
    return trained.groupby(["epoch", "prompt_id"]).trained_step.first().map(when)


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_fully_async_never_produces_past_the_staleness_threshold(threshold: float) -> None:
    """Between two syncs the rollouter owes at most max_required_samples groups: those produced
    or in production and not consumed when the sync ended, plus those it started since."""
    name = f"fully_async(staleness_threshold={threshold})"
    res = simulate(_slice(), name, DISAGG, RL)
    policy = make_policy(name)
    batches, trigger = policy.config.require_batches, policy.config.trigger_parameter_sync_step
    mini = RL.prompts_per_step // (batches * trigger)
    max_required = int(mini * batches * (1 + threshold) * trigger)
    req = res.requests
    launched = req.groupby(["epoch", "prompt_id"]).launch_time.min()
    consumed = _consumed_at(res).reindex(launched.index).fillna(np.inf)
    steps = res.steps
    syncs = [0.0, *steps.loc[steps["time/sync_start"].notna(), "time/end"].tolist()]
    assert len(syncs) > 3
    owed = []
    for t0, t1 in zip(syncs, [*syncs[1:], np.inf], strict=True):
        carried = ((launched < t0) & (consumed >= t0)).sum()
        started = ((launched >= t0) & (launched < t1)).sum()
        owed.append(carried + started)
    assert max(owed) <= max_required, (owed, max_required)
    assert max(owed) == max_required  # the bound binds (the rollouter paused on it)
    # a bound on production, not on version lag: local updates between syncs age every sample
    # (threshold 0: up to trigger_parameter_sync_step - 1 versions), and samples produced ahead
    # of a sync train more versions later still
    assert res.summary["staleness_max"] >= trigger - 1
    if threshold > 0:
        assert res.summary["staleness_max"] > trigger


def test_idle_ratios_agree_with_the_perfetto_timeline(tmp_path: Path) -> None:
    res = simulate(_slice(), "fully_async", DISAGG, RL)
    trace = json.loads((write_run_dir(res, tmp_path / "run") / "trace.json").read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "thread_name"}
    slices = [e for e in trace if e["ph"] == "X"]
    trainer = [(e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in slices if names[e["tid"]] == "trainer"]
    rollout = [(e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in slices if names[e["tid"]].startswith("instance")]
    assert {e["name"] for e in slices if names[e["tid"]] == "trainer"} == {"update", "sync"}
    n = sum(1 for v in names.values() if v.startswith("instance"))

    def overlap(segs: list[tuple[float, float]], a: float, b: float) -> float:
        return sum(max(0.0, min(e, b) - max(s, a)) for s, e in segs)

    for _, row in res.steps.iterrows():
        a, b = row["time/start"], row["time/end"]
        assert 1 - overlap(trainer, a, b) / (b - a) == pytest.approx(row["trainer/idle_ratio"], abs=1e-9)
        idle = max(0.0, 1 - overlap(rollout, a, b) / (n * (b - a)))
        assert idle == pytest.approx(row["rollouter/idle_ratio"], abs=1e-9)
    assert res.steps["trainer/idle_ratio"].max() > 0 and res.steps["rollouter/idle_ratio"].max() > 0


GRID = (0.1, 0.25, 0.5, 1.0)


def test_partial_ratio_does_not_fall_as_the_threshold_rises() -> None:
    """Over staleness_threshold in GRID (partial rollout on): the share of trained responses whose
    generation spanned a sync, over the run."""
    ratios = []
    for s in GRID:
        steps = simulate(_slice(), f"fully_async(staleness_threshold={s})", DISAGG, RL).steps
        w = steps["num_samples"]
        ratios.append(float((steps["fully_async/partial/partial_ratio"] * w).sum() / w.sum()))
    assert all(b >= a for a, b in zip(ratios, ratios[1:], strict=False)), ratios
    assert ratios[-1] > 0, "requests in flight at a sync continue under the new weights"


# veRL: "when rollout is fast enough, setting staleness_threshold to 1 is basically equivalent to
# one_step_off" (with one update per sync and the same training phases: old log-probs recomputed,
# weights moved tensor by tensor). Its defaults differ on purpose (half a batch ahead, four local
# updates per sync each paying the update's fixed cost), so they are not held to this.
EQUIVALENT = (
    "fully_async(staleness_threshold=1,trigger_parameter_sync_step=1,use_rollout_log_probs=false,"
    "checkpoint_engine=false)",
    "fully_async(staleness_threshold=1,trigger_parameter_sync_step=1,use_rollout_log_probs=false,"
    "checkpoint_engine=false,partial_rollout=false)",
    "k_step_off(k=2)",
    "k_step_off(k=3)",
    "areal",  # at its defaults: one update per sync, proximal log-probs recomputed, eta 4
)


@pytest.mark.parametrize("name", EQUIVALENT)
def test_uniform_lengths_new_policies_match_one_step_off(name: str) -> None:
    tr = make_trace(np.full((2, 512, 10), 1500), max_len=4096)
    rl = RLConfig(prompts_per_step=32, samples_per_prompt=8, epochs=2, max_response_len=4096)
    cl = ClusterConfig(num_gpus=88, profile="h100-qwen2.5-32b-tp2", placement="disaggregated", train_gpus=8)
    base = simulate(tr, "one_step_off", cl, rl).summary["total_time_s"]
    assert simulate(tr, name, cl, rl).summary["total_time_s"] == pytest.approx(base, rel=0.05)


def test_fully_async_needs_a_disaggregated_cluster() -> None:
    with pytest.raises(RlsimError, match="--placement disaggregated"):
        simulate(_slice(), "fully_async", ClusterConfig(num_gpus=16, profile="h100-qwen2.5-32b-tp2"), RL)


def test_the_checkpoint_engine_shortens_the_sync() -> None:
    """Weights in 4 GiB buckets pay the per-tensor cost once a bucket (veRL reports more than 60%
    less sync time than per-tensor sync: reported by docs/simulate.md, not tuned to)."""
    on = simulate(_slice(), "fully_async", DISAGG, RL).steps
    off = simulate(_slice(), "fully_async(checkpoint_engine=false)", DISAGG, RL).steps
    sync_on = on.loc[on["timing_s/update_weights"] > 0, "timing_s/update_weights"]
    sync_off = off.loc[off["timing_s/update_weights"] > 0, "timing_s/update_weights"]
    assert sync_on.max() < sync_off.min()
    assert (on.loc[on["time/sync_start"].isna(), "timing_s/update_weights"] == 0).all()  # local updates


def test_areal_is_fully_async_with_one_update_per_sync() -> None:
    """AReaL's bound is a parameterisation of fully_async: the same run to the byte."""
    areal = make_policy("areal(max_head_offpolicyness=2)")
    a = simulate(_slice(), "areal(max_head_offpolicyness=2)", DISAGG, RL)
    b = simulate(_slice(), areal.same_as, DISAGG, RL)
    assert a.steps.equals(b.steps) and a.requests.equals(b.requests)
    assert a.summary["wake_reprefill_tokens"] > 0  # generations interrupted at updates continued
