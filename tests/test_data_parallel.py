"""Data-parallel attention with expert parallelism: the derived rank and group costs, the profile
fields, and the simulator's lockstep groups (rlsim.derive.derive, rlsim.sim.engine)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.config import EngineConfig
from rlsim.derive.derive import ACTIVATION_BYTES, allreduce_s, derive_profile, dp_moe_s, iteration_s, setup
from rlsim.derive.operators import linear_fit
from rlsim.errors import RlsimError
from rlsim.model_facts import experts_hit, routed_params
from rlsim.profile import profile_from_dict
from rlsim.protocol import Finished, Request
from rlsim.roofline import check_roofline, grid
from rlsim.sim.engine import SimEngine
from rlsim.step_costs import with_engine

runner = CliRunner()


def _dp_profile(dp: int = 8, **engine):  # noqa: ANN003, ANN202
    s = setup("qwen3-30b-a3b", "h100", 1, ep=dp, dp=dp)
    raw = derive_profile(s, EngineConfig(gpu_memory_utilization=0.8))
    return with_engine(profile_from_dict(raw), EngineConfig(async_scheduling=False, **engine))


def test_the_group_pays_the_routed_experts_a_rank_pays_the_rest() -> None:
    """A DP rank's own iteration holds no routed expert; the group's term is, per MoE layer, the
    experts each GPU holds that the group's tokens hit (by the fitted roofline) and the
    all-gather plus reduce-scatter of those tokens, which is one ring all-reduce's bytes."""
    dp8, tp8 = setup("qwen3-30b-a3b", "h100", 1, ep=8, dp=8), setup("qwen3-30b-a3b", "h100", 8, ep=8)
    m, g, fit = dp8.model, dp8.gpu, linear_fit()
    n = 8 * 64.0
    hit = experts_hit(m.num_experts, m.experts_per_token, n)
    experts = fit.c0_s + fit.roofline_s(
        hit * m.expert_params * 2 / 8, n * 2 * m.experts_per_token * m.expert_params / 8, g.hbm_bytes_per_s,
        g.peak_flops("bf16"),
    )  # fmt: skip
    want = m.moe_layers * (experts + allreduce_s(g, 8, np.array(n * m.hidden_size * ACTIVATION_BYTES)))
    assert float(dp_moe_s(dp8, np.array([n]))[0]) == pytest.approx(float(want))
    # a rank reads its attention, router and shared experts whole: more than TP 8's share of them,
    # and none of the routed experts its TP-8 counterpart reads
    assert iteration_s(dp8, 64, 64 * 2048, 64) > 0
    prof = profile_from_dict(derive_profile(dp8, EngineConfig(gpu_memory_utilization=0.8)))
    assert (prof.name, prof.data_parallel_size, prof.instance_gpus) == ("h100-qwen3-30b-a3b-tp1-dp8-ep8", 8, 1)
    assert prof.dp_group_s(64) == pytest.approx(float(dp_moe_s(dp8, np.array([512.0]))[0]), rel=1e-5)
    # the group's term grows with the busiest rank's tokens, and continues past its last knot
    assert prof.dp_group_s(1) < prof.dp_group_s(64) < prof.dp_group_s(8192) < prof.dp_group_s(16384)
    # per GPU, DP attention decodes more than one TP-8 instance at the same batch per GPU
    tp = profile_from_dict(derive_profile(tp8, EngineConfig(gpu_memory_utilization=0.8)))
    assert prof.decode_throughput(64, 2048) > tp.decode_throughput(8 * 64, 2048) / 8


def test_a_rank_holds_its_own_weights_and_its_share_of_the_experts() -> None:
    """KV capacity: a GPU holds the rank's dense and attention weights over TP and the routed
    experts over DP x TP; the memory roofline of a lockstep iteration is met."""
    p = _dp_profile()
    mf = p.model_facts
    routed = routed_params(mf) * 2
    per_gpu = (mf["num_params"] * 2 - routed) + routed / 8
    assert p.kv_capacity_tokens == int((0.8 * 80e9 - per_gpu) / mf["kv_bytes_per_token"])
    check_roofline(p, p.name)
    assert max(c.roofline_fraction for c in grid(p)) < 1.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "qwen3-8b", "--dp", "2", "--ep", "2"], "dense model"),
        (["--model", "qwen3-30b-a3b", "--dp", "8", "--ep", "4"], "use --ep 8"),
        (["--model", "qwen3-30b-a3b", "--dp", "2", "--ep", "2", "--pp", "2"], "pipeline stages is not modelled"),
    ],
)
def test_a_dp_layout_rlsim_cannot_model_is_one_sentence(args: list[str], message: str) -> None:
    r = runner.invoke(app, ["profile", "derive", "--gpu", "h100", *args])
    assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.output, r.output


def test_a_dp_profile_round_trips_and_states_both_fields(tmp_path: Path) -> None:
    p = _dp_profile()
    raw = p.to_dict()
    assert raw["data_parallel_size"] == 8 and raw["dp_moe_s"]
    back = profile_from_dict(json.loads(json.dumps(raw)))
    assert (back.data_parallel_size, back.dp_moe_s) == (8, p.dp_moe_s)
    del raw["dp_moe_s"]
    with pytest.raises(RlsimError, match="go together"):
        profile_from_dict(raw)


def _req(rid: int, length: int, instance: int) -> Request:
    return Request(rid, rid, 0, 0, 100, 10**6, length, instance, 0)


def _run(engine: SimEngine, requests: list[Request]) -> dict[int, float]:
    engine.submit(requests)
    done = {}
    while events := engine.step():
        done |= {e.request_id: e.time for e in events if isinstance(e, Finished)}
    return done


@pytest.mark.parametrize("eager", [False, True])
def test_ranks_step_in_lockstep_at_the_slowest_rank_plus_the_experts(eager: bool) -> None:
    """Two ranks of one group: rank 0 decodes one sequence, rank 1 thirty-two. Rank 0's request
    runs at the group's pace (rank 1's own iteration plus the experts at the group's tokens), not
    at the pace it would alone; once rank 1 is done, rank 0 steps alone, with rank 1 idle in the
    group's iterations (counted). With CUDA graphs the experts see 2 x the busiest rank's tokens
    (vLLM's DP padding); under enforce_eager the ranks' own, an idle rank's dummy one token."""
    p = dataclasses.replace(_dp_profile(2, enforce_eager=eager), prefill_s_per_token=0.0, prefill_request_s=0.0)
    long, short = 40, 10
    eng = SimEngine(p, 2)
    done = _run(eng, [_req(0, long, 0)] + [_req(1 + i, short, 1) for i in range(32)])
    assert len(done) == 33
    want = 0.0
    for it in range(long):  # rank 0's context at iteration `it` is 100 + it; the knee on decode tokens alone
        n0 = 1 if it else 100
        own0 = p.iteration_s(1, 100 + it, 1 if it else 0, 0 if it else 100, 0 if it else 1)
        own0 += p.compute_excess_s(1 if it else 0)
        if it < short:  # rank 1 still runs its 32
            n1 = 32 if it else 32 * 100
            own1 = p.iteration_s(32, 32 * (100 + it), 32 if it else 0, 0 if it else 3200, 0 if it else 32)
            own1 += p.compute_excess_s(32 if it else 0)
            want += max(own0, own1) + p.dp_group_s(max(n0, n1), n0 + n1)
        else:
            want += own0 + p.dp_group_s(n0, n0 + 1)
    assert done[0] == pytest.approx(want, rel=1e-9)
    assert eng.dp_counts == {"group_iterations": long, "idle_rank_iterations": long - short}
    alone = SimEngine(dataclasses.replace(p, data_parallel_size=1, dp_moe_s=()), 1)
    assert _run(alone, [_req(0, long, 0)])[0] < done[0]  # without its group it runs faster
    # the experts' tokens: 33 (the ranks' own) under enforce_eager, else 2 x 32 (padded)
    assert p.dp_group_s(32, 33) == pytest.approx(p.dp_group_s(33 / 2) if eager else p.dp_group_s(32))


def test_a_rank_that_gets_work_mid_iteration_joins_the_next() -> None:
    """A request submitted to an idle rank while its group is mid-iteration waits for that
    iteration's end, as vLLM's DP ranks agree on each step before running it."""
    p = dataclasses.replace(_dp_profile(2), prefill_s_per_token=0.0, prefill_request_s=0.0)
    eng = SimEngine(p, 2)
    eng.submit([_req(0, 50, 0)])
    first = p.iteration_s(1, 100, 0, 100, 1) + p.dp_group_s(100)
    eng.call_at(first / 2, "mid")
    while not any(getattr(e, "tag", None) == "mid" for e in eng.step()):
        pass
    eng.submit([_req(1, 5, 1)])
    done = {}
    while events := eng.step():
        done |= {e.request_id: e.time for e in events if isinstance(e, Finished)}
    assert set(done) == {0, 1}
    assert eng.dp_counts["idle_rank_iterations"] >= 1  # rank 1 idled through the first iteration
    # rank 1's five iterations all started at or after the first group iteration's end
    assert done[1] > first + 4 * (p.t_w_s + p.dp_group_s(1))


def test_simulate_runs_dp_groups_and_refuses_a_part_group(small_trace_path: Path, tmp_path: Path) -> None:
    """End to end: a DP-8 profile on 16 rollout GPUs is two groups (the summary counts their
    lockstep); 12 GPUs are not a whole number of groups, one sentence."""
    prof = tmp_path / "dp8.json"
    r = runner.invoke(app, ["profile", "derive", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--dp", "8", "--ep",
                            "8", "--gpu-memory-utilization", "0.8", "--out", str(prof)])  # fmt: skip
    assert r.exit_code == 0, r.output
    args = ["simulate", "--trace", str(small_trace_path), "--profile", str(prof), "--max-steps", "1"]
    r = runner.invoke(app, [*args, "--gpus", "12", "--out", str(tmp_path / "a")])
    assert r.exit_code == 2 and "whole number of data-parallel groups" in r.stderr, r.output
    r = runner.invoke(app, [*args, "--gpus", "16", "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    dp = json.loads((tmp_path / "b" / "summary.json").read_text())["data_parallel"]
    assert dp["size"] == 8 and dp["group_iterations"] > 0 and dp["idle_rank_iterations"] > 0
