"""`rlsim plan`'s search: the space and its bad inputs, successive halving, the cache a second
question reuses, the Pareto front, ties between finalists, and the command with its plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.config import EngineConfig, RLConfig
from rlsim.errors import RlsimError
from rlsim.plan.cache import PlanCache
from rlsim.plan.planner import PlanConfig, epoch_estimate_s, pareto, plan, rungs
from rlsim.plan.report import answer_rows
from rlsim.plan.space import SearchSpace, candidates, tp_family
from tests.test_sweep_plan import _err  # one sentence, exit code 2

runner = CliRunner()


def test_tp_family_is_the_same_model_on_the_same_gpu() -> None:
    assert tp_family("h100-qwen2.5-32b-tp4") == {
        2: "h100-qwen2.5-32b-tp2", 4: "h100-qwen2.5-32b-tp4", 8: "h100-qwen2.5-32b-tp8",
    }  # fmt: skip
    # Qwen2.5-7B's 28 heads do not divide over 8 ranks, which vLLM refuses: no TP 8 member
    assert tp_family("h100-qwen2.5-7b-tp1") == {t: f"h100-qwen2.5-7b-tp{t}" for t in (1, 2, 4)}
    assert tp_family("h800-qwen2.5-32b-tp4") == {4: "h800-qwen2.5-32b-tp4"}  # no H800 family shipped


def test_candidates_cover_the_space_and_round_splits_to_whole_instances() -> None:
    space = SearchSpace(("sync", "one_step_off"), (16, 32), ("colocated", "disaggregated"), (0.25, 0.5), (2, 4),
                        (256, 1024), (None,), (8192, 20480))  # fmt: skip
    cands = candidates(space, "h100-qwen2.5-32b-tp4")
    # 2 GPU counts x 2 TPs x (colocated + 2 splits) x 2 max_num_seqs x 2 caps x 2 policies
    assert len(cands) == 2 * 2 * 3 * 2 * 2 * 2 == len({c.key() for c in cands})
    for c in cands:
        assert c.rollout_gpus % c.tp == 0 and c.profile.endswith(f"tp{c.tp}")
        assert (c.train_gpus == 0) == (c.placement == "colocated")
    # 32 GPUs, a quarter for training, TP 4: 24 rollout GPUs are 6 instances, training gets 8
    assert {(c.num_gpus, c.tp, c.train_gpus) for c in cands if c.placement == "disaggregated"} >= {(32, 4, 8)}
    assert {c.num_gpus for c in candidates(space, "h100-qwen2.5-32b-tp4", gpu_budget=16)} == {16}


@pytest.mark.parametrize(
    ("kwargs", "budget", "words"),
    [
        ({"policies": ()}, None, "the search space is empty: no policies"),
        ({"gpus": (16, 32)}, 8, "every GPU count in --gpus is above --gpu-budget 8"),
        ({"placements": ("disaggregated",), "train_shares": (0.01,)}, None, "leaves no training GPU"),
        ({"placements": ("disaggregated",), "train_shares": (0.9,)}, None, "less than one TP 4 instance"),
        ({"gpus": (12,), "tps": (8,)}, None, "--tp 8 does not divide 12 GPUs"),
        ({"tps": (16,)}, None, "no profile of h100-qwen2.5-32b-tp4 at TP 16"),
        ({}, 2, "--gpu-budget 2 is below one rollout instance (TP 4: 4 GPUs)"),
        ({"train_shares": (1.5,)}, None, "--train-share must be a fraction"),
        ({"placements": ("sideways",)}, None, "--placement must be among"),
    ],
)
def test_bad_search_spaces_are_one_sentence(kwargs: dict, budget: int | None, words: str) -> None:
    base = {"policies": ("sync",), "gpus": (16,)}
    with pytest.raises(RlsimError, match=words.replace("(", r"\(").replace(")", r"\)")):
        candidates(SearchSpace(**{**base, **kwargs}), "h100-qwen2.5-32b-tp4", budget)


def test_rungs_and_the_epoch_estimate() -> None:
    assert rungs(PlanConfig(gpu_budget=64), 35) == [2, 6]
    assert rungs(PlanConfig(gpu_budget=64, steps=18, min_steps=2, eta=3), 35) == [2, 6, 18]
    assert rungs(PlanConfig(gpu_budget=64, steps=0), 35) == [2, 6, 18, 35]
    assert rungs(PlanConfig(gpu_budget=64, steps=6), 4) == [2, 4]
    # first and last steps stand for themselves, the middle ones for the rest of the epoch
    assert epoch_estimate_s([10, 4, 6, 3], 35) == 10 + 33 * 5 + 3
    assert epoch_estimate_s([10, 4], 35) == 10 + 34 * 4
    assert epoch_estimate_s([7], 35) == 7 * 35
    with pytest.raises(RlsimError, match="give an objective"):
        PlanConfig()


def test_pareto_front_keeps_only_undominated_points() -> None:
    rows = [{"epoch_hours": e, "gpu_hours": g} for e, g in [(1, 100), (2, 60), (2, 80), (3, 70), (4, 50), (5, 50)]]
    rows.append({"epoch_hours": 0.5, "gpu_hours": 10, "error": "needs more KV"})
    assert [(r["epoch_hours"], r["gpu_hours"]) for r in pareto(rows)] == [(1, 100), (2, 60), (4, 50)]


def test_search_halves_reuses_its_cache_and_marks_ties(tmp_path: Path, small_trace_path: Path) -> None:
    """A small space on the small trace: the halving simulates every candidate at 1 step and the
    best third per policy at 3, and the Pareto front's early points at 3 too; a second, wider
    question reuses every point of the first."""
    rl = RLConfig(prompts_per_step=16, samples_per_prompt=4, epochs=1)
    space = SearchSpace(("sync", "one_step_off"), (4, 8, 16), ("colocated", "disaggregated"), (0.5,), (1, 2),
                        max_response_len=(4096,))  # fmt: skip
    cfg = PlanConfig(gpu_budget=16, steps=3, min_steps=1, eta=3, seeds=3)
    cache = PlanCache(tmp_path / "cache.jsonl")
    done = []
    res = plan(small_trace_path, space, "h100-qwen2.5-7b-tp1", rl, cfg, cache=cache, on_done=done.append)
    n = res["num_candidates"]
    assert n == 3 * 2 * 2 * 2 == 24 and res["rungs"] == [1, 3]
    # 12 per policy at 1 step, 4 per policy at 3, the front's early points at 3, then the 2
    # finalists under 2 more seeds
    assert res["simulated"] == len(done) == 24 + 8 + res["promoted"] + 4 and res["cache_hits"] == 0
    assert all(r["steps_simulated"] == 3 for r in res["pareto"])
    first = res["simulated"]
    assert {a["policy"] for a in res["answers"]} == {"sync", "one_step_off"}
    for a in res["answers"]:
        assert len(a["epoch_hours_by_seed"]) == 3 and a["epoch_hours_range"][0] <= a["epoch_hours"]
        assert a["epoch_hours"] <= a["epoch_hours_range"][1] and a["num_gpus"] <= 16
    assert res["best"] is res["answers"][0]
    assert res["pareto"] and all(not r.get("error") for r in res["pareto"])
    lines = (tmp_path / "cache.jsonl").read_text().splitlines()
    assert len(lines) == first
    # the same question again: all from the cache, the same answer
    again = plan(small_trace_path, space, "h100-qwen2.5-7b-tp1", rl, cfg, cache=PlanCache(tmp_path / "cache.jsonl"))
    assert again["simulated"] == 0 and again["cache_hits"] == first
    assert [a["epoch_hours"] for a in again["answers"]] == [a["epoch_hours"] for a in res["answers"]]
    # a wider question (one more policy) simulates only the new policy's points
    wider = SearchSpace(("sync", "one_step_off", "rollpacker"), *[getattr(space, f) for f in (
        "gpus", "placements", "train_shares", "tps", "max_num_seqs", "gpu_memory_utilization", "max_response_len")])
    third = plan(small_trace_path, wider, "h100-qwen2.5-7b-tp1", rl, cfg, cache=PlanCache(tmp_path / "cache.jsonl"))
    assert third["cache_hits"] >= 24 + 8  # every first-round and second-round point of sync and one_step_off
    assert third["simulated"] >= 12 + 4 + 2  # rollpacker's rounds and its seeds
    # a target no configuration meets: finalists are still shown, but none is called the best
    hard = PlanConfig(target_epoch_hours=1e-6, steps=3, min_steps=1, eta=3, seeds=2)
    none = plan(small_trace_path, space, "h100-qwen2.5-7b-tp1", rl, hard, cache=PlanCache(None))
    assert none["answers"] and not any(a["meets_target"] for a in none["answers"]) and none["best"] is None
    # a cut-off last line (a crash mid-write) is skipped, not fatal
    with open(tmp_path / "cache.jsonl", "a") as f:  # noqa: PTH123
        f.write('{"key": "x", "ro')
    assert len(PlanCache(tmp_path / "cache.jsonl").rows) == first + third["simulated"]


def test_a_tie_group_prints_its_ranks() -> None:
    res = {"answers": [
        {"policy": "a", "label": "8 GPUs, coloc, TP 1", "max_response_len": 4096, "clip_ratio": 0.01,
         "epoch_hours": 1.0, "epoch_hours_range": (0.9, 1.1), "gpu_hours": 8.0, "gpu_hours_range": (7.2, 8.8),
         "rank_by_seed": [1, 2, 1], "rank_range": (1, 2), "tie": True, "meets_target": None},
        {"policy": "b", "label": "8 GPUs, coloc, TP 1", "max_response_len": 4096, "clip_ratio": 0.01,
         "epoch_hours": 1.05, "epoch_hours_range": (1.05, 1.05), "gpu_hours": 8.4, "gpu_hours_range": (8.4, 8.4),
         "rank_by_seed": [2, 1, 2], "rank_range": (1, 2), "tie": True, "meets_target": True},
    ]}  # fmt: skip
    rows = answer_rows(res)
    assert rows[0][6] == rows[1][6] == "#1-2 tie" and rows[0][4] == "1.00 ± 0.10" and rows[0][7] == "-"
    assert rows[0][3] == "1.0%" and rows[1][4] == "1.05" and rows[1][7] == "yes"


def test_plan_command_prints_the_front_writes_the_plot_and_json(tmp_path: Path, small_trace_path: Path) -> None:
    png, cache = tmp_path / "plan.png", tmp_path / "c.jsonl"
    args = ["plan", "--gpu-budget", "8", "--trace", str(small_trace_path), "--gpus", "4,8", "--profile",
            "h100-qwen2.5-7b-tp1", "--tp", "1,2", "--placement", "colocated,disaggregated", "--train-share", "0.5",
            "--policies", "sync,one_step_off", "--prompts-per-step", "16", "--samples-per-prompt", "4",
            "--max-response-len", "2048,4096", "--steps", "2", "--min-steps", "1", "--seeds", "2", "--workers", "2",
            "--cache", str(cache)]  # fmt: skip
    res = runner.invoke(app, [*args, "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert "Pareto front" in res.output and "best:" in res.output and "fastest epoch on at most 8 GPUs" in res.output
    assert png.stat().st_size > 20_000
    out = runner.invoke(app, [*args, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["simulated"] == 0 and data["cache_hits"] > 0  # the second run is answered from the cache
    assert {r["max_response_len"] for r in data["rows"]} == {2048, 4096}
    assert all(0 <= r["clip_ratio"] <= 1 for r in data["rows"])
    # the answer as a framework's config (answered from the cache): read back, it is the best configuration
    from rlsim.frameworks.verl import read_verl

    emitted = tmp_path / "best.overrides"
    out = runner.invoke(app, [*args, "--emit", f"verl:{emitted}"])
    assert out.exit_code == 0, out.output
    best, back = data["best"], read_verl(emitted)
    assert (back.policy, back.num_gpus, back.placement, back.tp, back.max_response_len) == (
        best["policy"], best["num_gpus"], best["placement"], best["tp"], best["max_response_len"]
    )
    assert (back.prompts_per_step, back.samples_per_prompt, back.model) == (16, 4, "qwen2.5-7b")
    # the model as veRL would load it: its Hugging Face id (models.json), not rlsim's short name
    assert back.model_path == "Qwen/Qwen2.5-7B-Instruct"
    assert "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct" in emitted.read_text()


def test_plan_command_bad_inputs(tmp_path: Path, small_trace_path: Path) -> None:
    assert "give an objective" in _err(["plan"])
    assert "the search space is empty: no placements" in _err(["plan", "--gpu-budget", "64", "--placement", ","])
    assert "leaves no training GPU" in _err(
        ["plan", "--gpu-budget", "64", "--gpus", "8", "--placement", "disaggregated", "--train-share", "0.05"]
    )
    assert "--tp 8 does not divide 12 GPUs" in _err(["plan", "--gpu-budget", "64", "--gpus", "12", "--tp", "8"])
    assert "below one rollout instance" in _err(["plan", "--gpu-budget", "2"])
    assert "must be a comma-separated list of int" in _err(["plan", "--gpu-budget", "64", "--tp", "four"])
    assert "exceeds the trace's cap" in _err(
        ["plan", "--gpu-budget", "8", "--trace", str(small_trace_path), "--max-response-len", "99999", "--gpus", "8"]
    )
    assert "is a directory" in _err(["plan", "--gpu-budget", "8", "--cache", str(tmp_path)])


def test_staleness_is_searched_for_the_policies_that_bound_it() -> None:
    """--staleness sets fully_async's staleness_threshold and areal's max_head_offpolicyness
    (integers); other policies are searched once; disaggregated-only policies only disaggregated."""
    space = SearchSpace(("sync", "fully_async", "areal(max_concurrent_rollouts=8)"), (32,),
                        ("colocated", "disaggregated"), (0.25,), staleness=(0.5, 1.0, 2.0))  # fmt: skip
    cands = candidates(space, "h100-qwen2.5-32b-tp4")
    pols = {(c.policy, c.placement) for c in cands}
    assert {p for p, _ in pols if p.startswith("fully_async")} == {
        f"fully_async(staleness_threshold={v})" for v in ("0.5", "1", "2")
    }
    assert {p for p, _ in pols if p.startswith("areal")} == {
        f"areal(max_concurrent_rollouts=8,max_head_offpolicyness={v})" for v in (1, 2)
    }
    assert {pl for p, pl in pols if not p.startswith("sync")} == {"disaggregated"}
    assert {pl for p, pl in pols if p == "sync"} == {"colocated", "disaggregated"}
    with pytest.raises(RlsimError, match="fully_async runs only disaggregated"):
        candidates(SearchSpace(("fully_async",), (32,)), "h100-qwen2.5-32b-tp4")


def test_a_local_update_policy_is_planned_over_its_whole_epoch(small_trace_path: Path) -> None:
    """fully_async trains P0 / 4 prompts a step: the plan simulates four times the steps and
    counts four times as many in the epoch as for a policy that trains P0 a step."""
    rl = RLConfig(prompts_per_step=16, samples_per_prompt=4, epochs=1)
    space = SearchSpace(("one_step_off", "fully_async"), (16,), ("disaggregated",), (0.5,), staleness=(0.5,))
    res = plan(small_trace_path, space, "h100-qwen2.5-7b-tp1", rl, PlanConfig(gpu_budget=16, steps=2, min_steps=2,
                                                                               seeds=1))  # fmt: skip
    rows = {r["policy"]: r for r in res["rows"]}
    sync_like, local = rows["one_step_off"], rows["fully_async(staleness_threshold=0.5)"]
    assert local["steps_per_epoch"] == 4 * sync_like["steps_per_epoch"]
    assert len(local["step_s"]) == 4 * len(sync_like["step_s"]) == 8
    assert local["steps_simulated"] == sync_like["steps_simulated"] == 2  # the rung, as the halving counts it


def test_both_rollout_engines_are_searched_each_with_its_own_settings(small_trace_path: Path) -> None:
    """--rollout-engine vllm,sglang: every candidate under each engine's rules, a setting only one
    engine has on that engine's candidates only, speculation under vLLM's only; the vLLM
    candidates keep the keys a vLLM-only plan gives them (the cache still answers them)."""
    space = SearchSpace(("sync", "sync+histospec"), (16,), rollout_engines=("vllm", "sglang"))
    engine = EngineConfig(schedule_policy="lpm", block_size=32)
    cands = candidates(space, "h100-qwen2.5-32b-tp4", engine=engine)
    by = {(c.policy, c.engine.get("rollout_engine", "vllm")): c for c in cands}
    assert set(by) == {("sync", "vllm"), ("sync+histospec", "vllm"), ("sync", "sglang")}
    assert by["sync", "sglang"].engine == {"rollout_engine": "sglang", "schedule_policy": "lpm"}
    assert by["sync", "vllm"].engine == {"block_size": 32}
    assert by["sync", "sglang"].label().startswith("SGLang, 16 GPUs") and by["sync", "vllm"].label().startswith("16")
    alone = candidates(SearchSpace(("sync",), (16,)), "h100-qwen2.5-32b-tp4", engine=EngineConfig(block_size=32))
    assert [c.key() for c in alone] == [by["sync", "vllm"].key()]
    with pytest.raises(RlsimError, match="speculates .HistoSpec., which is modelled under vLLM's rules only"):
        candidates(SearchSpace(("sync+histospec",), (16,), rollout_engines=("sglang",)), "h100-qwen2.5-32b-tp4")
    # the command, both engines on a small question
    args = ["plan", "--gpu-budget", "8", "--trace", str(small_trace_path), "--gpus", "8", "--profile",
            "h100-qwen2.5-7b-tp1", "--policies", "sync", "--prompts-per-step", "16", "--samples-per-prompt", "4",
            "--max-response-len", "4096", "--steps", "1", "--min-steps", "1", "--seeds", "1", "--workers", "1",
            "--no-cache", "--rollout-engine", "vllm,sglang", "--json"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output[res.output.index("{"):])
    assert sorted(r["engine"].get("rollout_engine", "vllm") for r in data["rows"]) == ["sglang", "vllm"]
    table = runner.invoke(app, args[:-1])
    assert table.exit_code == 0, table.output
    assert "SGLang, 8 GPUs" in table.output  # (on the compiled core, as vLLM's: no line says otherwise)
    assert "on SimEngine" not in table.output
    assert sorted(a["label"].split(",")[0] for a in data["answers"]) == ["8 GPUs", "SGLang"]  # a finalist each
    assert "--rollout-engine is empty" in _err([*args[:-3], "--rollout-engine", ","])
    assert "is a vLLM setting that SGLang does not have" in _err(
        [*args[:-3], "--rollout-engine", "sglang", "--block-size", "32"]
    )
