"""Error bands (`rlsim.bands`): the shipped bands are what `benchmarks/error_bands.py` builds from
the accuracy tables; a prediction's kind comes from its profile, engine and framework; a kind with
fewer than three held-back runs gives no figure; `simulate`, `compare` and `plan` print the bands;
and a plan ranks two finalists apart only beyond the ratio band."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from rlsim.bands import _data, band, band_text, kind_of, ratio_band, ratio_text
from rlsim.cli.app import app
from rlsim.derive.derive import derive_profile, setup
from rlsim.derive.terms import load_terms
from rlsim.plan.planner import _ties, apart
from rlsim.profile import load_profile, profile_from_dict

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import error_bands  # noqa: E402

runner = CliRunner()


def test_the_shipped_bands_are_built_from_the_accuracy_tables() -> None:
    """rlsim/bands.json is the benchmark's build from the tables CI holds equal to their benchmarks,
    and every run in it carries its own error."""
    built = error_bands.build()
    assert error_bands.text(built) == (REPO / "rlsim" / "bands.json").read_text()
    runs = built["runs"]
    assert {r["framework"] for r in runs} == {"nemo-rl", "verl", "roll"}
    # NeMo RL: 49 expressible rows and the k-step row, each under both bases; veRL's 4 steps; RollPacker's 3 x 2
    assert len(runs) == 2 * 50 + 4 + 6
    for r in runs:
        assert r["error_pct"] == round(100 * (r["predicted_s"] / r["published_s"] - 1), 1)
    fitted = [r for r in runs if r["framework"] == "nemo-rl" and r["basis"] == "fitted"]
    assert sum(r["held_back"] for r in fitted) == 22 + 1  # the test half and the k-step row
    assert all(p["published_ratio"] >= 1 for p in built["pairs"])


def test_a_kind_with_fewer_than_three_runs_gives_no_figure() -> None:
    data = _data()
    thin = [k for k, b in data["bands"].items() if b["runs"] < 3]
    assert thin  # the shipped bands have such kinds (veRL's MoE run on H20 is one)
    moe_h20 = band(kind_of(_derived("qwen3-30b-a3b", "h20", 4), framework="verl"))
    assert moe_h20["runs"] == 1 and not moe_h20["enough"] and "median_abs_pct" not in moe_h20
    text = band_text(moe_h20)
    assert "fewer than three published runs of this kind (1)" in text and "%" not in text


def test_the_kind_comes_from_the_profile_the_engine_and_the_framework() -> None:
    shipped = kind_of(load_profile("h100-qwen2.5-32b-tp4"))
    assert (shipped.basis, shipped.rollout_engine, shipped.framework, shipped.model_class, shipped.gpu) == (
        "derived", "vllm", "any", "dense", "h100"
    )  # fmt: skip
    b = band(shipped)
    assert b["enough"] and b["by_framework"] == {"nemo-rl": 9} and 0 < b["median_abs_pct"] <= b["worst_abs_pct"]
    assert "9 runs: NeMo RL 9" in band_text(b)
    moe = kind_of(_derived("qwen3-30b-a3b", "h100", 2))
    assert moe.model_class == "moe"
    # the NeMo RL terms laid over a derived profile: fitted, and the test half's band
    fitted = kind_of(_derived("qwen3-30b-a3b", "h100", 2, terms=True))
    assert fitted.basis == "fitted" and band(fitted)["runs"] == 13
    # a profile calibrated on a machine (not derived): no published run was predicted from one
    measured = kind_of(load_profile("h200-llama-8b"))
    assert measured.basis == "measured" and band_text(band(measured)).startswith("error band: none")
    # SGLang's rules: no published run in the tables rolled out with SGLang
    sg = band(kind_of(load_profile("h100-qwen2.5-32b-tp4"), "sglang"))
    assert sg["runs"] == 0 and "fewer than three" in band_text(sg)
    # a --from config's framework: veRL's three dense H20 steps
    verl = band(kind_of(_derived("qwen2.5-7b", "h20", 4), framework="verl"))
    assert verl["runs"] == 3 and verl["by_framework"] == {"verl": 3}
    assert ratio_band(shipped)["pairs"] == 40 and "40 pairs" in ratio_text(ratio_band(shipped))
    assert not ratio_band(fitted)["enough"] and "fewer than three published pairs (2)" in ratio_text(ratio_band(fitted))


def _derived(model: str, gpu: str, tp: int, terms: bool = False):  # noqa: ANN202
    raw = derive_profile(setup(model, gpu, tp))
    if terms:
        fitted, where = load_terms("nemo-rl")
        raw = fitted.apply(raw, where)
    return profile_from_dict(raw)


def test_two_finalists_rank_apart_only_beyond_the_ratio_band() -> None:
    one = [(0, 1.0), (0, 1.0), (0, 1.0)]
    assert not apart(one, [(0, 1.1)] * 3, 19.0)  # 10% slower: within a 19% ratio band
    assert apart(one, [(0, 1.3)] * 3, 19.0)  # 30% slower under every seed
    assert not apart(one, [(0, 1.3), (0, 1.3), (0, 1.1)], 19.0)  # one seed within the band
    assert apart(one, [(0, 1.1)] * 3, None)  # no band: the seeds' order alone
    assert not apart(one, [(0, 0.9), (0, 1.1), (0, 1.1)], None)  # the order changes between seeds
    assert apart([(0, 9.0)] * 3, [(1, 1.0)] * 3, 19.0)  # missing the target under every seed

    def answer(v: float) -> dict:
        return {"_scores": [(0, v)] * 2, "ratio_band": {"enough": True, "median_abs_pct": 19.0}}

    answers = [answer(1.0), answer(1.1), answer(1.5), answer(2.0)]
    _ties(answers)
    assert [a["rank_range"] for a in answers] == [(1, 2), (1, 2), (3, 3), (4, 4)]
    assert [a["tie"] for a in answers] == [True, True, False, False] and "_scores" not in answers[0]
    # a tie is not passed on: 1.0 and 1.3 are apart though each ties with 1.15 between them
    chain = [answer(1.0), answer(1.15), answer(1.3)]
    _ties(chain)
    assert [a["rank_range"] for a in chain] == [(1, 2), (1, 3), (2, 3)]


def test_simulate_and_compare_print_the_bands(tmp_path: Path, small_trace_path: Path) -> None:
    common = ["--trace", str(small_trace_path), "--gpus", "4", "--profile", "h100-qwen2.5-7b-tp1",
              "--prompts-per-step", "16", "--samples-per-prompt", "4", "--max-steps", "2"]  # fmt: skip
    r = runner.invoke(app, ["simulate", *common, "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    assert "step and epoch times: error band (derived profile, vLLM, dense, H100, every framework)" in r.output
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["error_band"]["runs"] == 9 and summary["error_band"]["enough"]
    r = runner.invoke(app, ["compare", *common, "--policies", "sync,rollpacker"])
    assert r.exit_code == 0, r.output
    assert "epoch times: error band" in r.output and "speedups: ratio band (derived, vLLM, every framework)" in r.output
    rows = json.loads(runner.invoke(app, ["compare", *common, "--policies", "sync", "--json"]).output)
    assert rows[0]["error_band"]["median_abs_pct"] > 0 and rows[0]["ratio_band"]["pairs"] == 40


def test_a_config_of_verl_takes_verls_band(tmp_path: Path, small_trace_path: Path) -> None:
    """simulate --from verl: names the framework: the band is veRL's runs' (H20, dense: three)."""
    config = tmp_path / "run.overrides"
    config.write_text(
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=vllm "
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1 trainer.nnodes=1 trainer.n_gpus_per_node=4 "
        "data.train_batch_size=16 actor_rollout_ref.rollout.n=4 data.max_response_length=4096 "
        "actor_rollout_ref.model.path=~/models/my-7b algorithm.adv_estimator=grpo\n"
    )
    r = runner.invoke(app, ["simulate", "--from", f"verl:{config}", "--gpu", "h20", "--model", "qwen2.5-7b", "--trace",
                            str(small_trace_path), "--max-steps", "1", "--out", str(tmp_path / "v")])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "dense, H20, veRL): held-back published runs of this kind were off by a median" in r.output
    assert "(3 runs: veRL 3;" in r.output


def test_plan_prints_the_bands_and_ranks_with_the_ratio_band(small_trace_path: Path) -> None:
    args = ["plan", "--gpu-budget", "8", "--trace", str(small_trace_path), "--gpus", "4,8", "--profile",
            "h100-qwen2.5-7b-tp1", "--tp", "1", "--placement", "colocated", "--policies", "sync,rollpacker",
            "--prompts-per-step", "16", "--samples-per-prompt", "4", "--max-response-len", "4096", "--steps", "2",
            "--min-steps", "1", "--seeds", "2", "--workers", "1", "--no-cache"]  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "epoch times: error band (derived profile, vLLM, dense, H100" in r.output
    assert "ranks: ratio band (derived, vLLM, every framework)" in r.output
    res = json.loads(runner.invoke(app, [*args, "--json"]).output)
    for a in res["answers"]:
        assert a["error_band"]["enough"] and a["ratio_band"]["median_abs_pct"] > 0
        assert a["rank_range"][0] <= a["rank"] <= a["rank_range"][1]
