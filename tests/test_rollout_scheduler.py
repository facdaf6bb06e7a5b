"""The seam between the simulated engine and an engine's scheduling rules
(`rlsim.sim.rollout_scheduler`): `make_scheduler` gives vLLM's rules on the compiled core's source
(`VLLMRules`), as its `Scheduler` or, where the engine schedules asynchronously, its `AsyncScheduler`,
with every member the engine asks of a scheduler, and `SimEngine` builds its instances through it.
That both schedule as vLLM does is `tests/test_scheduler_parity.py`'s."""

from __future__ import annotations

from typing import get_type_hints

import pytest

from rlsim.config import EngineConfig
from rlsim.profile import load_profile
from rlsim.sim.engine import SimEngine
from rlsim.sim.rollout_scheduler import RolloutScheduler, make_scheduler
from rlsim.sim.vllm_rules import VLLMRules
from rlsim.step_costs import with_engine

ENGINE = EngineConfig(max_num_seqs=8, max_num_batched_tokens=256, block_size=16, enable_chunked_prefill=False,
                      enable_prefix_caching=False)  # fmt: skip


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_make_scheduler_gives_vllms_scheduler_for_the_engine(async_scheduling: bool) -> None:
    from dataclasses import replace

    sched = make_scheduler(replace(ENGINE, async_scheduling=async_scheduling), 1600)
    assert type(sched) is VLLMRules
    s = sched.s
    assert bool(s.async_sched) is async_scheduling
    assert (s.num_blocks, s.block_size, s.max_num_seqs, s.max_num_batched_tokens) == (100, 16, 8, 256)
    assert not s.chunked and not s.caching
    # every member the engine asks of a scheduler: methods and read-only properties, no data fields
    assert get_type_hints(RolloutScheduler) == {}
    members = {n for n, v in vars(RolloutScheduler).items() if not n.startswith("_") and (callable(v) or
               isinstance(v, property))}  # fmt: skip
    assert {"schedule", "complete", "jump_plan", "advance", "has_work", "num_decoding", "kv_capacity_tokens"} <= members
    sglang = make_scheduler(EngineConfig(rollout_engine="sglang", max_num_seqs=8, max_num_batched_tokens=256), 1600)
    for rules in (sched, sglang):
        missing = [n for n in sorted(members) if not hasattr(rules, n)]
        assert missing == [], type(rules)
    assert (sched.kv_capacity_tokens, sglang.kv_capacity_tokens) == (1600, 1600)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_engine_builds_its_instances_through_the_seam(async_scheduling: bool) -> None:
    profile = with_engine(load_profile("h100-qwen2.5-7b-tp1"), EngineConfig(async_scheduling=async_scheduling))
    engine = SimEngine(profile, num_instances=3)
    assert {type(inst.sched) for inst in engine.instances} == {VLLMRules}
    assert {bool(inst.sched.s.async_sched) for inst in engine.instances} == {async_scheduling}


def test_a_profile_records_the_engine_its_costs_were_measured_on(tmp_path) -> None:  # noqa: ANN001
    import json

    from rlsim.errors import RlsimError
    from rlsim.profile import profile_from_dict

    slime = load_profile("h200-llama-8b")  # slime's fit of real SGLang decode logs
    assert slime.rollout_engine == "sglang" and load_profile("h100-qwen2.5-7b-tp1").rollout_engine == "vllm"
    assert profile_from_dict(slime.to_dict()) == slime
    assert "rollout_engine" not in load_profile("h100-qwen2.5-7b-tp1").to_dict()  # vLLM's: written as before
    with pytest.raises(RlsimError, match="field 'rollout_engine' must be one of vllm, sglang, got 'trt'"):
        profile_from_dict(slime.to_dict() | {"rollout_engine": "trt"})
    path = tmp_path / "p.json"
    path.write_text(json.dumps(slime.to_dict() | {"rollout_engine": "vllm"}))
    assert load_profile(path).rollout_engine == "vllm"


def test_a_run_on_a_profile_measured_on_another_engine_says_so(small_trace_path, tmp_path) -> None:  # noqa: ANN001
    from typer.testing import CliRunner

    from rlsim.cli.app import app

    args = ["--trace", str(small_trace_path), "--gpus", "2", "--max-steps", "1"]
    note = "its costs were measured on SGLang; this run schedules with vLLM's rules"
    r = CliRunner().invoke(app, ["simulate", *args, "--profile", "h200-llama-8b", "-o", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert note in " ".join(r.stderr.split())
    r = CliRunner().invoke(app, ["simulate", *args, "--profile", "h100-qwen2.5-7b-tp1", "-o", str(tmp_path / "b")])
    assert r.exit_code == 0 and "measured on" not in r.stderr
    r = CliRunner().invoke(app, ["profile", "show", "h200-llama-8b"])
    assert r.exit_code == 0 and "measured on SGLang" in r.output


@pytest.mark.parametrize("rollout_engine", ["vllm", "sglang"])
def test_the_rules_keep_one_request_per_slot(rollout_engine: str) -> None:
    """`SimEngine` hands each engine's compiled rules (`VLLMRules`, `SGLangRules`) its requests one
    `Seq` each, kept beside the rules' slot for it: once slots are reused, the map of request ids to
    slots stays one entry per slot, in waves of requests over a whole run."""
    from rlsim.protocol import Request

    profile = with_engine(load_profile("h100-qwen2.5-7b-tp1"), EngineConfig(rollout_engine=rollout_engine,
                                                                            max_num_seqs=8))  # fmt: skip
    engine = SimEngine(profile, num_instances=1)
    rid = 0
    for _ in range(5):
        engine.submit([Request(rid + j, rid + j, 0, 0, 50, 100, 20 + j, 0, 0) for j in range(16)])
        rid += 16
        while engine.step():
            pass
    rules = engine.instances[0].sched
    slots = rules.s.t.shape[1]
    assert rid > 2 * slots and len(rules._slot) <= slots and len(rules._seqs) <= slots, (len(rules._slot), slots)
