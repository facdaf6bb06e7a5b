"""Each policy driven by the real driver against a fake engine (no SimPy): its algorithm, step by step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from policies.registry import make_policy, parse_policy
from rlsim.config import ClusterConfig, RLConfig
from rlsim.driver.loop import run_loop
from rlsim.errors import RlsimError
from rlsim.profile import load_profile
from rlsim.protocol import Finished, Launch, Train
from rlsim.trace.format import Trace, TraceMeta, validate_table
from tests.fake_engine import FakeEngine

PROFILE = dataclasses.replace(load_profile("h100-qwen2.5-7b-tp1"), weight_sync_s=0.0)


def cluster_for(name: str, num_gpus: int, **kw) -> ClusterConfig:  # noqa: ANN003
    """`num_gpus` rollout GPUs for a policy: a policy that runs only disaggregated (fully_async)
    gets one more GPU to train on, so that its rollout has the same instances as the others'."""
    need = getattr(make_policy(name.split("+")[0]), "placement", None)
    if need == "disaggregated":
        return ClusterConfig(num_gpus=num_gpus + 1, placement="disaggregated", train_gpus=1, **kw)
    return ClusterConfig(num_gpus=num_gpus, **kw)


def make_trace(lengths: np.ndarray, max_len: int = 10_000) -> Trace:
    """A trace from an array of lengths shaped (epochs, prompts, samples)."""
    e, p, s = lengths.shape
    idx = np.indices(lengths.shape).reshape(3, -1)
    df = pd.DataFrame(
        {
            "epoch": idx[0].astype("int32"),
            "prompt_id": idx[1].astype("int64"),
            "sample_idx": idx[2].astype("int32"),
            "num_prompt_tokens": np.full(e * p * s, 100, dtype="int32"),
            "num_output_tokens": lengths.reshape(-1).astype("int32"),
            "finish_reason": np.where(lengths.reshape(-1) >= max_len, "length", "stop"),
        }
    )
    meta = TraceMeta("test", max_len, s, "synthetic:test")
    validate_table(df, meta)
    return Trace(df, meta)


def run(policy: str, trace: Trace, p0: int, r0: int, instances: int = 4, epochs: int = 1, **cl):  # noqa: ANN003, ANN201
    engine = FakeEngine(instances, dt=0.01)
    cap = trace.meta.max_response_len
    rl = RLConfig(prompts_per_step=p0, samples_per_prompt=r0, epochs=epochs, max_response_len=cap)
    ds = parse_policy(policy).dynamic_sampling
    rec = run_loop(
        engine, make_policy(policy), trace, PROFILE, ClusterConfig(num_gpus=instances, **cl), rl, dynamic_sampling=ds
    )
    return rec.requests_frame(), rec.steps_frame(), engine


def trained_prompts(req: pd.DataFrame) -> pd.Series:
    return req[req.trained_step >= 0].groupby("trained_step").prompt_id.nunique()


def test_sync_trains_each_batch_whole() -> None:
    """Sync launches P0 x R0, trains on all of them, aborts nothing."""
    rng = np.random.default_rng(0)
    tr = make_trace(rng.integers(10, 1000, (1, 16, 4)))
    req, steps, _ = run("sync", tr, 4, 4)
    assert steps.num_samples.tolist() == [16] * 4 and (req.outcome == "finished").all()


def test_rollpacker_period_is_four_short_rounds_then_one_long() -> None:
    """eta_p = 1.25: each short round queues P0/4 prompts, so every fifth round is long; a long
    round restarts its prompts from their first sample and waits for all of them."""
    rng = np.random.default_rng(1)
    tr = make_trace(rng.integers(10, 2000, (1, 200, 10)))
    req, steps, _ = run("rollpacker", tr, 8, 8)
    assert (steps.num_samples == 64).all() and (steps.num_prompts == 8).all()
    launched = req.groupby("step").size()
    kinds = ["long" if n == 64 else "short" for n in launched.iloc[:10]]
    assert kinds == ["short"] * 4 + ["long"] + ["short"] * 4 + ["long"]
    short = steps.step.isin(launched[launched == 10 * 10].index)
    assert launched.iloc[0] == 10 * 10  # int(1.25 * 8) prompts x ceil(1.25 * 8) samples
    assert (steps.loc[short, "trained_length_bias"] < 1).all()  # keeps the fastest R0 of 10
    assert (steps["staleness/max"] == 0).all() and steps.wasted_tokens.sum() > 0
    long_rounds = req[req.step.isin([4, 9])]
    assert (long_rounds.sample_idx < 8).all() and (long_rounds.outcome == "finished").all()


def test_rollpacker_eta_r_alone_never_queues() -> None:
    """With eta_p = 1 every prompt of a short round must complete: no queue, no long round."""
    tr = make_trace(np.random.default_rng(2).integers(10, 2000, (1, 40, 10)))
    req, steps, _ = run("rollpacker(eta_p=1)", tr, 8, 8)
    assert (req.groupby("step").size() == 80).all() and len(steps) == 5


def test_sortedrl_loads_a_group_whole_and_updates_every_u_trajectories() -> None:
    """On-policy SortedRL (docs/policies.md): a group of 4 x P0 prompts is loaded at once and
    drained before the next is loaded; every U = P0 x R0 finished trajectories train, sorted by
    length (short first); what is in flight at an update is aborted and drawn again (the same
    trace sample by default, a new one with redraw=fresh); nothing trained is stale."""
    rng = np.random.default_rng(0)
    tr = make_trace(rng.integers(10, 3000, (1, 32, 8)))
    req, steps, _ = run("sortedrl", tr, 4, 4)
    assert req[req.step == 0].prompt_id.nunique() == 16  # group = 4 x P0
    first_new = req.groupby("prompt_id").step.min()
    assert sorted(first_new.value_counts().index.tolist())[:2] == [0, 4]  # the next group after 4 updates
    assert (steps.num_samples == 16).all() and len(steps) == 8
    assert steps["staleness/max"].max() == 0 and (req.outcome == "aborted").any()
    assert (req.sample_idx < 4).all()  # a thrown-away trajectory comes back as the same sample
    aborted = req[req.outcome == "aborted"]
    again = req.merge(aborted[["prompt_id", "sample_idx", "request_id"]], on=["prompt_id", "sample_idx"])
    assert (again.request_id_x > again.request_id_y).any()
    fresh, _, _ = run("sortedrl(redraw=fresh)", tr, 4, 4)
    assert (fresh.sample_idx >= 4).any()  # new draws of the prompt
    trained = req[req.trained_step >= 0]
    assert trained.groupby("trained_step").prompt_id.nunique().max() > 4  # trajectories, not whole groups
    assert trained.groupby(["epoch", "prompt_id"]).size().eq(4).all()
    s0 = trained[trained.trained_step == 0].num_output_tokens
    assert s0.max() <= trained[trained.trained_step == 3].num_output_tokens.max()


def test_sortedrl_partial_mode_keeps_tokens_and_reports_staleness() -> None:
    """Partial mode keeps every in-flight request across updates (no aborts, no waste): the
    staleness that results is reported, at most G x n / U = 4 versions."""
    rng = np.random.default_rng(3)
    tr = make_trace(rng.integers(10, 3000, (1, 64, 6)))
    req, steps, _ = run("sortedrl(mode=partial)", tr, 4, 4)
    assert 0 < steps["staleness/max"].max() <= 4
    assert not (req.outcome == "aborted").any() and steps.wasted_tokens.sum() == 0
    assert req[req.trained_step >= 0].groupby("prompt_id").size().eq(4).all()


def test_sortedrl_keep_groups_trains_whole_grpo_groups() -> None:
    """keep_groups waits for whole groups: each update holds U / R0 complete prompts."""
    rng = np.random.default_rng(4)
    tr = make_trace(rng.integers(10, 3000, (1, 32, 8)))
    req, steps, _ = run("sortedrl(keep_groups=true)", tr, 4, 4)
    assert (steps.num_prompts == 4).all() and (steps.num_samples == 16).all()
    trained = req[req.trained_step >= 0]
    assert trained.groupby(["epoch", "prompt_id"]).trained_step.nunique().eq(1).all()


def test_async_partial_keeps_over_provisioned_prompts_in_flight() -> None:
    """async_partial keeps 1.5 x P0 prompts in flight and trains P0 complete groups per step."""
    rng = np.random.default_rng(4)
    tr = make_trace(rng.integers(10, 3000, (1, 64, 6)))
    req, steps, _ = run("async_partial", tr, 8, 4)
    assert req[req.step == 0].prompt_id.nunique() == 12
    assert (steps.num_prompts.iloc[:-1] == 8).all() and 0 < steps["staleness/max"].max() <= 1
    assert trained_prompts(req).sum() == 64


def test_one_step_off_launches_next_batch_before_training() -> None:
    """one_step_off launches step t+1 at step t's rollout decision: staleness 1 from step 1 on,
    and under disaggregated placement the next batch generates during training."""
    rng = np.random.default_rng(5)
    tr = make_trace(rng.integers(10, 1000, (1, 32, 4)))
    req, steps, _ = run("one_step_off", tr, 4, 4, instances=4, placement="disaggregated", train_gpus=2)
    assert steps["staleness/max"].tolist() == [0] + [1] * 7
    launch1 = req[req.step == 0].launch_time.max()
    assert launch1 > 0  # the second batch was launched during step 0, before its training


def test_histopipe_places_long_predicted_groups_on_more_instances() -> None:
    """From the second visit on, HistoPipe sorts prompts by their previous mean length and gives
    the long ranking group more instances (fewer samples per instance) than the short one."""
    base = np.repeat(np.array([2000] * 4 + [50] * 12)[None, :, None], 4, axis=2)
    tr = make_trace(np.concatenate([base, base]))
    req, steps, _ = run("histopipe(cross_step=false,num_groups=4)", tr, 16, 4, instances=8, epochs=2)
    second = req[(req.epoch == 1)]
    long_inst = set(second[second.prompt_id < 4].instance)
    short_inst = set(second[second.prompt_id >= 4].instance)
    assert len(long_inst) > 2 and not long_inst & short_inst
    assert steps["staleness/max"].max() == 0


def test_histopipe_cross_step_carries_the_tail() -> None:
    """Tier 2 trains the unfinished tail in the next step with staleness 1."""
    rng = np.random.default_rng(6)
    tr = make_trace(rng.integers(10, 3000, (2, 40, 4)))
    req, steps, _ = run("histopipe(cross_step=true,tail_fraction=0.25)", tr, 8, 4, epochs=2)
    assert steps["staleness/max"].max() == 1
    assert trained_prompts(req).sum() == 80


def test_histopipe_one_step_off_overlaps_the_next_rollout_with_training() -> None:
    """The RhymeRL configuration: step t+1's prompts are placed and launched at step t's update,
    so on separate training GPUs they generate while step t trains (staleness 1, except the first
    step of an epoch: the epoch barrier holds the next epoch's prompts until this one trained)."""
    rng = np.random.default_rng(7)
    tr = make_trace(rng.integers(10, 1000, (2, 32, 4)))
    req, steps, _ = run(
        "histopipe(one_step_off=true)", tr, 4, 4, epochs=2, placement="disaggregated", train_gpus=2
    )
    assert steps["staleness/max"].tolist() == ([0] + [1] * 7) * 2
    assert req[req.step == 0].prompt_id.nunique() == 8  # step 1's prompts launched during step 0
    assert trained_prompts(req).sum() == 64
    with pytest.raises(RlsimError, match="pick one"):
        make_policy("histopipe(one_step_off=true,cross_step=true)")


def test_oracle_spreads_long_samples_over_instances() -> None:
    """LPT puts each long sample on its own instance, where per-prompt dispatch stacks a prompt's samples."""
    lengths = np.full((1, 8, 4), 10)
    lengths[0, 0, :] = 1000  # one long prompt: per-prompt sync puts all four samples on one instance
    tr = make_trace(lengths)
    oracle, _, _ = run("oracle", tr, 8, 4)
    sync, _, _ = run("sync", tr, 8, 4, dispatch="per_prompt")
    assert oracle[oracle.prompt_id == 0].instance.nunique() == 4
    assert sync[sync.prompt_id == 0].instance.nunique() == 1


class PeekingPolicy:
    """A policy that tries to read a length before it is generated."""

    name = "peeking"

    def __init__(self, how: str) -> None:
        self.how = how

    def on_step_start(self, view):  # noqa: ANN001, ANN201
        prompts = view.take_prompts(view.prompts_per_step)
        if self.how == "oracle":
            view.oracle_lengths(prompts[0])
        else:
            view.target_tokens(prompts[0])
        return [Launch(p, view.samples_per_prompt) for p in prompts]

    def on_event(self, event, view):  # noqa: ANN001, ANN201
        return [Train((event.request_id,))] if isinstance(event, Finished) else []


@pytest.mark.parametrize("how", ["oracle", "attribute"])
def test_view_refuses_future_lengths(how: str) -> None:
    """A policy reading a response length before it finished fails with one sentence."""
    tr = make_trace(np.full((1, 8, 4), 10))
    rl = RLConfig(prompts_per_step=4, samples_per_prompt=4, epochs=1)
    with pytest.raises(RlsimError, match="peeking"):
        run_loop(FakeEngine(2), PeekingPolicy(how), tr, PROFILE, ClusterConfig(num_gpus=2), rl)


def test_policy_strings_parse_knobs_and_histospec() -> None:
    """`NAME(knobs)+histospec(knobs)` parses, converts types and rejects unknown knobs."""
    spec = parse_policy("rollpacker(eta_p=1.5)+histospec(acceptance_prob=0.8)")
    assert spec.knobs == {"eta_p": 1.5} and spec.histospec.acceptance_prob == 0.8
    assert make_policy("sortedrl(mode=partial)").config.mode == "partial"
    for bad, msg in [
        ("rollpacker(nope=1)", "has no knob 'nope'"),
        ("rollpacker(eta_p=x)", "not a valid float"),
        ("sync+turbo", "unknown feature"),
        ("sortedrl(mode=sideways)", "mode must be one of"),
        ("sync(x=1)", "takes no knobs"),
    ]:
        with pytest.raises(RlsimError, match=msg.replace("(", r"\(")):
            parse_policy(bad) if "mode=" not in bad else make_policy(bad)


def test_seer_on_the_fake_engine_trains_every_sample_whole_each_step() -> None:
    """Seer is synchronous: each step trains P0 x R0 samples at their trace lengths, the long
    ones assembled from chunks (each continuation carries the tokens so far)."""
    rng = np.random.default_rng(8)
    tr = make_trace(rng.integers(10, 3000, (1, 16, 4)))
    req, steps, _ = run("seer(chunk_tokens=500)", tr, 4, 4)
    assert (steps.num_samples == 16).all() and (steps["staleness/max"] == 0).all()
    trained = req[req.trained_step >= 0]
    truth = tr.table.set_index(["prompt_id", "sample_idx"]).num_output_tokens
    keys = list(zip(trained.prompt_id, trained.sample_idx, strict=True))
    assert (trained.num_output_tokens.to_numpy() == truth.loc[keys].to_numpy()).all()
    cont = req[req.kept_tokens > 0]
    assert len(cont) > 0 and (cont.kept_tokens % 500 == 0).all()
    assert steps.wasted_tokens.sum() == 0


def _seer(policy: str, kv: int):  # noqa: ANN202
    from rlsim.sim.simulate import simulate

    lengths = np.repeat((np.arange(1, 13) * 250)[None, :, None], 6, axis=2)  # prompt i: 250 (i + 1) tokens
    tr = make_trace(lengths, max_len=4096)
    prof = dataclasses.replace(PROFILE, kv_capacity_tokens=kv)
    rl = RLConfig(prompts_per_step=12, samples_per_prompt=6, epochs=1, max_response_len=4096)
    res = simulate(tr, policy, ClusterConfig(num_gpus=2, profile=PROFILE.name), rl, prof)
    return res, res.requests.sort_values(["launch_time", "request_id"])


def test_seer_probes_each_group_first_then_runs_the_longest_groups_first() -> None:
    """Context-aware scheduling: one probe per group first; once the probes have finished, the
    remaining siblings go longest group first (the probe's length estimates its siblings')."""
    res, req = _seer("seer", 6000)
    assert req.prompt_id.iloc[:12].nunique() == 12  # a probe of every group first
    probes_done = req[req.sample_idx == 0].finish_time.max()
    late = req[req.launch_time >= probes_done].drop_duplicates("prompt_id").prompt_id.tolist()
    assert len(late) > 2 and late == sorted(late, reverse=True)
    assert res.summary["staleness_max"] == 0 and res.summary["wasted_tokens"] == 0


def test_seer_divides_responses_into_chunks_that_move_between_instances() -> None:
    """Divided rollout: a response longer than a chunk ends at the chunk, goes back to the buffer
    with its tokens, and continues on the instance with the most free KV; it trains whole."""
    res, req = _seer("seer(chunk_tokens=1000)", 6000)
    cont = req[req.kept_tokens > 0]
    assert len(cont) > 0 and (req.outcome == "continued").sum() == len(cont)
    trained = req[req.trained_step >= 0]
    assert len(trained) == 72 and (trained.num_output_tokens == (trained.prompt_id + 1) * 250).all()
    assert (req.groupby(["prompt_id", "sample_idx"]).instance.nunique() > 1).any()
    assert res.summary["staleness_max"] == 0 and res.summary["wasted_tokens"] == 0


def test_policy_strings_split_and_gain_a_knob_through_the_registry() -> None:
    """The policy-string grammar is the registry's, public: the planner and the commands split and
    extend policy strings through it, never by their own string handling."""
    from policies.registry import split_policies, split_policy, with_knob

    assert split_policies("sync, fully_async(partial_rollout=false,staleness_threshold=0.5)+histospec,") == [
        "sync", "fully_async(partial_rollout=false,staleness_threshold=0.5)+histospec",
    ]  # fmt: skip
    assert split_policies("") == []
    with pytest.raises(RlsimError, match="names no policy"):
        split_policies(" , ")
    assert split_policy("rollpacker(a=1)+histospec(x=2)+dynamic_sampling") == (
        "rollpacker(a=1)", ["histospec(x=2)", "dynamic_sampling"],
    )  # fmt: skip
    assert with_knob("fully_async", "staleness_threshold", "0.5") == "fully_async(staleness_threshold=0.5)"
    assert (with_knob("fully_async(partial_rollout=false)+histospec", "staleness_threshold", "1")
            == "fully_async(partial_rollout=false,staleness_threshold=1)+histospec")  # fmt: skip
    parse_policy(with_knob("areal()", "max_head_offpolicyness", "2"))  # (a string the registry reads)
