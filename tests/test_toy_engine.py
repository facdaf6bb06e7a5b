"""A third rollout engine, registered from one module (`tests/toy_engine.py`), runs through every
layer a simulating user reaches: `simulate` (step by step and jumping, with the same records),
`rlsim compare` and `rlsim simulate` with `--rollout-engine static`, and a real run refused in one
sentence; nothing in rlsim names it. It runs on both engine paths, SimEngine and the compiled core,
with the same records: its module adds its compiled rules to the core's seam."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.errors import RlsimError
from rlsim.rollout_engines import REGISTRY, register, rollout_engine, unregister
from rlsim.sim.simulate import simulate

from .conftest import REPO
from .test_engine_seam import name_comparisons
from .test_fast_vs_exact import assert_tables_match
from .toy_engine import TOY

runner = CliRunner()


@pytest.fixture
def toy() -> Iterator[str]:
    register(TOY)
    try:
        yield TOY.name
    finally:
        unregister(TOY.name)


def _run(trace, engine: str, exact: bool = False, impl: str = "simpy", policy: str = "sync"):  # noqa: ANN001, ANN202
    cluster, rl = ClusterConfig(num_gpus=2), RLConfig(prompts_per_step=8, samples_per_prompt=4, max_response_len=2000)
    return simulate(trace, policy, cluster, rl, profile="h100-qwen2.5-7b-tp1", exact=exact,
                    engine_cfg=EngineConfig(rollout_engine=engine), engine=impl)  # fmt: skip


def test_a_registered_engine_simulates_on_simengine_jumping_as_step_by_step(toy: str, small_trace) -> None:  # noqa: ANN001
    fast, exact = _run(small_trace, toy), _run(small_trace, toy, exact=True)
    assert fast.summary["scheduler"] == "Static batching 1 rules (SimEngine)"
    assert fast.summary["num_steps"] == 10 and (fast.requests.outcome == "finished").all()
    assert_tables_match(fast.requests, exact.requests, "requests")  # (times to 1e-9: sums in another order)
    assert_tables_match(fast.steps, exact.steps, "steps")
    # its own rules, not vLLM's: no request is ever preempted, and a batch waits for its last request
    vllm = _run(small_trace, "vllm")
    assert fast.summary["preemptions"] == 0
    assert fast.steps["timing_s/gen"].sum() > vllm.steps["timing_s/gen"].sum()


@pytest.mark.parametrize("policy", ["sync", "rollpacker"])
def test_a_registered_engine_runs_on_the_compiled_core_as_on_simengine(toy: str, small_trace, policy: str) -> None:  # noqa: ANN001
    """The same run, record for record, where the compiled core drives the toy's compiled rules (the
    engine compiled once more, for their state's type: a minute or two the first time)."""
    ref, got = _run(small_trace, toy, policy=policy), _run(small_trace, toy, impl="compiled", policy=policy)
    assert (ref.summary.pop("scheduler"), got.summary.pop("scheduler")) == (
        "Static batching 1 rules (SimEngine)", "Static batching 1 rules (compiled core)")
    del ref.summary["sim_wall_s"], got.summary["sim_wall_s"]
    assert json.dumps(ref.summary, sort_keys=True, default=str) == json.dumps(got.summary, sort_keys=True, default=str)
    pd.testing.assert_frame_equal(ref.requests, got.requests, check_exact=True)
    pd.testing.assert_frame_equal(ref.steps, got.steps, check_exact=True)
    assert ref.segments == got.segments
    if policy == "rollpacker":  # (its aborts reach the compiled rules' abort)
        assert (got.requests.outcome == "aborted").any()


def test_the_commands_take_it_by_name(toy: str, tmp_path: Path, small_trace_path: Path) -> None:
    args = ["--trace", str(small_trace_path), "--rollout-engine", toy, "--max-steps", "2"]
    res = runner.invoke(app, ["compare", *args, "--policies", "sync,rollpacker", "--json"])
    assert res.exit_code == 0, res.output
    assert [r["policy"] for r in json.loads(res.stdout)] == ["sync", "rollpacker"]
    res = runner.invoke(app, ["compare", *args, "--policies", "sync+histospec"])
    assert res.exit_code == 2 and "every policy asked for speculates" in res.output  # (it does not speculate)
    res = runner.invoke(app, ["simulate", *args, "-o", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["scheduler"].startswith("Static batching")


def test_a_real_run_is_refused_in_one_sentence(toy: str) -> None:
    with pytest.raises(RlsimError, match="is simulated only: rlsim drives no real Static batching engine"):
        rollout_engine(toy).real("real_instance")


def test_registering_is_checked(toy: str) -> None:
    with pytest.raises(RlsimError, match="registered already"):
        register(TOY)
    bad_ones = [({"name": "x", "compiled": "tests.toy_engine:states"}, "compiled core's states .* cannot be imported"),
                ({"name": "y", "default": True}, "default")]  # fmt: skip
    for bad, said in bad_ones:
        with pytest.raises(RlsimError, match=said):
            register(dataclasses.replace(TOY, **bad))
    with pytest.raises(RlsimError, match="built in"):
        unregister("vllm")
    assert set(REGISTRY) == {"vllm", "sglang", toy}


def test_nothing_in_rlsim_names_it(toy: str) -> None:
    """The seam test's finder, with the toy registered: no comparison with its name in the code."""
    hits = [(p, hit) for p in sorted((REPO / "rlsim").rglob("*.py")) for hit in name_comparisons(p.read_text())
            if hit[1] == toy]  # fmt: skip
    assert not hits
