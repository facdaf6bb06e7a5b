"""`--from verl:CONFIG` (rlsim.frameworks.verl, rlsim.cli.from_config): veRL's published launch
scripts map to the setups the accuracy tables use, Hydra's override rules hold, a run's written
YAML reads as its overrides do, and an option the config also sets is one sentence."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.derive.train import Trainer
from rlsim.errors import RlsimError
from rlsim.framework_costs import FrameworkSettings
from rlsim.frameworks.verl import known_model, read_config, read_verl
from rlsim.package_data.nemo_rl import RECIPES as NEMO  # the recipes at each row's commit, with their chains
from rlsim.package_data.nemo_rl import TABLE_NOT_RECIPE  # rows whose published table states another layout
from tests.recorded_run import RUN, RUN_CONFIG, real_run_as_verl_metrics

DATA = Path(__file__).resolve().parents[1] / "published_runs" / "verl"
MOE = DATA / "grpo_30b_a3b_base_math_megatron_96_32.overrides"
DENSE = DATA / "dapo_7b_math_fsdp2_32_32.overrides"
runner = CliRunner()


def test_the_published_moe_script_is_the_setup_its_table_runs() -> None:
    """veRL's Qwen3-30B-A3B fully-async script (doctables/verl_phases.py runs its table from it):
    Megatron TP 2, CP 2, EP 8 with every offload, dynamic batch at 10,240 tokens, a KL loss; vLLM
    TP 4 at 0.7 with 10,240 batched tokens and eager mode; 96 rollout and 32 training GPUs;
    veRL's fully-async knobs as the script sets them."""
    s = read_verl(MOE)
    assert s.trainer == Trainer("megatron", tp=2, cp=2, ep=8, framework=FrameworkSettings(
        param_offload=True, grad_offload=True, optimizer_offload_fraction=1.0, ref_offload=True, max_token_len=10240,
        log_prob_max_token_len=10240, optimizer_steps=4))  # fmt: skip (mini-batches of 128 of its 512 prompts)
    e = s.engine
    assert (e.gpu_memory_utilization, e.max_num_batched_tokens, e.enforce_eager) == (0.7, 10240, True)
    assert (s.model, s.tp, s.max_response_len, s.samples_per_prompt, s.use_kl_loss) == ("qwen3-30b-a3b", 4, 8192, 16,
                                                                                          True)  # fmt: skip
    assert (s.num_gpus, s.placement, s.train_gpus) == (128, "disaggregated", 32)
    assert s.policy == (
        "fully_async(staleness_threshold=0.5,require_batches=1,trigger_parameter_sync_step=4,ppo_mini_batch_size=128,"
        "partial_rollout=true,use_rollout_log_probs=true,checkpoint_engine=true,device_buffer_size_M=4096)"
    )
    assert s.prompts_per_step == 128 * 1 * 4  # prompts between two parameter syncs
    assert s.unmodelled == ()


def test_the_published_dense_script_is_the_setup_its_table_runs() -> None:
    """veRL's DAPO Qwen2.5-Math-7B script (FSDP2, Ulysses 4, full recompute, dynamic batch at
    61,440 and 92,160 tokens, the reference offloaded; vLLM TP 4 at 0.8 with 30,720 batched
    tokens). The model path names a checkpoint rlsim knows only by its shape, so --model gives it."""
    s = read_verl(DENSE)
    assert s.trainer == Trainer("fsdp2", cp=4, framework=FrameworkSettings(
        recompute="full", max_token_len=61440, log_prob_max_token_len=92160, ref_offload=True,
        optimizer_steps=16))  # fmt: skip (mini-batches of 32 prompts: 4 required batches x 4 local steps)
    assert (s.engine.gpu_memory_utilization, s.engine.max_num_batched_tokens) == (0.8, 30720)
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
        # an override with no '=' was dropped, a +++ prefix read as +, an unknown entry point as ppo_trainer
        ("python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=vllm data.train_batch_size",
         "not an override"),
        ("actor_rollout_ref.rollout.name=vllm +++data.extra=1", "+, ++ and ~"),
        ("python3 -m verl.trainer.main_nonesuch actor_rollout_ref.rollout.name=vllm", "entry point"),
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
        (["--gpu", "h20", "--profile", "h100-qwen2.5-7b-tp1"], "not both"),
        (["--profile", "h100-qwen2.5-7b-tp1"], "the config's rollout runs at TP 4"),
        ([], "needs --gpu"),
        (["--gpu", "h20", "--model", "qwen3-8b"], "the config's model names"),
    ):
        r = runner.invoke(app, [*args, *extra, "--out", str(tmp_path / "b")])
        assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.output, (extra, r.output)
    dense = ["simulate", "--from", f"verl:{DENSE}", "--gpu", "h20"]
    r = runner.invoke(app, [*dense, "--out", str(tmp_path / "c")])
    assert r.exit_code == 2 and "give --model" in r.stderr, r.output


def _published_rows() -> list[dict]:
    import csv

    with (Path(__file__).resolve().parents[1] / "published_runs" / "rows.csv").open() as f:
        return [r for r in csv.DictReader(f) if r["recipe"]]


def test_every_published_nemo_rl_recipe_maps_to_its_row() -> None:
    """Each NeMo RL performance recipe of the accuracy tables (three releases; the recipe and its
    defaults chain at the row's commit, in published_runs/nemo_rl/) reads to the row's setup: GPUs and
    the generation's share, generation TP, samples, prompts, vLLM's memory fraction and eager
    mode, the KL term, the training layout, recompute and optimizer offload, the rollout's
    precision (the FP8 rows' vLLM weights; their KV cache stays bf16). Where the published
    table states another layout than its recipe, rows.csv keeps the table's, and the reader the
    recipe's (`TABLE_NOT_RECIPE`); a recipe whose model_name is a local path or a placeholder
    (DeepSeek-V3's) names no model, so --model gives it."""
    from rlsim.frameworks.nemo_rl import read_nemo_rl

    rows, seen = _published_rows(), set()
    assert len(rows) >= 40
    for r in rows:
        s = read_nemo_rl(NEMO / r["commit"] / r["recipe"])
        want = {"gpus": int(r["gpus"]), "gen_gpus": int(r["gen_gpus"]), "gen_tp": int(r["gen_tp"]),
                "samples": int(r["samples_per_prompt"]), "prompts": int(r["num_prompts_per_step"]),
                "util": float(r["gpu_memory_utilization"]), "kl": float(r["kl_penalty"]) > 0,
                "eager": r["enforce_eager"] == "True", "recompute": r["recompute"],
                "offload": float(r["optimizer_offload_fraction"] or 0), "tp": int(r["train_tp"]),
                "pp": int(r["train_pp"]), "ep": int(r["train_ep"]), "cp": int(r["train_cp"]),
                "max_new_tokens": int(r["max_new_tokens"])}  # fmt: skip
        got = {"gpus": s.num_gpus, "gen_gpus": s.num_gpus - s.train_gpus, "gen_tp": s.tp,
               "samples": s.samples_per_prompt, "prompts": s.prompts_per_step,
               "util": s.engine.gpu_memory_utilization, "kl": s.use_kl_loss, "eager": s.engine.enforce_eager,
               "recompute": s.trainer.framework.recompute, "offload": s.trainer.framework.optimizer_offload_fraction,
               "tp": s.trainer.tp, "pp": s.trainer.pp, "ep": s.trainer.ep, "cp": s.trainer.cp,
               "max_new_tokens": s.max_response_len}  # fmt: skip
        key = (r["release"], Path(r["recipe"]).name)
        differs = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
        assert differs == TABLE_NOT_RECIPE.get(key, {}), key
        assert s.model == (None if r["rlsim_model"] == "deepseek-v3" else r["rlsim_model"]), key
        fp8 = [u for u in s.unmodelled if u.startswith("policy.megatron_cfg.fp8_cfg.enabled")]
        assert len(fp8) == (r["precision"] == "fp8"), key  # the FP8 rows' recipes train in FP8: said, not modelled
        assert (s.dtype, s.kv_cache_dtype) == (r["precision"], "bf16"), key  # fp8 weights, the KV cache "auto": bf16
        assert s.policy == ("sync" if r["policy"] == "On policy" else "one_step_off" if r["policy"] == "1-step Off"
                            else f"k_step_off(k={r['policy'].split('-')[0]})") + (
            "+dynamic_sampling" if r["dynamic_sampling"] == "True" else ""), key  # fmt: skip
        seen.add(key)
    assert set(TABLE_NOT_RECIPE) <= seen


def test_nemo_rls_defaults_chain_and_override_marker(tmp_path: Path) -> None:
    """A recipe's parents merge before it, each from its own folder, and `_override_: true`
    replaces a parent's section instead of merging into it, as NeMo RL's loader does; its
    `${mul:...}` resolves."""
    from rlsim.frameworks.nemo_rl import read_config

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "root.yaml").write_text("a: {x: 1, y: 2}\nb: 3\nc: ${mul:${b}, 2}\n")
    (tmp_path / "child.yaml").write_text("defaults: base/root.yaml\na: {_override_: true, z: 9}\nb: 5\n")
    assert read_config(tmp_path / "child.yaml") == {"a": {"z": 9}, "b": 5, "c": 10}
    (tmp_path / "loop.yaml").write_text("defaults: loop.yaml\n")
    with pytest.raises(RlsimError, match="comes back to itself"):
        read_config(tmp_path / "loop.yaml")


@pytest.mark.parametrize(
    ("text", "shown"),
    [("a: 0\nb: ${div:1,${a}}\n", "b: ${div:1,${a}} does not resolve"),
     ("b: ${policy.nonesuch}\n", "b: ${policy.nonesuch} does not resolve")],
)
def test_a_nemo_rl_resolvers_error_shows_what_the_recipe_wrote(tmp_path: Path, text: str, shown: str) -> None:
    """A resolver that fails, or an interpolation that names no key, is one sentence showing the key
    and its value as the recipe wrote it (the input), not what it resolved to."""
    from rlsim.frameworks.nemo_rl import read_config

    (tmp_path / "r.yaml").write_text(text)
    with pytest.raises(RlsimError) as err:
        read_config(tmp_path / "r.yaml")
    assert shown in str(err.value) and "\n" not in str(err.value)


def test_simulate_from_a_nemo_rl_recipe(tmp_path: Path) -> None:
    """NeMo RL leaves max_num_seqs and max_num_batched_tokens to vLLM: the run takes vLLM's
    LLM-class defaults on its GPU (1,024 and 16,384 on an H100)."""
    from rlsim.trace.format import save
    from rlsim.trace.synth import SynthConfig, synthesize

    recipe = NEMO / "7ea279abf/examples/configs/recipes/llm/performance/grpo-qwen3-30ba3b-4n8g-async-1off.yaml"
    cfg = SynthConfig(preset="dapo-qwen2.5-32b", num_prompts=128, samples_per_prompt=32, epochs=1, prompts_per_step=64,
                      max_response_len=4096)  # fmt: skip
    trace = save(synthesize(cfg), tmp_path / "t.parquet")
    r = runner.invoke(app, ["simulate", "--from", f"nemo-rl:{recipe}", "--gpu", "h100", "--max-steps", "1",
                            "--trace", str(trace), "--out", str(tmp_path / "a")])  # fmt: skip
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["policy"] == "one_step_off"
    assert (config["EngineConfig"]["max_num_seqs"], config["EngineConfig"]["max_num_batched_tokens"]) == (1024, 16384)
    assert config["ClusterConfig"]["train_gpus"] == 16


def test_a_profile_is_derived_at_the_memory_fraction_the_run_gives_vllm(tmp_path: Path) -> None:
    """DeepSeek-V3 at TP 32 on H100s holds 41.9 GB of weights a GPU: more than veRL's default
    0.5 of 80 GB, less than the 0.6 NeMo RL's recipe gives vLLM. The weights are held against
    the run's fraction (the config's, else --gpu-memory-utilization), not against the default's."""
    from rlsim.trace.format import save
    from rlsim.trace.synth import SynthConfig, synthesize

    cfg = SynthConfig(preset="dapo-qwen2.5-32b", num_prompts=32, samples_per_prompt=16, epochs=1, prompts_per_step=32,
                      max_response_len=1536)  # fmt: skip
    trace = str(save(synthesize(cfg), tmp_path / "t.parquet"))
    recipe = NEMO / "9dbd9adc9/examples/configs/recipes/llm/performance/grpo-deepseek-v3-32n8g.yaml"
    r = runner.invoke(app, ["simulate", "--from", f"nemo-rl:{recipe}", "--gpu", "h100", "--model", "deepseek-v3",
                            "--max-steps", "1", "--trace", trace, "--out", str(tmp_path / "a")])  # fmt: skip
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["EngineConfig"]["gpu_memory_utilization"] == 0.6  # the recipe's defaults chain
    derived = ["--model", "deepseek-v3", "--gpu", "h100", "--tp", "32", "--gpus", "32", "--max-steps", "1",
               "--trace", trace, "--policies", "sync"]  # fmt: skip
    r = runner.invoke(app, ["compare", *derived, "--gpu-memory-utilization", "0.6"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["compare", *derived])  # veRL's default 0.5: the weights do not fit, one sentence
    assert r.exit_code == 2 and "more than gpu_memory_utilization 0.5" in r.output, r.output
    plan = ["plan", *derived[:8], "--gpus", "32", "--gpu-memory-utilization", "0.6,0.7", "--gpu-budget", "32",
            "--steps", "1", "--min-steps", "1", "--max-response-len", "1536", "--prompts-per-step", "32", "--trace",
            trace, "--policies", "sync"]  # fmt: skip
    r = runner.invoke(app, plan)  # the family derived at the least fraction searched
    assert r.exit_code == 0, r.output



def test_a_recipes_vllm_kwargs_and_precision_are_the_runs(tmp_path: Path) -> None:
    """What a recipe passes vLLM itself stands over vLLM's defaults: NeMo RL's DeepSeek-V3 FP8
    recipe runs at max_num_seqs 32 with fp8 weights and a bf16 KV cache (`kv_cache_dtype` auto), so
    it simulates as read, and --dtype beside it is one sentence; CUDA graphs captured only up to a
    batch size are said, not modelled."""
    from rlsim.frameworks.nemo_rl import read_nemo_rl
    from rlsim.trace.format import save
    from rlsim.trace.synth import SynthConfig, synthesize

    recipe = NEMO / "7ea279abf/examples/configs/recipes/llm/performance/grpo-deepseek-v3-64n8g-fp8-async-1off.yaml"
    s = read_nemo_rl(recipe)
    assert (s.engine.max_num_seqs, s.engine.max_num_batched_tokens, s.dtype, s.kv_cache_dtype) == (32, None, "fp8",
                                                                                                   "bf16")  # fmt: skip
    assert "max_num_seqs" in s.engine_keys and s.engine_for(80e9, "H100").max_num_batched_tokens == 16384
    graphs = read_nemo_rl(NEMO / "7ea279abf/examples/configs/recipes/llm/performance/grpo-qwen3-235b-16n4g.yaml")
    assert any("cudagraph_capture_sizes up to 64" in u for u in graphs.unmodelled)
    cfg = SynthConfig(preset="dapo-qwen2.5-32b", num_prompts=64, samples_per_prompt=16, epochs=1, prompts_per_step=32,
                      max_response_len=1536)  # fmt: skip
    trace = str(save(synthesize(cfg), tmp_path / "t.parquet"))
    args = ["simulate", "--from", f"nemo-rl:{recipe}", "--gpu", "h100", "--model", "deepseek-v3", "--max-steps", "2",
            "--trace", trace]  # fmt: skip
    r = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["EngineConfig"]["max_num_seqs"] == 32
    assert "-fp8" in config["ClusterConfig"]["profile"]
    r = runner.invoke(app, [*args, "--dtype", "bf16", "--out", str(tmp_path / "b")])
    assert r.exit_code == 2 and "--dtype is set by --from" in r.output, r.output


def test_fp8_weights_read_and_written_by_both_frameworks(tmp_path: Path) -> None:
    """veRL's `rollout.quantization=fp8` (vLLM's fp8 weights, the KV cache bf16) reads as NeMo RL's
    `precision: fp8` does; a plan's fp8 profile is written back as each framework states it."""
    from rlsim.derive.derive import derive_profile, setup
    from rlsim.frameworks.emit import candidate_setup, nemo_rl_recipe, verl_overrides
    from rlsim.profile import profile_from_dict

    path = tmp_path / "run.overrides"
    path.write_text(
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=vllm data.train_batch_size=64\n"
        "actor_rollout_ref.actor.ppo_mini_batch_size=64\n"
        "  actor_rollout_ref.rollout.quantization=fp8 actor_rollout_ref.model.path=Qwen/Qwen3-32B\n"
    )
    s = read_verl(path)
    assert (s.dtype, s.kv_cache_dtype, s.options()["dtype"]) == ("fp8", "bf16", "fp8")
    assert read_verl(DENSE).dtype is None  # no quantization: the command line's --dtype
    prof = profile_from_dict(derive_profile(setup("qwen3-32b", "h100", 4, dtype="fp8", kv_cache_dtype="bf16")), "p")
    planned = candidate_setup("sync", 8, "colocated", 0, prof, prof.engine, 64, 8, 4096)
    assert (planned.dtype, planned.kv_cache_dtype) == ("fp8", "bf16")
    assert "actor_rollout_ref.rollout.quantization=fp8" in verl_overrides(planned)
    assert "precision: fp8" in nemo_rl_recipe(planned) and "kv_cache_dtype" not in nemo_rl_recipe(planned)

def test_validate_a_run_against_its_own_config_phase_by_phase(tmp_path: Path) -> None:
    """`rlsim validate --from verl:CONFIG --metrics FILE`: the config's run (here rlsim's own
    real run of the tiny model, described as veRL describes a run, on the run's measured profile)
    against its logged phases. On the run's own lengths (--trace) the response length is exact and
    the generation within 5% of the engine's measured seconds (the training phases of this run were
    modelled from the same profile, so they agree by construction); without --trace the output
    names its stand-in."""
    config, metrics = tmp_path / "run.overrides", real_run_as_verl_metrics(tmp_path)
    config.write_text(RUN_CONFIG)
    base = ["validate", "--from", f"verl:{config}", "--metrics", str(metrics), "--profile", str(RUN / "profile.json")]
    r = runner.invoke(app, [*base, "--trace", str(RUN / "run-sync" / "recorded_trace.parquet"), "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    rows = {row["metric"]: row for row in res["rows"]}
    assert set(rows) == {"timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor",
                         "timing_s/update_weights", "timing_s/step", "response_length/mean"}  # fmt: skip
    assert res["steps"] == 8 and res["stand_in"] is None
    assert rows["response_length/mean"]["diff_pct"] == pytest.approx(0.0, abs=1e-9)
    assert abs(rows["timing_s/gen"]["diff_pct"]) < 5
    r = runner.invoke(app, base)
    assert r.exit_code == 0 and "standing in for the log's mean response" in " ".join(r.stdout.split()), r.output
    for extra, message in ((["--policy", "sortedrl"], "--policy is set by --from"),
                           (["--trace", str(metrics), "--log", str(metrics)], "once")):  # fmt: skip
        r = runner.invoke(app, [*base, *extra])
        assert r.exit_code == 2 and message in r.stderr, (extra, r.output)
    r = runner.invoke(app, ["validate", "--metrics", str(metrics)])
    assert r.exit_code == 2 and "go with --from" in r.stderr, r.output


def test_validate_reaches_a_logs_mean_at_08_of_its_cap_and_its_clip_share(tmp_path: Path) -> None:
    """A log whose mean response is 0.8 of its cap (2,048 here) with 40% of responses at the cap:
    the stand-in reaches both (the old fixed bound on its scale fell short of such means without a
    word), and the output names its scale and its share at the cap."""
    config, metrics = tmp_path / "run.overrides", real_run_as_verl_metrics(tmp_path)
    config.write_text(RUN_CONFIG)
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    for rec in lines:
        rec["data"] |= {"response_length/mean": 0.8 * 2048, "response_length/clip_ratio": 0.4}
    metrics.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    r = runner.invoke(app, ["validate", "--from", f"verl:{config}", "--metrics", str(metrics), "--profile",
                            str(RUN / "profile.json"), "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    row = {x["metric"]: x for x in res["rows"]}["response_length/mean"]
    assert row["real"] == pytest.approx(1638.4) and row["sim"] == pytest.approx(1638.4, rel=0.01)
    assert "40.0% of responses at the cap 2,048 (the log's 40.0%)" in res["stand_in"] or "(the log's 40.0%)" in res[
        "stand_in"], res["stand_in"]  # fmt: skip


def test_an_emitted_config_reads_back_as_the_same_setup(tmp_path: Path) -> None:
    """`--emit`'s writers round-trip: every published veRL script and NeMo RL recipe, read, written
    back as its framework's config and read again, is the same setup (a NeMo RL recipe is saved in
    examples/configs/, beside NeMo RL's grpo_math_1B.yaml its defaults name)."""
    from rlsim.frameworks.emit import nemo_rl_recipe, verl_overrides
    from rlsim.frameworks.nemo_rl import read_nemo_rl

    def same(a, b) -> bool:  # noqa: ANN001
        return dataclasses.replace(a, source="", unmodelled=()) == dataclasses.replace(b, source="", unmodelled=())

    for script in (MOE, DENSE):
        s = read_verl(script)
        path = tmp_path / script.name
        path.write_text(verl_overrides(s))
        assert same(read_verl(path), s), script.name
    for r in _published_rows():
        s = read_nemo_rl(NEMO / r["commit"] / r["recipe"])
        configs = tmp_path / r["commit"] / "examples" / "configs"
        if not configs.exists():
            configs.mkdir(parents=True)
            base = NEMO / r["commit"] / "examples" / "configs" / "grpo_math_1B.yaml"
            (configs / "grpo_math_1B.yaml").write_text(base.read_text())
        path = configs / "emitted.yaml"
        path.write_text(nemo_rl_recipe(s))
        assert same(read_nemo_rl(path), s), r["recipe"]


def test_emit_refuses_a_policy_the_framework_cannot_run() -> None:
    """A policy the framework cannot run is one sentence naming the closest one it can."""
    from rlsim.frameworks.emit import nemo_rl_recipe, verl_overrides

    s = read_verl(MOE)
    with pytest.raises(RlsimError, match="not rollpacker: the closest it runs is sync"):
        verl_overrides(dataclasses.replace(s, policy="rollpacker"))
    with pytest.raises(RlsimError, match="not async_partial: the closest it runs is fully_async"):
        verl_overrides(dataclasses.replace(s, policy="async_partial"))
    with pytest.raises(RlsimError, match="NeMo RL runs sync, one_step_off and k_step_off, not fully_async"):
        nemo_rl_recipe(s)
    with pytest.raises(RlsimError, match="synchronous trainer is colocated"):
        verl_overrides(dataclasses.replace(s, policy="sync"))


def test_plan_from_a_config_searches_only_the_axes_named(tmp_path: Path, small_trace_path: Path) -> None:
    """`plan --from`: the GPU counts named on the command line are searched; every other axis is
    the config's one value (TP, placement, memory fraction, cap, policy), and its batch is held."""
    config = tmp_path / "run.overrides"
    config.write_text(
        "actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=1\n"
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6 data.train_batch_size=16\n"
        "actor_rollout_ref.actor.ppo_mini_batch_size=16\n"
        "actor_rollout_ref.rollout.n=4\n"
        "data.max_response_length=2048 actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n"
        "algorithm.adv_estimator=grpo\n"
    )
    args = ["plan", "--from", f"verl:{config}", "--gpu", "h100", "--gpu-budget", "8", "--trace",
            str(small_trace_path), "--gpus", "4,8", "--steps", "2", "--min-steps", "1", "--seeds", "1", "--workers",
            "2", "--no-cache"]  # fmt: skip
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert {row["num_gpus"] for row in rows} == {4, 8}
    assert {(row["policy"], row["tp"], row["placement"], row["max_response_len"], row["gpu_memory_utilization"])
            for row in rows} == {("sync", 1, "colocated", 2048, 0.6)}  # fmt: skip
    r = runner.invoke(app, [*args, "--prompts-per-step", "8"])
    assert r.exit_code == 2 and "--prompts-per-step is set by --from" in r.stderr, r.output
    # a profile of the user's own: its family is searched at the config's TP, nothing derived
    own = [a for a in args if a not in ("--gpu", "h100")] + ["--profile", "h100-qwen2.5-7b-tp1", "--json"]
    r = runner.invoke(app, own)
    assert r.exit_code == 0, r.output
    assert {row["profile"] for row in json.loads(r.stdout)["rows"]} == {"h100-qwen2.5-7b-tp1"}


def test_optimizer_steps_and_the_model_length_are_read_as_the_frameworks_mean_them(tmp_path: Path) -> None:
    """veRL: train_batch_size / ppo_mini_batch_size x ppo_epochs AdamW steps a step (and
    rollout.max_model_len where set); NeMo RL: samples / train_global_batch_size, and vLLM's
    max_model_len (the recipe's max_total_sequence_length). A batch smaller than its mini-batch is
    refused in one sentence, as veRL refuses it without dynamic batch size."""
    from rlsim.frameworks.nemo_rl import read_nemo_rl

    base = ("python3 -m verl.trainer.main_ppo\nactor_rollout_ref.rollout.name=vllm\n"
            "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B\n")  # fmt: skip
    for extra, steps, model_len in (("data.train_batch_size=1024\nactor_rollout_ref.actor.ppo_mini_batch_size=256\n", 4,
                                     None),
                                    ("data.train_batch_size=512\nactor_rollout_ref.actor.ppo_mini_batch_size=64\n"
                                     "actor_rollout_ref.actor.ppo_epochs=2\nactor_rollout_ref.rollout.max_model_len=9000\n",
                                     16, 9000)):  # fmt: skip
        path = tmp_path / "run.overrides"
        path.write_text(base + extra)
        s = read_verl(path)
        assert (s.trainer.framework.optimizer_steps, s.max_model_len) == (steps, model_len)
    path.write_text(base + "data.train_batch_size=500\nactor_rollout_ref.actor.ppo_mini_batch_size=64\n")
    assert read_verl(path).trainer.framework.optimizer_steps == 8  # seven of 64 and a last one of 52
    path.write_text(base + "data.train_batch_size=32\nactor_rollout_ref.actor.ppo_mini_batch_size=64\n")
    with pytest.raises(RlsimError, match="data.train_batch_size 32 is smaller than"):
        read_verl(path)
    recipe = NEMO / "9dbd9adc9/examples/configs/recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g.yaml"
    s = read_nemo_rl(recipe)
    assert (s.prompts_per_step * s.samples_per_prompt, s.trainer.framework.optimizer_steps) == (2048, 4)
    assert (s.max_response_len, s.max_model_len) == (4096, 4096)


def test_a_trace_capped_at_the_model_length_runs_under_its_nemo_rl_recipe(tmp_path: Path) -> None:
    """NeMo RL's recipes set max_new_tokens to the model length (4,096 here) and vLLM caps prompt
    plus response at max_model_len: a trace capped there, 4,096 less its 102-token prompts, runs
    under the recipe (it was refused: "max_response_len=4096 exceeds the trace's cap 3994"), and
    every response stays within the model length."""
    import numpy as np
    import pandas as pd

    from rlsim.trace.format import save
    from rlsim.trace.synth import SynthConfig, synthesize

    prompts = pd.DataFrame({"prompt_id": np.arange(128), "num_prompt_tokens": np.full(128, 102)})
    cfg = SynthConfig(preset="dapo-qwen2.5-32b", num_prompts=128, samples_per_prompt=32, epochs=1, prompts_per_step=64,
                      max_response_len=4096 - 102, length_scale=3.0)  # fmt: skip
    trace = save(synthesize(cfg, prompts), tmp_path / "t.parquet")
    recipe = NEMO / "7ea279abf/examples/configs/recipes/llm/performance/grpo-qwen3-30ba3b-4n8g.yaml"
    r = runner.invoke(app, ["simulate", "--from", f"nemo-rl:{recipe}", "--gpu", "h100", "--max-steps", "1",
                            "--trace", str(trace), "--out", str(tmp_path / "a")])  # fmt: skip
    assert r.exit_code == 0, r.output
    req = pd.read_parquet(tmp_path / "a" / "requests.parquet")
    assert (req.num_output_tokens + req.num_prompt_tokens <= 4096).all() and (req.num_output_tokens == 3994).any()


@pytest.mark.parametrize("framework", ["verl", "nemo-rl"])
def test_a_config_that_cannot_be_read_is_one_sentence(tmp_path: Path, framework: str) -> None:
    """A directory, a file of non-UTF-8 bytes and a YAML file with a key written twice at one level
    exit 2 in one sentence naming the file and what is wrong (the second key used to win without a
    word, and the bytes ended in a UnicodeDecodeError traceback)."""
    from typer.testing import CliRunner

    bad_bytes = tmp_path / "latin1.yaml"
    bad_bytes.write_bytes("policy:\n  model_name: caf\xe9\n".encode("latin-1"))
    twice = tmp_path / "twice.yaml"
    twice.write_text("grpo:\n  num_prompts_per_step: 64\ngrpo:\n  num_prompts_per_step: 32\n")
    for path, message in ((tmp_path, "is a directory"), (bad_bytes, "is not UTF-8 text"),
                          (twice, "key 'grpo' twice")):  # fmt: skip
        r = CliRunner().invoke(app, ["simulate", "--from", f"{framework}:{path}", "--gpu", "h100",
                                     "--out", str(tmp_path / "o")])  # fmt: skip
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and message in lines[0], (path.name, r.output)


def test_nemo_rl_async_grpo_without_age_is_refused(tmp_path: Path) -> None:
    """`async_grpo` with `max_trajectory_age_steps: 0` was read as one step off (`or 1`); a
    trajectory no step old is no asynchrony NeMo RL runs, so it is refused in one sentence naming
    the key."""
    from rlsim.frameworks.nemo_rl import read_nemo_rl

    parent = NEMO / "7ea279abf/examples/configs/recipes/llm/performance/grpo-qwen3-30ba3b-4n8g-async-1off.yaml"
    recipe = tmp_path / "zero_age.yaml"  # its parent named by its absolute path, as NeMo RL's loader allows
    recipe.write_text(f"defaults: {parent}\ngrpo:\n  async_grpo:\n    max_trajectory_age_steps: 0\n")
    with pytest.raises(RlsimError, match="max_trajectory_age_steps 0"):
        read_nemo_rl(recipe)


def test_from_or_emit_given_twice_is_refused(tmp_path: Path) -> None:
    """`--from` (or plan's `--emit`) given twice kept the last one without a word, even across
    frameworks; now every command that takes it refuses in one sentence naming both."""
    from typer.testing import CliRunner

    a, b = f"verl:{DENSE}", f"nemo-rl:{NEMO / '7ea279abf/examples/configs/grpo_math_1B.yaml'}"
    for cmd in (["simulate", "--out", str(tmp_path / "o")], ["compare"], ["plan"],
                ["validate", "--metrics", str(tmp_path / "m.jsonl")]):  # fmt: skip
        r = CliRunner().invoke(app, [*cmd, "--from", a, "--from", b, "--gpu", "h100"])
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and "--from given twice" in lines[0], (cmd, r.output)
    r = CliRunner().invoke(app, ["plan", "--emit", f"verl:{tmp_path / 'a'}", "--emit", f"verl:{tmp_path / 'b'}"])
    assert r.exit_code == 2 and "--emit given twice" in r.stderr, r.output


def test_an_omegaconf_interpolation_in_an_override_is_read_not_called_a_shell_variable(tmp_path: Path) -> None:
    """Hydra's overrides take OmegaConf interpolations: `${data.train_batch_size}` resolves; one
    that names no key, or a cycle, is one sentence naming the interpolation (it used to be called a
    shell variable); `$NAME` is still a shell variable to expand first."""
    base = "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=vllm data.train_batch_size=64\n"
    path = tmp_path / "run.overrides"
    path.write_text(base + "actor_rollout_ref.actor.ppo_mini_batch_size=${data.train_batch_size}\n")
    assert read_verl(path).trainer.framework.optimizer_steps == 1
    for extra, message in (("actor_rollout_ref.actor.ppo_mini_batch_size=${nonesuch.key}", "does not resolve"),
                           ("+x.a=${x.b} +x.b=${x.a}", "does not resolve"),
                           ("actor_rollout_ref.actor.ppo_mini_batch_size=$BSZ", "shell variable")):  # fmt: skip
        path.write_text(base + extra + "\n")
        with pytest.raises(RlsimError, match=message) as exc:
            read_verl(path)
        assert "\n" not in str(exc.value) and "${" in str(exc.value) or "$BSZ" in str(exc.value)


def test_emit_names_the_model_as_the_framework_would_load_it() -> None:
    """A planned configuration is written with the model as its framework loads it: the input's
    path (a `--from` config's), else the Hugging Face id `models.json` gives; a model with neither
    is refused in one sentence rather than written as rlsim's short name."""
    from rlsim.frameworks.emit import candidate_setup, nemo_rl_recipe, verl_overrides
    from rlsim.profile import load_profile

    prof = load_profile("h100-qwen2.5-7b-tp1")
    args = ("sync", 8, "colocated", 0, prof, prof.engine, 16, 4, 2048)
    named = candidate_setup(*args)
    assert named.model_path == "Qwen/Qwen2.5-7B-Instruct" and "model_name: Qwen/Qwen2.5-7B-Instruct" in nemo_rl_recipe(
        named)  # fmt: skip
    assert candidate_setup(*args, model_path="/ckpt/my-7b").model_path == "/ckpt/my-7b"
    unknown = dataclasses.replace(prof, model="my-own-7b")
    with pytest.raises(RlsimError, match="no Hugging Face id"):
        verl_overrides(candidate_setup("sync", 8, "colocated", 0, unknown, prof.engine, 16, 4, 2048))


def test_plan_from_a_nemo_rl_recipe_plans_vllms_own_limits(tmp_path: Path) -> None:
    """NeMo RL leaves max_num_seqs and max_num_batched_tokens to vLLM: `plan --from` searches and
    writes vLLM's LLM-class limits on the GPU (1,024 and 16,384 on an H100), as `simulate --from`
    runs them; it planned the profile's 1,024 and 8,192 before."""
    from rlsim.frameworks.nemo_rl import read_nemo_rl
    from rlsim.trace.format import save
    from rlsim.trace.synth import SynthConfig, synthesize

    small_trace_path = save(synthesize(SynthConfig(num_prompts=64, samples_per_prompt=32, epochs=1, prompts_per_step=64,
                                                   max_response_len=512, length_scale=0.2)), tmp_path / "t.parquet")
    recipe = NEMO / "9dbd9adc9/examples/configs/recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g.yaml"
    args = ["plan", "--from", f"nemo-rl:{recipe}", "--gpu", "h100", "--gpu-budget", "16", "--trace",
            str(small_trace_path), "--max-response-len", "512", "--steps", "1", "--min-steps", "1", "--seeds", "1",
            "--workers", "1", "--no-cache", "--json"]  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    best = json.loads(r.stdout)["best"]
    assert best["max_num_seqs"] == 1024 and best["engine"]["max_num_batched_tokens"] == 16384
    configs = tmp_path / "examples" / "configs"
    configs.mkdir(parents=True)
    (configs / "grpo_math_1B.yaml").write_text((NEMO / "9dbd9adc9/examples/configs/grpo_math_1B.yaml").read_text())
    r = runner.invoke(app, [*args[:-1], "--emit", f"nemo-rl:{configs / 'best.yaml'}"])
    assert r.exit_code == 0, r.output
    back = read_nemo_rl(configs / "best.yaml")
    assert (back.engine.max_num_seqs, back.engine.max_num_batched_tokens) == (1024, 16384)
    assert back.max_model_len == 4096  # the recipe's vllm_cfg.max_model_len (plan wrote null)


def test_vllms_limits_are_not_laid_over_an_sglang_recipe(tmp_path: Path) -> None:
    """A NeMo RL recipe generating with SGLang leaves its limits to SGLang's own rules: vLLM's
    LLM-class defaults (1,024 sequences, 16,384 batched tokens on an H100) are vLLM's, and were
    laid over SGLang runs too."""
    from rlsim.frameworks.nemo_rl import read_nemo_rl

    parent = NEMO / "9dbd9adc9/examples/configs/recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g.yaml"
    recipe = tmp_path / "sglang.yaml"
    recipe.write_text(f"defaults: {parent}\npolicy:\n  generation:\n    backend: sglang\n")
    s = read_nemo_rl(recipe)
    engine = s.engine_for(80 * 2**30, "NVIDIA H100 SXM")
    assert engine.rollout_engine == "sglang" and (engine.max_num_seqs, engine.max_num_batched_tokens) == (None, None)
    vllm = read_nemo_rl(parent).engine_for(80 * 2**30, "NVIDIA H100 SXM")
    assert (vllm.max_num_seqs, vllm.max_num_batched_tokens) == (1024, 16384)


def test_a_metrics_file_that_is_not_there_is_named_by_the_option_typed(tmp_path: Path) -> None:
    """`validate --from ... --metrics FILE` names `--metrics` when FILE is missing (it said
    `--verl-metrics`, the other command form's option)."""
    from typer.testing import CliRunner

    config = tmp_path / "run.overrides"
    config.write_text(RUN_CONFIG)
    r = CliRunner().invoke(app, ["validate", "--from", f"verl:{config}", "--metrics", str(tmp_path / "none.jsonl"),
                                 "--profile", str(RUN / "profile.json")])  # fmt: skip
    assert r.exit_code == 2 and "--metrics" in r.stderr and "--verl-metrics" not in r.stderr, r.output


def test_a_partial_yaml_with_a_key_veRL_lacks_is_refused(tmp_path: Path) -> None:
    """A partial veRL YAML is merged over the defaults in struct mode, as Hydra merges a config: a
    typo'd key (`tensor_model_paralel_size`) or an unknown top-level section is one sentence naming
    it, where it was ignored (while the same typo as an override was refused)."""
    for raw, key in (({"actor_rollout_ref": {"rollout": {"name": "vllm", "tensor_model_paralel_size": 4}}},
                      "actor_rollout_ref.rollout.tensor_model_paralel_size"),
                     ({"actor_rollout_ref": {"rollout": {"name": "vllm"}}, "my_section": {"a": 1}},
                      "my_section")):  # fmt: skip
        path = tmp_path / "partial.yaml"
        path.write_text(yaml.safe_dump(raw))
        with pytest.raises(RlsimError, match=f"{key} is not a key of veRL 0.7.0's config") as exc:
            read_verl(path)
        assert "\n" not in str(exc.value)
