"""Async scheduling (vLLM's `AsyncScheduler`, its default on GPU executors): where the engine
gets it from, what it changes in a batch, and when a driver's submit or abort lands.

Identity with vLLM's own `AsyncScheduler`, iteration by iteration, is in
`tests/test_scheduler_parity.py` (the grid's `+async` configurations)."""

from __future__ import annotations

import dataclasses

import pytest

from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.profile import load_profile, profile_from_dict
from rlsim.protocol import Finished, Request
from rlsim.sim.compiled.sim_engine import CompiledEngine
from rlsim.sim.engine import SimEngine
from rlsim.sim.simulate import simulate
from rlsim.step_costs import with_engine
from rlsim.trace.synth import SynthConfig, synthesize

STEP = 0.01  # seconds per iteration, whatever the batch


def _profile(async_scheduling: bool = False, **engine):
    base = load_profile("h100-qwen2.5-7b-tp1")
    base = dataclasses.replace(base, t_w_s=STEP, alpha_s=0.0, beta_s=0.0, gamma_s=0.0, prefill_s_per_token=0.0)
    return with_engine(base, EngineConfig(async_scheduling=async_scheduling, **engine))


def _req(rid: int, length: int, max_tokens: int = 10**6) -> Request:
    return Request(rid, rid, 0, 0, 100, max_tokens, length, 0, 0)


def _finishes(engine: SimEngine) -> dict[int, float]:
    out = {}
    while events := engine.step():
        out.update({e.request_id: e.time for e in events if isinstance(e, Finished)})
    return out


def test_the_default_follows_the_profiles_platform() -> None:
    """On for a GPU profile (vLLM turns it on for GPU executors), off for a CPU-calibrated one,
    and an engine setting overrides either; the shipped profiles record it."""
    gpu = load_profile("h100-qwen2.5-7b-tp1")
    assert gpu.engine.async_scheduling is True
    unset = gpu.to_dict() | {"async_scheduling": None}
    assert profile_from_dict(unset).engine.async_scheduling is True
    cpu = profile_from_dict(unset | {"hardware": "CPU (2 cores)"})
    assert cpu.engine.async_scheduling is False
    assert with_engine(gpu, EngineConfig(async_scheduling=False)).engine.async_scheduling is False
    assert with_engine(cpu, EngineConfig(async_scheduling=True)).engine.async_scheduling is True
    assert with_engine(cpu, EngineConfig()).engine.async_scheduling is False  # unset: the profile's


@pytest.mark.parametrize("exact", [False, True])
def test_a_request_stopping_on_eos_decodes_one_token_more_and_holds_its_slot(exact: bool) -> None:
    """max_num_seqs 1: the second request waits for the first's slot. Without async it is
    admitted in the iteration after the first one's last token; with async the first is
    scheduled once more (an end-of-sequence stop the scheduler could not foresee), so the second
    starts one iteration later. A request stopped by max_tokens is skipped, not scheduled, but
    its slot is held as long."""
    times = {}
    for async_ in (False, True):
        for max_tokens in (10**6, 30):
            eng = SimEngine(_profile(async_, max_num_seqs=1), 1, exact=exact)
            eng.submit([_req(0, 30, max_tokens), _req(1, 20)])
            times[async_, max_tokens] = _finishes(eng)
    for max_tokens in (10**6, 30):
        sync, asy = times[False, max_tokens], times[True, max_tokens]
        assert sync[0] == pytest.approx(30 * STEP) and asy[0] == pytest.approx(30 * STEP)  # reported as before
        assert asy[1] - sync[1] == pytest.approx(STEP if max_tokens > 30 else 0.0)
    # skipped, not scheduled: with nothing else to run, the held slot costs no iteration
    assert times[True, 30][1] == pytest.approx(50 * STEP)


@pytest.mark.parametrize("async_", [False, True])
def test_a_submit_to_a_busy_instance_lands_one_schedule_later_with_async(async_: bool) -> None:
    """A request submitted while an iteration runs is prefilled in the next iteration without
    async scheduling, and one iteration later with it (the engine core already scheduled the
    batch after the running one)."""
    eng = SimEngine(_profile(async_), 1)
    eng.submit([_req(0, 100)])
    eng.call_at(10.5 * STEP, "mid-iteration")
    while not any(getattr(e, "tag", None) == "mid-iteration" for e in eng.step()):
        pass
    eng.submit([_req(1, 5)])
    done = _finishes(eng)
    landed = 11 + async_  # the iteration whose schedule first sees request 1
    assert done[1] == pytest.approx((landed + 5) * STEP)


def test_a_call_to_a_busy_instance_lands_one_schedule_later_on_both_engines() -> None:
    """A call's samples taken as one request (SGLang's parallel sampling: `add_call`), submitted
    while an iteration runs, wait one schedule longer where inputs land late, on SimEngine and on the
    compiled core alike (its deferred call, `A_CALL`), every finish at the same time (inputs land late
    under SGLang's overlap loop, as a GPU profile has it, and at once on a CPU-calibrated one). The call is
    held as one (SimEngine's queue of late inputs holds it whole), and grouping it matters: sent as
    three requests, the same samples finish at other times."""

    def finishes(engine: type, late: bool, grouped: bool = True) -> dict[int, float]:
        prof = with_engine(_profile(late), EngineConfig(rollout_engine="sglang", parallel_sampling=grouped))
        assert prof.engine.async_scheduling is late  # (SGLang's overlap loop: a GPU profile's, not a CPU one's)
        eng = engine(prof, 1)
        eng.submit([_req(0, 100)])
        eng.call_at(10.5 * STEP, "mid-iteration")
        while not any(getattr(e, "tag", None) == "mid-iteration" for e in eng.step()):
            pass
        eng.submit([Request(rid, 1, 0, 0, 100, 10**6, length, 0, 0) for rid, length in ((1, 5), (2, 7), (3, 3))])
        if engine is SimEngine and grouped:  # (the call, held whole until the schedule after next, or taken now)
            assert [(kind, len(item)) for kind, item in eng.instances[0].incoming] == ([("call", 3)] if late else [])
        return _finishes(eng)

    for late in (False, True):
        ref = finishes(SimEngine, late)
        assert finishes(CompiledEngine, late) == ref
    now, later = finishes(SimEngine, False), finishes(SimEngine, True)
    assert all(later[rid] == pytest.approx(now[rid] + STEP) for rid in (1, 2, 3)), (now, later)
    assert finishes(SimEngine, True, grouped=False) != later


def test_async_changes_little_and_keeps_every_token() -> None:
    """On a small synthetic workload every request keeps its length and the run's time moves
    by well under 1% (the extra iteration a finished request holds its slot)."""
    tr = synthesize(SynthConfig(num_prompts=32, samples_per_prompt=4, epochs=1, seed=3))
    args = (tr, "sync", ClusterConfig(num_gpus=2, profile="h100-qwen2.5-7b-tp1"), RLConfig(prompts_per_step=16, samples_per_prompt=4, epochs=1))  # noqa: E501
    on, off = (simulate(*args, engine_cfg=EngineConfig(async_scheduling=a)) for a in (True, False))
    assert on.config["async_scheduling"] and not off.config["async_scheduling"]
    assert (on.requests["num_output_tokens"] == off.requests["num_output_tokens"]).all()
    assert on.summary["total_time_s"] != off.summary["total_time_s"]
    assert on.summary["total_time_s"] == pytest.approx(off.summary["total_time_s"], rel=0.01)
