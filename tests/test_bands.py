"""Error bands (`rlsim.bands`): the shipped bands are what `rlsim.package_data.bands` builds from
the accuracy tables; a prediction's kind comes from its profile (its basis, trainer backend,
model class and GPU), engine and framework; a band counts configurations, not release repeats,
and a kind with fewer than three held-back configurations gives no figure; `simulate`, `compare`
and `plan` print the bands; and a plan ranks two finalists apart only beyond the ratio band."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rlsim.bands import Kind, _data, band, band_text, kind_of, ratio_band, ratio_text
from rlsim.cli.app import app
from rlsim.derive.derive import derive_profile, setup
from rlsim.derive.terms import load_terms
from rlsim.derive.train import Trainer
from rlsim.package_data import bands as shipped
from rlsim.plan.planner import _ties, apart
from rlsim.profile import load_profile, profile_from_dict

REPO = Path(__file__).resolve().parents[1]

runner = CliRunner()


def test_the_shipped_bands_are_built_from_the_accuracy_tables() -> None:
    """rlsim/bands.json is `python -m rlsim.package_data bands`' build from the tables CI holds
    equal to their scripts' output, and every run in it carries its own error."""
    built = shipped.build()
    assert shipped.text(built) == (REPO / "rlsim" / "bands.json").read_text()
    assert shipped.stale() == []
    runs = built["runs"]
    assert {r["framework"] for r in runs} == {"nemo-rl", "verl", "roll"}
    # NeMo RL: 49 expressible rows and the k-step row, each under both bases; veRL's 4 steps; RollPacker's 3 x 2
    assert len(runs) == 2 * 50 + 4 + 6
    for r in runs:
        assert r["error_pct"] == round(100 * (r["predicted_s"] / r["published_s"] - 1), 1)
    fitted = [r for r in runs if r["framework"] == "nemo-rl" and r["basis"] == "fitted"]
    assert sum(r["held_back"] for r in fitted) == 22 + 1  # the test half and the k-step row
    assert all(p["published_ratio"] >= 1 for p in built["pairs"])


def test_a_kind_with_fewer_than_three_configurations_gives_no_figure() -> None:
    data = _data()
    thin = [k for k, b in data["bands"].items() if b["configurations"] < 3]
    assert thin  # the shipped bands have such kinds (veRL's MoE run on H20 is one)
    moe_h20 = band(kind_of(_derived("qwen3-30b-a3b", "h20", 4, trainer=Trainer("megatron")), framework="verl"))
    assert moe_h20["configurations"] == 1 and not moe_h20["enough"] and "median_abs_pct" not in moe_h20
    text = band_text(moe_h20)
    assert "fewer than three published configurations of this kind (1)" in text and "%" not in text


def test_bands_count_configurations_not_release_repeats() -> None:
    """A configuration NeMo RL published in three releases is one error in a band (the median of
    its runs'); every band says how many configurations and runs it holds, each model's signed
    median, and whether those split in sign."""
    data = _data()
    runs = data["runs"]
    for key, b in data["bands"].items():
        basis, engine, fw, backend, cls, gpu = key.split("/")
        mine = [r for r in runs if r["held_back"] and r["basis"] == basis and fw in (r["framework"], "any")
                and r["backend"] == backend and r["model_class"] == cls and r["gpu"] == gpu]  # fmt: skip
        assert b["runs"] == len(mine) and b["configurations"] == len({r["config"] for r in mine}), key
        assert b["signs_split"] == (len({v > 0 for v in b["by_model_median_pct"].values() if v}) > 1)
    nemo = band(Kind("derived", "vllm", "nemo-rl", "moe", "h100", "megatron"))
    assert nemo["runs"] > nemo["configurations"] >= 3  # release repeats are counted once
    assert data["release_spread_pct"] and all(0 < v < 100 for v in data["release_spread_pct"].values())
    for key, b in data["bands"].items():  # a band that averages opposite biases says so
        basis, engine, fw, backend, cls, gpu = key.split("/")
        if b["configurations"] >= 3:
            text = band_text(band(Kind(basis, engine, fw, cls, gpu, backend)))
            assert ("biases are opposite" in text) == b["signs_split"], key


def test_the_kind_comes_from_the_profile_the_engine_and_the_framework() -> None:
    shipped = kind_of(load_profile("h100-qwen2.5-32b-tp4"))
    assert (shipped.basis, shipped.rollout_engine, shipped.framework, shipped.backend, shipped.model_class,
            shipped.gpu) == ("derived", "vllm", "any", "fsdp", "dense", "h100")  # fmt: skip
    # a dense FSDP run on H100: no published run of that kind, so no band from Megatron's runs
    b = band(shipped)
    assert b["configurations"] == 0 and not b["enough"] and "fewer than three" in band_text(b)
    megatron = kind_of(_derived("qwen3-32b", "h100", 4, trainer=Trainer("megatron", tp=4)))
    assert megatron.backend == "megatron"
    b = band(megatron)
    assert b["enough"] and b["by_framework"] == {"nemo-rl": 9} and 0 < b["median_abs_pct"] <= b["worst_abs_pct"]
    assert f"{b['configurations']} configurations, 9 runs: NeMo RL 9" in band_text(b)
    moe = kind_of(_derived("qwen3-30b-a3b", "h100", 2))
    assert moe.model_class == "moe"
    # the NeMo RL terms laid over a derived profile: fitted, and the validation half's band
    fitted = kind_of(_derived("qwen3-30b-a3b", "h100", 2, terms=True, trainer=Trainer("megatron")))
    assert fitted.basis == "fitted" and band(fitted)["runs"] == 13
    # a profile calibrated on a machine (not derived): no published run was predicted from one
    measured = kind_of(load_profile("h200-llama-8b"))
    assert measured.basis == "measured" and band_text(band(measured)).startswith("error band: none")
    # SGLang's rules: no published run in the tables rolled out with SGLang
    sg = band(kind_of(load_profile("h100-qwen2.5-32b-tp4"), "sglang"))
    assert sg["runs"] == 0 and "fewer than three" in band_text(sg)
    # a --from config's framework: veRL's three dense H20 steps (FSDP, as its script trains)
    verl = band(kind_of(_derived("qwen2.5-7b", "h20", 4), framework="verl"))
    assert verl["runs"] == 3 and verl["by_framework"] == {"verl": 3}
    assert ratio_band(shipped)["pairs"] == 40 and "40 pairs" in ratio_text(ratio_band(shipped))
    assert not ratio_band(fitted)["enough"] and "fewer than three published pairs (2)" in ratio_text(ratio_band(fitted))


def _derived(model: str, gpu: str, tp: int, terms: bool = False, trainer: Trainer | None = None):  # noqa: ANN202
    raw = derive_profile(setup(model, gpu, tp), trainer=trainer) if trainer else derive_profile(setup(model, gpu, tp))
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
    # the shipped profile trains with FSDP: no published dense FSDP run on an H100, so no band (the
    # Megatron runs' band is not lent to it)
    out = " ".join(r.output.split())
    assert ("step and epoch times: error band (derived profile, vLLM, FSDP, dense, H100, every framework): fewer "
            "than three published configurations of this kind (0)") in out  # fmt: skip
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["error_band"]["configurations"] == 0 and not summary["error_band"]["enough"]
    r = runner.invoke(app, ["simulate", *common[:4], "--model", "qwen3-32b", "--gpu", "h100", "--tp", "4",
                            "--trainer", "megatron(tp=4)", *common[6:], "--out", str(tmp_path / "m")])  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert summary["error_band"]["runs"] == 9 and summary["error_band"]["enough"]
    r = runner.invoke(app, ["compare", *common, "--policies", "sync,rollpacker"])
    assert r.exit_code == 0, r.output
    assert "epoch times: error band" in r.output and "speedups: ratio band (derived, vLLM, every framework)" in r.output
    rows = json.loads(runner.invoke(app, ["compare", *common, "--policies", "sync", "--json"]).stdout)
    assert rows[0]["error_band"]["configurations"] == 0 and rows[0]["ratio_band"]["pairs"] == 40


def test_a_config_of_verl_takes_verls_band(tmp_path: Path, small_trace_path: Path) -> None:
    """simulate --from verl: names the framework: the band is veRL's runs' (H20, dense: three)."""
    config = tmp_path / "run.overrides"
    config.write_text(
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=vllm "
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1 trainer.nnodes=1 trainer.n_gpus_per_node=4 "
        "data.train_batch_size=16 actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.rollout.n=4 "
        "data.max_response_length=4096 "
        "actor_rollout_ref.model.path=/models/my-7b algorithm.adv_estimator=grpo\n"
    )
    r = runner.invoke(app, ["simulate", "--from", f"verl:{config}", "--gpu", "h20", "--model", "qwen2.5-7b", "--trace",
                            str(small_trace_path), "--max-steps", "1", "--out", str(tmp_path / "v")])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "FSDP, dense, H20, veRL): held-back published configurations of this kind were off by a median" in out
    assert "(3 configurations, 3 runs: veRL 3;" in out


def test_plan_prints_the_bands_and_ranks_with_the_ratio_band(small_trace_path: Path) -> None:
    args = ["plan", "--gpu-budget", "8", "--trace", str(small_trace_path), "--gpus", "4,8", "--profile",
            "h100-qwen2.5-7b-tp1", "--tp", "1", "--placement", "colocated", "--policies", "sync,rollpacker",
            "--prompts-per-step", "16", "--samples-per-prompt", "4", "--max-response-len", "4096", "--steps", "2",
            "--min-steps", "1", "--seeds", "2", "--workers", "1", "--no-cache"]  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "epoch times: error band (derived profile, vLLM, FSDP, dense, H100" in " ".join(r.output.split())
    assert "ranks: ratio band (derived, vLLM, every framework)" in r.output
    res = json.loads(runner.invoke(app, [*args, "--json"]).output)
    for a in res["answers"]:
        assert a["error_band"]["configurations"] == 0 and a["ratio_band"]["median_abs_pct"] > 0
        assert a["rank_range"][0] <= a["rank"] <= a["rank_range"][1]
