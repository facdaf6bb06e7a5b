"""`--from verl:CONFIG` (rlsim.frameworks.verl, rlsim.cli.from_config): veRL's published launch
scripts map to the setups the accuracy tables use, Hydra's override rules hold, a run's written
YAML reads as its overrides do, and an option the config also sets is one sentence."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.errors import RlsimError
from rlsim.frameworks.verl import known_model, read_config, read_verl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the benchmarks' own imports
from benchmarks.verl_phases import DENSE_ENGINE, DENSE_TRAINER, MOE_TRAINER, RUNS  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "verl"
MOE = DATA / "grpo_30b_a3b_base_math_megatron_96_32.overrides"
DENSE = DATA / "dapo_7b_math_fsdp2_32_32.overrides"
runner = CliRunner()


def test_the_published_moe_script_is_the_setup_its_table_runs() -> None:
    """veRL's Qwen3-30B-A3B fully-async script: Megatron TP 2, CP 2, EP 8 with every offload,
    dynamic batch at 10,240 tokens, a KL loss; vLLM TP 4 at 0.7 with 10,240 batched tokens and
    eager mode; 96 rollout and 32 training GPUs; veRL's fully-async knobs as the script sets them."""
    s = read_verl(MOE)
    run = RUNS[0]
    assert s.trainer == MOE_TRAINER == run.trainer
    for k in ("gpu_memory_utilization", "max_num_batched_tokens", "enforce_eager"):
        assert getattr(s.engine, k) == getattr(run.engine, k), k
    assert (s.model, s.tp, s.max_response_len, s.samples_per_prompt, s.use_kl_loss) == (
        run.model, run.gen_tp, run.cap, 16, run.use_kl_loss
    )
    assert (s.num_gpus, s.placement, s.train_gpus) == (128, "disaggregated", 32)
    assert s.policy == (
        "fully_async(staleness_threshold=0.5,require_batches=1,trigger_parameter_sync_step=4,ppo_mini_batch_size=128,"
        "partial_rollout=true,use_rollout_log_probs=true,checkpoint_engine=true,device_buffer_size_M=4096)"
    )
    assert s.prompts_per_step == 128 * 1 * 4  # prompts between two parameter syncs
    assert s.unmodelled == ()


def test_the_published_dense_script_is_the_setup_its_table_runs() -> None:
    """veRL's DAPO Qwen2.5-Math-7B script (FSDP2, Ulysses 4, full recompute, dynamic batch at
    61,440 and 92,160 tokens; vLLM TP 4 at 0.8 with 30,720 batched tokens). Its reference is
    offloaded, which costs nothing without a KL term. The model path names a checkpoint rlsim
    knows only by its shape, so --model gives it."""
    s = read_verl(DENSE)
    assert s.trainer == dataclasses.replace(
        DENSE_TRAINER, framework=dataclasses.replace(DENSE_TRAINER.framework, ref_offload=True)
    )
    for k in ("gpu_memory_utilization", "max_num_batched_tokens"):
        assert getattr(s.engine, k) == getattr(DENSE_ENGINE, k), k
    assert (s.model, s.tp, s.max_response_len, s.use_kl_loss) == (None, 4, 28672, False)
    assert (s.num_gpus, s.train_gpus) == (64, 32)


def test_a_runs_written_yaml_reads_as_its_overrides(tmp_path: Path) -> None:
    """The config a run writes (every key, resolved) gives the same setup as the overrides it
    was launched with, and a partial YAML naming its defaults is laid over them."""
    cfg, name = read_config(MOE)
    written = tmp_path / "config.yaml"
    written.write_text(yaml.safe_dump(cfg | {"defaults": [name, "_self_"]}))
    assert dataclasses.replace(read_verl(written), source="") == dataclasses.replace(read_verl(MOE), source="")
    partial = tmp_path / "partial.yaml"
    partial.write_text(yaml.safe_dump({"actor_rollout_ref": {"rollout": {"name": "sglang", "n": 8}}}))
    s = read_verl(partial)
    assert (s.engine.rollout_engine, s.samples_per_prompt, s.policy, s.placement) == ("sglang", 8, "sync", "colocated")
    assert (s.prompts_per_step, s.max_response_len, s.tp) == (1024, 512, 2)  # veRL 0.7.0's defaults


@pytest.mark.parametrize(
    ("words", "message"),
    [
        ("actor_rollout_ref.rollout.name=vllm data.no_such_key=1", "write +data.no_such_key"),
        ("actor_rollout_ref.rollout.name=vllm +data.train_batch_size=8", "already has"),
        ("actor_rollout_ref.rollout.name=vllm ~data.nonesuch", "does not have"),
        ("actor_rollout_ref.rollout.name=vllm data.train_batch_size=${bsz}", "shell variable"),
        ("data.train_batch_size=8", "rollout.name is not set"),
        ("actor_rollout_ref.rollout.name=hf", "rlsim models vllm and sglang"),
        ("--config-name=ppo_nonesuch actor_rollout_ref.rollout.name=vllm", "rlsim knows veRL's"),
    ],
)
def test_hydras_override_rules_and_bad_configs_are_one_sentence(tmp_path: Path, words: str, message: str) -> None:
    path = tmp_path / "run.overrides"
    path.write_text(words + "\n")
    with pytest.raises(RlsimError, match=message.replace("$", r"\$").replace("+", r"\+")):
        read_verl(path)


def test_overrides_add_delete_and_pick_the_megatron_defaults(tmp_path: Path) -> None:
    path = tmp_path / "run.overrides"
    path.write_text(
        "python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer \\\n"
        "  actor_rollout_ref.rollout.name=vllm trainer.nnodes=2 'data.train_batch_size=256'  # a comment\n"
        "  actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 ++actor_rollout_ref.actor.ppo_epochs=2\n"
        "  actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=2\n"
        "  +actor_rollout_ref.model.override_config.max_position_embeddings=4096 ~trainer.logger\n"
        "  actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full\n"
    )
    s = read_verl(path)
    assert (s.num_gpus, s.prompts_per_step, s.trainer.backend, s.trainer.tp) == (16, 256, "megatron", 4)
    assert (s.trainer.framework.recompute, s.trainer.framework.recompute_layers) == ("full", 2)
    cfg, _ = read_config(path)
    assert "logger" not in cfg["trainer"]
    assert cfg["actor_rollout_ref"]["model"]["override_config"]["max_position_embeddings"] == 4096
    assert any("ppo_epochs=2" in u for u in s.unmodelled)
    assert any("gae" in u for u in s.unmodelled)  # veRL's default estimator runs a critic


def test_a_model_path_names_a_known_model_by_its_last_part() -> None:
    assert known_model("/data/models/Qwen3-30B-A3B-Base") == "qwen3-30b-a3b"
    assert known_model("Qwen/Qwen2.5-7B-Instruct") == "qwen2.5-7b"
    assert known_model("~/models/deepseek-llm-7b-chat") is None


def test_simulate_from_a_config_and_its_clashes(tmp_path: Path) -> None:
    """simulate runs the config's own mode (here veRL's fully-async recipe) on --gpu, on the
    bundled trace's lengths; an option the config also sets, a missing --gpu, and a model the
    config cannot name are one sentence each."""
    args = ["simulate", "--from", f"verl:{MOE}", "--max-steps", "1"]
    r = runner.invoke(app, [*args, "--gpu", "h20", "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["policy"].startswith("fully_async(staleness_threshold=0.5")
    cluster, engine = config["ClusterConfig"], config["EngineConfig"]
    assert (cluster["num_gpus"], cluster["placement"], cluster["train_gpus"]) == (128, "disaggregated", 32)
    assert (engine["gpu_memory_utilization"], engine["enforce_eager"], config["RLConfig"]["use_kl_loss"]) == (
        0.7, True, True
    )
    assert "megatron(tp=2,ep=8,cp=2" in r.stderr
    for extra, message in (
        (["--gpu", "h20", "--gpus", "64"], "--gpus is set by --from"),
        (["--gpu", "h20", "--enforce-eager"], "--enforce-eager is set by --from"),
        (["--gpu", "h20", "--profile", "h100-qwen2.5-7b-tp1"], "--profile is set by --from"),
        ([], "needs --gpu"),
        (["--gpu", "h20", "--model", "qwen3-8b"], "the config's model.path names"),
    ):
        r = runner.invoke(app, [*args, *extra, "--out", str(tmp_path / "b")])
        assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.output, (extra, r.output)
    dense = ["simulate", "--from", f"verl:{DENSE}", "--gpu", "h20"]
    r = runner.invoke(app, [*dense, "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "give --model" in r.stderr, r.output
