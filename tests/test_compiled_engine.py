"""The compiled engine (`rlsim.sim.compiled`) gives the same run as `SimEngine`, event for event:
every default policy's per-request records, steps, summary and busy segments, on workloads that
preempt, abort, pause mid-jump, sleep, speculate, run turns, and under async scheduling,
iteration by iteration (`exact`) and in lockstep; under vLLM's rules and SGLang's; compiled and on
the pure-Python path."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from policies.registry import COMPARE_DEFAULT, parse_policy
from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.paths import default_trace
from rlsim.sim.compiled.jit import PURE
from rlsim.sim.simulate import simulate
from rlsim.trace.format import load
from tests.pure_path import run_pure

# KV-tight: 16 GPUs as 8 TP 2 instances at 0.45 of their memory, 64 prompts a step: the golden comparison's setup
CLUSTER = ClusterConfig(num_gpus=16, profile="h100-qwen2.5-32b-tp2")
TIGHT = EngineConfig(gpu_memory_utilization=0.45)


def _trace():  # noqa: ANN202 - the bundled trace's lengths (long tails: they preempt)
    return load(default_trace())


def _same(trace, policy: str, **kw: object) -> dict:  # noqa: ANN001
    """Both engines' runs, held equal; returns the summary."""
    rl = kw.pop("rl", RLConfig(prompts_per_step=64, epochs=1, max_steps=4))
    a = simulate(trace, policy, cluster=CLUSTER, rl=rl, engine="simpy", **kw)
    b = simulate(trace, policy, cluster=CLUSTER, rl=rl, engine="compiled", **kw)
    sa, sb = ({k: v for k, v in r.summary.items() if k != "sim_wall_s"} for r in (a, b))
    said = sa.pop("scheduler", None), sb.pop("scheduler", None)  # which implementation ran (each says its own)
    assert json.dumps(sa, sort_keys=True, default=str) == json.dumps(sb, sort_keys=True, default=str), policy
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    assert a.segments == b.segments
    sa["_aborted"] = int((a.requests["outcome"] == "aborted").sum())
    sa["scheduler"] = said[1]
    return sa


@pytest.mark.parametrize("policy", COMPARE_DEFAULT)
def test_every_policy_same_run(policy: str) -> None:
    s = _same(_trace(), policy, engine_cfg=TIGHT)
    assert s["preemptions"] > 0  # the workload preempts under every policy


def test_what_the_workloads_reach() -> None:
    """Aborts, pauses that interrupt a jump, sleeps that free the KV, speculation, with async
    scheduling on and off, iteration by iteration and in lockstep."""
    trace = _trace()
    seen = {"aborted": 0, "pause_interrupts": 0, "wake_reprefill_tokens": 0}
    for policy, kw in (
        ("rollpacker", {"engine_cfg": TIGHT}),
        ("async_partial", {"engine_cfg": TIGHT}),
        ("sortedrl", {"engine_cfg": EngineConfig(gpu_memory_utilization=0.45, async_scheduling=False)}),
        ("sync", {"engine_cfg": TIGHT, "exact": True}),
        ("rollpacker", {"engine_cfg": TIGHT, "lockstep": True}),
        ("histopipe+histospec", {"engine_cfg": EngineConfig(gpu_memory_utilization=0.45, enable_prefix_caching=False)}),
    ):
        s = _same(trace, policy, **kw)
        seen["aborted"] += s["_aborted"]
        seen["pause_interrupts"] += s["pause_interrupts"]
        seen["wake_reprefill_tokens"] += s["wake_reprefill_tokens"]
    assert all(v > 0 for v in seen.values()), seen


# SGLang's rules, with reservations low enough that decode steps retract (SGLang's rules rarely do otherwise), on
# the policies that do not speculate (speculative decoding is modelled under vLLM's rules only)
SGLANG_TIGHT = EngineConfig(gpu_memory_utilization=0.45, rollout_engine="sglang", schedule_conservativeness=0.01)
SGLANG_POLICIES = [p for p in COMPARE_DEFAULT if parse_policy(p).histospec is None]


@pytest.mark.parametrize("policy", SGLANG_POLICIES)
def test_every_policy_same_run_under_sglang(policy: str) -> None:
    """SGLang's rules on the compiled core (`rlsim.sim.compiled.sglang`) give SimEngine's run, record
    for record: retractions, the overlap loop, the radix cache and its flush at each weight update."""
    s = _same(_trace(), policy, engine_cfg=SGLANG_TIGHT)
    assert s["scheduler"] == "SGLang 0.5.23 rules (compiled core)"  # (the compiled run's own word)


def test_what_sglangs_workloads_reach() -> None:
    """Retractions, aborts, flushes that free what runs, pauses that interrupt a jump and prompts the
    pool cannot hold, under SGLang's rules; iteration by iteration too."""
    trace = _trace()
    seen = {"preemptions": 0, "_aborted": 0, "wake_reprefill_tokens": 0, "pause_interrupts": 0, "engine_aborts": 0}
    for policy, kw in (
        ("sync", {"engine_cfg": SGLANG_TIGHT, "exact": True}),
        ("async_partial", {"engine_cfg": dataclasses.replace(SGLANG_TIGHT, gpu_memory_utilization=0.5,
                                                              schedule_conservativeness=0.02)}),
        ("rollpacker", {"engine_cfg": SGLANG_TIGHT}),
        ("seer", {"engine_cfg": EngineConfig(gpu_memory_utilization=0.415, rollout_engine="sglang")}),
    ):
        s = _same(trace, policy, **kw)
        for k in seen:
            seen[k] += s.get(k, {}).get("prompt_too_long", 0) if k == "engine_aborts" else s[k]
    assert all(v > 0 for v in seen.values()), seen


@pytest.mark.parametrize("policy", ["sync", "rollpacker"])
def test_parallel_sampling_same_run(policy: str) -> None:
    """SGLang's parallel sampling (a call's samples as one request: a warm-up of the prompt, then the
    samples; `SGLangScheduler.add_call`) on the compiled core gives SimEngine's run; the runs differ
    from those without it, so the calls reached the rules as calls (rollpacker's aborts reach samples
    still held back)."""
    cluster = dataclasses.replace(CLUSTER, dispatch="per_prompt")
    grouped = dataclasses.replace(SGLANG_TIGHT, parallel_sampling=True)
    rl = RLConfig(prompts_per_step=64, epochs=1, max_steps=3)
    trace = _trace()
    a = simulate(trace, policy, cluster=cluster, rl=rl, engine="simpy", engine_cfg=grouped)
    b = simulate(trace, policy, cluster=cluster, rl=rl, engine="compiled", engine_cfg=grouped)
    for x, y in ((a.requests, b.requests), (a.steps, b.steps)):
        pd.testing.assert_frame_equal(x, y, check_exact=True)
    assert a.segments == b.segments
    plain = simulate(trace, policy, cluster=cluster, rl=rl, engine="compiled", engine_cfg=SGLANG_TIGHT)
    assert not plain.requests.equals(b.requests)
    assert b.summary["scheduler"] == "SGLang 0.5.23 rules (compiled core)"


def test_set_order_is_cpythons() -> None:
    from rlsim.sim.compiled.engine import _set_order

    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 9, 40, 300):
        vals = rng.integers(0, 10**7, n)
        assert _set_order(vals).tolist() == list(set(vals.tolist())), n  # a set built in this order


def test_real_mode_never_loads_numba() -> None:
    """numba's llvmlite, once imported, breaks vLLM's scan of every loaded module when a real run
    starts its engines in its own process, so real mode's modules import the compiled engine only
    when they simulate."""
    modules = "rlsim.cli.app, rlsim.real.run, rlsim.real.validate, rlsim.sim.simulate"
    code = f"import sys, {modules}; print('llvmlite' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(PURE, reason="already on the pure-Python path")
@pytest.mark.long  # (a minute and a half: nine runs in pure Python)
def test_the_pure_path_agrees() -> None:
    tests = [f"{__file__}::test_every_policy_same_run[{p}]" for p in ("sync", "rollpacker", "sortedrl")]
    tests += [f"{__file__}::test_every_policy_same_run_under_sglang[{p}]" for p in ("sync", "async_partial")]
    quiet_for = "tests/test_batched_protocol.py::test_a_policy_quiet_for_k_finishes_runs_as_it_would_told_every_instant"
    quiet_for = [f"{quiet_for}[{p}-compiled]" for p in ("sortedrl", "histopipe_cross_step", "rollpacker")]
    assert "9 passed" in run_pure(*tests, f"{__file__}::test_set_order_is_cpythons", *quiet_for)
