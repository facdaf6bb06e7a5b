"""One config, one run: `simulate`, `compare`, `plan` and `validate` given the same `--from` config
(a veRL launch script, a NeMo RL recipe, and a NeMo RL recipe generating with SGLang) simulate the
same cluster, the same RL settings and the same engine, field by field, on the same derived
profile. Each command's call into the simulator is captured (and stopped there); plan's is its
one candidate (the config names one value on every axis), as the planner simulates it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.package_data.nemo_rl import RECIPES as NEMO
from rlsim.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
VERL = ROOT / "published_runs" / "verl" / "dapo_7b_math_fsdp2_32_32.overrides"
NEMO_8B = NEMO / "9dbd9adc9/examples/configs/recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g.yaml"
runner = CliRunner()


class Captured(Exception):  # noqa: N818 - not an error: the simulator's call, stopped
    """Raised by the stand-in for the simulator once it has recorded its inputs."""


def _configs(tmp_path: Path, kind: str) -> tuple[str, list[str]]:
    """The `--from` value and the options besides it (the model where the config names a local path)."""
    if kind == "verl":
        return f"verl:{VERL}", ["--model", "qwen2.5-7b"]
    if kind == "nemo-rl":
        return f"nemo-rl:{NEMO_8B}", []
    recipe = tmp_path / "sglang.yaml"
    recipe.write_text(f"defaults: {NEMO_8B}\npolicy:\n  generation:\n    backend: sglang\n")
    return f"nemo-rl:{recipe}", []


def _trace(tmp_path: Path, spec: str) -> Path:
    """A small trace at the config's batch and response cap (short responses, prompts of 64-256)."""
    from rlsim.frameworks.registry import read
    from rlsim.trace.format import save
    from rlsim.trace.synth import SynthConfig, synthesize

    s = read(spec)
    n, cap = s.prompts_per_step, s.max_response_len
    cfg = SynthConfig(num_prompts=n, samples_per_prompt=s.samples_per_prompt, epochs=1, prompts_per_step=n,
                      max_response_len=cap, length_scale=0.02)  # fmt: skip
    return save(synthesize(cfg), tmp_path / "t.parquet")


def _record(store: dict, name: str):  # noqa: ANN202
    def stand_in(trace, policy, cluster, rl, *args, engine_cfg=None, **kwargs):  # noqa: ANN001, ANN202
        store[name] = (cluster, rl, engine_cfg)
        raise Captured(name)

    return stand_in


def _as_run(cluster, rl, engine) -> dict:  # noqa: ANN001
    """What is compared: the cluster (its profile by content), the RL settings a config sets, the engine."""
    prof = dataclasses.asdict(load_profile(cluster.profile))
    prof.pop("name", None)
    rl_fields = ("prompts_per_step", "samples_per_prompt", "max_response_len", "max_model_len", "use_kl_loss")
    return {
        "num_gpus": cluster.num_gpus, "placement": cluster.placement, "train_gpus": cluster.train_gpus,
        "profile": prof, **{f"rl.{k}": getattr(rl, k) for k in rl_fields},
        **{f"engine.{k}": v for k, v in dataclasses.asdict(engine).items()},
    }  # fmt: skip


@pytest.mark.parametrize("kind", ["verl", "nemo-rl", "sglang"])
def test_the_four_commands_run_the_same_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    import rlsim.plan.planner as planner
    import rlsim.real.validate_verl as validate_verl
    import rlsim.sim.compare as sim_compare
    import rlsim.sim.simulate as sim_simulate
    from rlsim.plan.space import candidates

    spec, more = _configs(tmp_path, kind)
    trace = _trace(tmp_path, spec)
    got: dict = {}
    monkeypatch.setattr(sim_simulate, "simulate", _record(got, "simulate"))
    monkeypatch.setattr(validate_verl, "simulate", _record(got, "validate"))

    def compare_stand_in(trace, policies, cluster, rl, *args, engine_cfg=None, **kwargs):  # noqa: ANN001, ANN202
        got["compare"] = (cluster, rl, engine_cfg)
        raise Captured("compare")

    def plan_stand_in(trace_path, space, profile, rl, config, *args, engine=None, **kwargs):  # noqa: ANN001, ANN202
        cands = candidates(space, profile, config.gpu_budget, engine)
        assert len(cands) == 1, [c.label() for c in cands]  # the config's one value on every axis
        rl_d = {k: v for k, v in dataclasses.asdict(rl).items() if k not in ("epochs", "max_steps", "seed")}
        got["plan"] = planner.run_configs(cands[0], rl_d, 1, rl.seed)
        raise Captured("plan")

    monkeypatch.setattr(sim_compare, "compare", compare_stand_in)
    monkeypatch.setattr(planner, "plan", plan_stand_in)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "timing_s/gen": 10.0, "timing_s/step": 20.0}) + "\n"
                               for s in (1, 2)))  # fmt: skip
    common = ["--from", spec, "--gpu", "h100", *more]
    runs = {
        "simulate": ["simulate", *common, "--trace", str(trace), "--out", str(tmp_path / "run")],
        "compare": ["compare", *common, "--trace", str(trace), "--policies", "sync"],
        "plan": ["plan", *common, "--trace", str(trace), "--no-cache", "--seeds", "1", "--gpu-budget", "4096"],
        "validate": ["validate", *common, "--metrics", str(metrics), "--trace", str(trace)],
    }
    for name, args in runs.items():
        r = runner.invoke(app, args)
        assert isinstance(r.exception, Captured), (name, r.output, r.exception)
    runs_as = {name: _as_run(*got[name]) for name in runs}
    first = runs_as["simulate"]
    assert first["engine.rollout_engine"] == ("sglang" if kind == "sglang" else "vllm")
    if kind != "verl":  # the recipe's vllm_cfg.max_model_len, which plan dropped
        assert first["rl.max_model_len"] == 4096
    for name, run in runs_as.items():
        diff = {k: (first[k], run.get(k)) for k in first if first[k] != run.get(k)}
        assert not diff, (name, diff)
