"""A round-trip property test of the framework readers and writers (hypothesis): random valid
configs, drawn over the keys the readers map (the engine's limits, the layouts, the batch and its
mini-batches, the response cap and vLLM's max_model_len, the trainer's offload and recompute), are
read, written back as their framework's config (`rlsim.frameworks.emit`) and read again, and give
the same `RunSetup`, field by field except where it was read from."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlsim.frameworks.emit import nemo_rl_recipe, verl_overrides
from rlsim.frameworks.nemo_rl import read_nemo_rl
from rlsim.frameworks.verl import read_verl

NEMO_BASE = Path(__file__).resolve().parents[1] / "published_runs/nemo_rl/7ea279abf/examples/configs"


CASES = settings(max_examples=25, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
# a veRL config is read by composing veRL's Hydra config, about a second a read and two reads an example:
# ten examples (two minutes of CI for twenty-five)
VERL_CASES = settings(CASES, max_examples=10)


def _same(a, b) -> bool:  # noqa: ANN001
    return dataclasses.replace(a, source="", unmodelled=()) == dataclasses.replace(b, source="", unmodelled=())


@st.composite
def verl_configs(draw) -> str:  # noqa: ANN001
    """A veRL launch's overrides over veRL 0.7.0's synchronous trainer."""
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    prompts = draw(st.sampled_from([32, 64, 128, 512]))
    mini = draw(st.sampled_from([d for d in (8, 16, 32, 64, 128) if d <= prompts]))
    words = [
        "python3 -m verl.trainer.main_ppo", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct", "algorithm.adv_estimator=grpo",
        f"trainer.nnodes={draw(st.sampled_from([1, 2, 4]))}", "trainer.n_gpus_per_node=8",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
        f"actor_rollout_ref.rollout.n={draw(st.integers(1, 16))}",
        f"data.train_batch_size={prompts}", f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"data.max_response_length={draw(st.sampled_from([1024, 4096, 8192, 20480]))}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={draw(st.sampled_from([0.5, 0.6, 0.8, 0.9]))}",
        f"actor_rollout_ref.rollout.max_num_seqs={draw(st.sampled_from([256, 512, 1024]))}",
        f"actor_rollout_ref.rollout.max_num_batched_tokens={draw(st.sampled_from([8192, 16384, 32768]))}",
        f"actor_rollout_ref.rollout.enforce_eager={draw(st.booleans())}".lower(),
        f"actor_rollout_ref.actor.use_kl_loss={draw(st.booleans())}".lower(),
    ]  # fmt: skip
    if draw(st.booleans()):
        words.append(f"actor_rollout_ref.rollout.max_model_len={draw(st.sampled_from([9000, 24000]))}")
    if draw(st.booleans()):  # FSDP's offload and recompute
        words += [f"actor_rollout_ref.actor.fsdp_config.param_offload={draw(st.booleans())}".lower(),
                  f"actor_rollout_ref.model.enable_gradient_checkpointing={draw(st.booleans())}".lower()]  # fmt: skip
    return "\n".join(words) + "\n"


@VERL_CASES
@given(text=verl_configs())
def test_a_verl_config_reads_emits_and_reads_back_the_same_setup(tmp_path_factory, text: str) -> None:  # noqa: ANN001
    d = tmp_path_factory.mktemp("verl")
    (d / "in.overrides").write_text(text)
    first = read_verl(d / "in.overrides")
    (d / "out.overrides").write_text(verl_overrides(first))
    assert _same(read_verl(d / "out.overrides"), first), (text, verl_overrides(first))


@st.composite
def nemo_rl_recipes(draw) -> str:  # noqa: ANN001
    """A NeMo RL recipe over its GRPO base (grpo_math_1B.yaml), Megatron or DTensor."""
    prompts = draw(st.sampled_from([16, 32, 64]))
    generations = draw(st.sampled_from([4, 8, 16, 32]))
    samples = prompts * generations
    gbs = draw(st.sampled_from([g for g in (samples, samples // 2, samples // 4) if g >= 1]))
    megatron = draw(st.booleans())
    trainer = (
        "  megatron_cfg:\n    enabled: true\n    tensor_model_parallel_size: "
        f"{draw(st.sampled_from([1, 2, 4]))}\n    activation_checkpointing: {str(draw(st.booleans())).lower()}\n"
        "  dtensor_cfg:\n    enabled: false\n"
        if megatron else
        "  megatron_cfg:\n    enabled: false\n  dtensor_cfg:\n    enabled: true\n    tensor_parallel_size: 1\n"
        f"    cpu_offload: {str(draw(st.booleans())).lower()}\n"
    )  # fmt: skip
    length = draw(st.sampled_from([1024, 4096, 8192]))
    return (
        "defaults: grpo_math_1B.yaml\n"
        f"grpo:\n  num_prompts_per_step: {prompts}\n  num_generations_per_prompt: {generations}\n"
        f"cluster:\n  num_nodes: {draw(st.sampled_from([1, 2, 4]))}\n  gpus_per_node: 8\n"
        f"policy:\n  model_name: Qwen/Qwen2.5-7B-Instruct\n  train_global_batch_size: {gbs}\n"
        f"  max_total_sequence_length: {length}\n"
        "  sequence_packing:\n    enabled: false\n  dynamic_batching:\n    enabled: false\n"
        + trainer
        + f"  generation:\n    max_new_tokens: {length}\n    vllm_cfg:\n"
        f"      tensor_parallel_size: {draw(st.sampled_from([1, 2, 4]))}\n"
        f"      gpu_memory_utilization: {draw(st.sampled_from([0.5, 0.6, 0.8]))}\n"
        f"      enforce_eager: {str(draw(st.booleans())).lower()}\n"
    )


@CASES
@given(text=nemo_rl_recipes())
def test_a_nemo_rl_recipe_reads_emits_and_reads_back_the_same_setup(tmp_path_factory, text: str) -> None:  # noqa: ANN001
    d = tmp_path_factory.mktemp("nemo") / "examples" / "configs"
    d.mkdir(parents=True)
    (d / "grpo_math_1B.yaml").write_text((NEMO_BASE / "grpo_math_1B.yaml").read_text())
    (d / "in.yaml").write_text(text)
    first = read_nemo_rl(d / "in.yaml")
    (d / "out.yaml").write_text(nemo_rl_recipe(first))
    assert _same(read_nemo_rl(d / "out.yaml"), first), (text, nemo_rl_recipe(first))
