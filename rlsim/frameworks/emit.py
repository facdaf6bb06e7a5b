"""`rlsim plan --emit verl|nemo-rl`: a `RunSetup` written back as its framework's config, so that
the answer can be run; read back (`rlsim.frameworks.verl`, `rlsim.frameworks.nemo_rl`) it gives the
same setup (`tests/test_from_config.py` holds the round trip for every published config).

- veRL: the overrides of a launch, one to a line, after the entry point the mode needs
  (`verl.trainer.main_ppo`; the `one_step_off_policy` or `fully_async_policy` recipe), with
  `--config-name` naming the Megatron configs where the trainer is Megatron. A key veRL 0.7.0's
  composed config lacks is added with `+`, as Hydra wants.
- NeMo RL: a recipe whose `defaults:` is NeMo RL's GRPO base (`grpo_math_1B.yaml`, beside which it
  is to be saved, in `examples/configs/`), setting every key the reader maps.

A policy the framework cannot run is refused in one sentence naming the closest one it can.
Nodes are of `GPUS_PER_NODE` GPUs (fewer GPUs: one node of them).
"""

from __future__ import annotations

import re

import yaml

from policies.registry import parse_policy
from rlsim.config import EngineConfig
from rlsim.derive.models import shipped_models
from rlsim.derive.train import Trainer
from rlsim.errors import RlsimError
from rlsim.frameworks.keys import has as _has
from rlsim.frameworks.run_setup import RunSetup
from rlsim.frameworks.verl import ARR, default_config
from rlsim.profile import Profile
from rlsim.step_costs import with_engine

GPUS_PER_NODE = 8
# the closest mode each framework runs, for a policy it does not
VERL_CLOSEST = {"async_partial": "fully_async", "areal": "fully_async", "k_step_off": "fully_async"}
NEMO_RL_CLOSEST = {"fully_async": "k_step_off", "async_partial": "k_step_off", "areal": "k_step_off"}
NEMO_RL_BASE = "grpo_math_1B.yaml"


def candidate_setup(
    policy: str,
    num_gpus: int,
    placement: str,
    train_gpus: int,
    profile: Profile,
    engine: EngineConfig,
    prompts_per_step: int,
    samples_per_prompt: int,
    max_response_len: int,
    use_kl_loss: bool = False,
    model_path: str | None = None,
    max_model_len: int | None = None,
) -> RunSetup:
    """A planned configuration as a `RunSetup`: its engine laid over the profile's (every setting
    concrete), the trainer the profile's train block states, the rollout's EP from its derived name,
    and the model as its framework would load it: `model_path` (the input's: a `--from` config's,
    or `--model`'s folder), else its Hugging Face id in `models.json`, else none (the writers refuse);
    `max_model_len`, vLLM's cap on prompt plus response, where the run sets one."""
    merged = with_engine(profile, engine).engine
    tc = profile.train
    trainer = Trainer(tc.backend or "fsdp2", tp=tc.tp, pp=tc.pp, ep=tc.ep, cp=tc.cp, framework=tc.framework)
    m = re.search(r"-ep(\d+)", profile.name)
    facts = profile.model_facts or {}
    dtypes = {}  # the weights' and KV cache's, where the profile was derived (its facts say)
    if "dtype_bytes" in facts:
        kv = facts.get("kv_dtype_bytes", facts["dtype_bytes"])
        weights = "fp8" if facts["dtype_bytes"] == 1 else "bf16"
        dtypes = {"dtype": weights, "kv_cache_dtype": "fp8" if kv == 1 else "bf16"}
    return RunSetup(
        framework="rlsim", source=f"rlsim plan ({profile.name})", model=profile.model,
        num_gpus=num_gpus, placement=placement, train_gpus=train_gpus, tp=profile.tensor_parallel_size,
        pp=profile.pipeline_parallel_size, ep=int(m.group(1)) if m else 1, dp=profile.data_parallel_size,
        engine=merged, trainer=trainer, policy=policy, prompts_per_step=prompts_per_step,
        model_path=model_path or str(shipped_models().get(profile.model, {}).get("source") or ""),
        samples_per_prompt=samples_per_prompt, max_response_len=max_response_len, use_kl_loss=use_kl_loss,
        max_model_len=max_model_len, **dtypes,
    )  # fmt: skip


def _model_path(setup: RunSetup) -> str:
    """The model as the framework loads it, or one sentence where the setup names none."""
    if not setup.model_path:
        raise RlsimError(
            f"--emit: the model {setup.model!r} has no Hugging Face id rlsim knows (models.json) and no path was "
            "given: give --model PATH (the checkpoint's folder, with its config.json) or --from the run's config"
        )
    return setup.model_path


def emit(framework: str, setup: RunSetup) -> str:
    """`setup` as `framework`'s config text (verl: launch overrides; nemo-rl: a recipe)."""
    if framework == "verl":
        return verl_overrides(setup)
    if framework == "nemo-rl":
        return nemo_rl_recipe(setup)
    raise RlsimError(f"--emit {framework}: rlsim writes verl and nemo-rl configs")


def _nodes(gpus: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of a pool."""
    if gpus <= GPUS_PER_NODE:
        return 1, gpus
    if gpus % GPUS_PER_NODE:
        raise RlsimError(f"{gpus} GPUs are not whole nodes of {GPUS_PER_NODE}: the framework places pools by node")
    return gpus // GPUS_PER_NODE, GPUS_PER_NODE


def _value(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _refuse(framework: str, policy: str, closest: dict[str, str]) -> None:
    name = parse_policy(policy).name
    near = closest.get(name, "sync")
    runs = "sync, one_step_off and fully_async" if framework == "veRL" else "sync, one_step_off and k_step_off"
    raise RlsimError(f"{framework} runs {runs}, not {name}: the closest it runs is {near}")


def verl_overrides(setup: RunSetup) -> str:
    """The launch overrides of `setup` under veRL 0.7.0."""
    spec = parse_policy(setup.policy)
    if spec.dynamic_sampling is not None:
        raise RlsimError("DAPO's dynamic sampling is not written for veRL yet (its algorithm.filter_groups)")
    if spec.histospec is not None or spec.name not in ("sync", "one_step_off", "fully_async"):
        _refuse("veRL", setup.policy, VERL_CLOSEST)
    megatron = setup.trainer.backend == "megatron"
    entry, name = {
        "sync": ("verl.trainer.main_ppo", "ppo_trainer"),
        "one_step_off": ("recipe.one_step_off_policy.main_ppo", "one_step_off_ppo_trainer"),
        "fully_async": ("recipe.fully_async_policy.fully_async_main", "fully_async_ppo_trainer"),
    }[spec.name]
    name = name.replace("ppo_trainer", "ppo_megatron_trainer") if megatron else name
    base = default_config(name)
    sets: dict[str, object] = {}
    if setup.placement == "disaggregated":
        if spec.name == "sync":
            raise RlsimError(
                "veRL's synchronous trainer is colocated: a disaggregated run is one_step_off or fully_async"
            )
        (tn, tg), (rn, rg) = _nodes(setup.train_gpus), _nodes(setup.num_gpus - setup.train_gpus)
        sets |= {"trainer.nnodes": tn, "trainer.n_gpus_per_node": tg}
        sets |= {"rollout.nnodes": rn, "rollout.n_gpus_per_node": rg}
    else:
        if spec.name != "sync":
            raise RlsimError(f"veRL's {spec.name} recipe runs the rollout on GPUs of its own: plan it disaggregated")
        n, g = _nodes(setup.num_gpus)
        sets |= {"trainer.nnodes": n, "trainer.n_gpus_per_node": g}
    r = f"{ARR}.rollout"
    sets |= {f"{r}.name": setup.engine.rollout_engine, f"{r}.tensor_model_parallel_size": setup.tp,
             f"{r}.pipeline_model_parallel_size": setup.pp, f"{r}.expert_parallel_size": setup.ep,
             f"{r}.data_parallel_size": setup.dp, f"{r}.n": setup.samples_per_prompt,
             "data.max_response_length": setup.max_response_len, "algorithm.adv_estimator": "grpo",
             f"{ARR}.actor.use_kl_loss": setup.use_kl_loss,
             f"{ARR}.model.path": _model_path(setup)}  # fmt: skip
    for k in ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "enforce_eager",
              "enable_chunked_prefill", "enable_prefix_caching"):  # fmt: skip
        v = getattr(setup.engine, k)
        if v is not None:
            sets[f"{r}.{k}"] = v
    if setup.dtype == "fp8":  # vLLM's fp8 weights (veRL's rollout states no KV cache dtype: the model's bf16)
        if setup.kv_cache_dtype == "fp8":
            raise RlsimError("veRL's rollout states no fp8 KV cache: plan it with the KV cache in bf16")
        sets[f"{r}.quantization"] = "fp8"
    if setup.placement == "colocated":
        sets[f"{r}.free_cache_engine"] = bool(setup.engine.free_cache_engine)
    if spec.name == "fully_async":
        c = spec.knobs
        require, trigger = int(c.get("require_batches", 1)), int(c.get("trigger_parameter_sync_step", 4))
        mini = c.get("ppo_mini_batch_size") or setup.prompts_per_step // (require * trigger)
        if mini * require * trigger != setup.prompts_per_step:
            raise RlsimError(
                f"{setup.prompts_per_step} prompts between syncs are not ppo_mini_batch_size x require_batches x "
                f"trigger_parameter_sync_step ({mini} x {require} x {trigger})"
            )
        sets[f"{ARR}.actor.ppo_mini_batch_size"] = mini
        for k in ("staleness_threshold", "partial_rollout", "use_rollout_log_probs"):
            if k in c:
                sets[f"async_training.{k}"] = c[k]
        sets |= {"async_training.require_batches": require, "async_training.trigger_parameter_sync_step": trigger}
        if "checkpoint_engine" in c:
            sets["async_training.checkpoint_engine.enable"] = c["checkpoint_engine"]
        if "device_buffer_size_M" in c:
            sets["async_training.checkpoint_engine.device_buffer_size_M"] = c["device_buffer_size_M"]
    else:
        steps = setup.trainer.framework.optimizer_steps  # veRL's actor steps once a mini-batch
        if setup.prompts_per_step % steps:
            raise RlsimError(
                f"{setup.prompts_per_step} prompts a step do not split into {steps} optimizer steps (veRL's "
                "train_batch_size / ppo_mini_batch_size)"
            )
        sets |= {"data.train_batch_size": setup.prompts_per_step,
                 f"{ARR}.actor.ppo_mini_batch_size": setup.prompts_per_step // steps, f"{ARR}.actor.ppo_epochs": 1}
    if setup.max_model_len is not None:
        sets[f"{r}.max_model_len"] = setup.max_model_len
    sets |= _verl_trainer(setup)
    lines = [f"python3 -m {entry}", f"--config-name={name}"]
    for key, v in sets.items():
        lines.append(f"{'' if _has(base, key) else '+'}{key}={_value(v)}")
    return "\n".join(lines) + "\n"


def _verl_trainer(setup: RunSetup) -> dict[str, object]:
    t, f = setup.trainer, setup.trainer.framework
    a, out = f"{ARR}.actor", {}
    if f.max_token_len:
        out |= {f"{a}.use_dynamic_bsz": True, f"{a}.ppo_max_token_len_per_gpu": f.max_token_len,
                f"{ARR}.rollout.log_prob_max_token_len_per_gpu":
                    f.log_prob_max_token_len or f.max_token_len}  # fmt: skip
    else:
        out[f"{a}.use_dynamic_bsz"] = False
        if f.micro_batch_size:
            out[f"{a}.ppo_micro_batch_size_per_gpu"] = f.micro_batch_size
    if t.backend == "megatron":
        m = f"{a}.megatron"
        out |= {f"{m}.tensor_model_parallel_size": t.tp, f"{m}.pipeline_model_parallel_size": t.pp,
                f"{m}.expert_model_parallel_size": t.ep, f"{m}.context_parallel_size": t.cp,
                f"{m}.param_offload": f.param_offload, f"{m}.grad_offload": f.grad_offload,
                f"{m}.optimizer_offload": f.optimizer_offload_fraction > 0,
                f"{ARR}.ref.megatron.param_offload": f.ref_offload}  # fmt: skip
        if f.vpp > 1:
            out[f"{m}.virtual_pipeline_model_parallel_size"] = f.vpp
        if f.optimizer_offload_fraction > 0:
            o = f"{a}.optim.override_optimizer_config"
            out |= {f"{o}.optimizer_offload_fraction": f.optimizer_offload_fraction, f"{o}.optimizer_cpu_offload": True}
        tc = f"{m}.override_transformer_config"
        out[f"{tc}.recompute_granularity"] = f.recompute if f.recompute != "none" else "null"
        if f.recompute == "full" and f.recompute_layers:
            out[f"{tc}.recompute_num_layers"] = f.recompute_layers
        return out
    if f.recompute == "selective" or 0 < f.optimizer_offload_fraction < 1 or f.grad_offload or f.vpp > 1:
        raise RlsimError(
            "veRL's FSDP backend has no selective recompute, partial optimizer offload, separate gradient offload "
            "or virtual stages: those are megatron's"
        )
    out |= {f"{a}.strategy": "fsdp2", f"{a}.fsdp_config.param_offload": f.param_offload,
            f"{a}.fsdp_config.optimizer_offload": f.optimizer_offload_fraction == 1,
            f"{ARR}.ref.fsdp_config.param_offload": f.ref_offload,
            f"{ARR}.ref.strategy": "fsdp2",
            f"{a}.ulysses_sequence_parallel_size": t.cp,
            f"{ARR}.model.enable_gradient_checkpointing": f.recompute == "full"}  # fmt: skip
    return out


def nemo_rl_recipe(setup: RunSetup) -> str:
    """A NeMo RL recipe of `setup` over NeMo RL's GRPO base."""
    spec = parse_policy(setup.policy)
    if spec.histospec is not None or spec.name not in ("sync", "one_step_off", "k_step_off"):
        _refuse("NeMo RL", setup.policy, NEMO_RL_CLOSEST)
    t, f = setup.trainer, setup.trainer.framework
    gen: dict = {
        "backend": setup.engine.rollout_engine, "max_new_tokens": setup.max_response_len,
        "vllm_cfg": {"tensor_parallel_size": setup.tp, "pipeline_parallel_size": setup.pp,
                     "expert_parallel_size": setup.ep, "enforce_eager": bool(setup.engine.enforce_eager)},
    }  # fmt: skip
    if setup.engine.gpu_memory_utilization is not None:
        gen["vllm_cfg"]["gpu_memory_utilization"] = setup.engine.gpu_memory_utilization
    # vLLM's cap on prompt plus response (null: the model's own context, no cap of the run's)
    gen["vllm_cfg"]["max_model_len"] = setup.max_model_len
    if setup.dtype == "fp8":  # vLLM's fp8 weights; the KV cache stays the model's bf16 unless stated
        gen["vllm_cfg"]["precision"] = "fp8"
    if setup.kv_cache_dtype == "fp8":
        gen["vllm_cfg"]["kv_cache_dtype"] = "fp8"
    limits = {k: getattr(setup.engine, k) for k in ("max_num_seqs", "max_num_batched_tokens")}
    if any(v is not None for v in limits.values()):  # passed to vLLM as they are
        gen["vllm_kwargs"] = {k: v for k, v in limits.items() if v is not None}
    n, g = _nodes(setup.num_gpus)
    if setup.placement == "disaggregated":
        rn, rg = _nodes(setup.num_gpus - setup.train_gpus)
        gen["colocated"] = {"enabled": False, "resources": {"num_nodes": rn, "gpus_per_node": rg}}
    else:
        gen["colocated"] = {"enabled": True}
    grpo: dict = {"num_prompts_per_step": setup.prompts_per_step,
                  "num_generations_per_prompt": setup.samples_per_prompt,
                  "use_dynamic_sampling": spec.dynamic_sampling is not None}  # fmt: skip
    if spec.name == "sync":
        grpo["async_grpo"] = {"enabled": False}
    else:
        grpo["async_grpo"] = {"enabled": True, "max_trajectory_age_steps": int(spec.knobs.get("k", 1))}
    samples = setup.prompts_per_step * setup.samples_per_prompt
    if samples % setup.trainer.framework.optimizer_steps:
        raise RlsimError(f"{samples} samples a step do not split into {setup.trainer.framework.optimizer_steps} "
                         "optimizer steps (NeMo RL's train_global_batch_size)")  # fmt: skip
    policy: dict = {"generation": gen, "train_global_batch_size": samples // setup.trainer.framework.optimizer_steps}
    if f.max_token_len:
        packing = {"enabled": True, "train_mb_tokens": f.max_token_len,
                   "logprob_mb_tokens": f.log_prob_max_token_len or f.max_token_len}  # fmt: skip
        policy |= {"sequence_packing": packing, "dynamic_batching": {"enabled": False}}
    else:
        policy |= {"sequence_packing": {"enabled": False}, "dynamic_batching": {"enabled": False},
                   "train_micro_batch_size": f.micro_batch_size or 1}  # fmt: skip
    if t.backend == "megatron":
        mc: dict = {"enabled": True, "tensor_model_parallel_size": t.tp, "pipeline_model_parallel_size": t.pp,
                    "expert_model_parallel_size": t.ep, "context_parallel_size": t.cp,
                    "activation_checkpointing": f.recompute == "full",
                    "optimizer": {"optimizer_cpu_offload": f.optimizer_offload_fraction > 0,
                                  "optimizer_offload_fraction": f.optimizer_offload_fraction}}  # fmt: skip
        if f.vpp > 1:
            mc["virtual_pipeline_model_parallel_size"] = f.vpp
        policy |= {"megatron_cfg": mc, "dtensor_cfg": {"enabled": False}}
    else:
        policy |= {"megatron_cfg": {"enabled": False}, "dtensor_cfg": {
            "enabled": True, "tensor_parallel_size": 1, "context_parallel_size": t.cp,
            "activation_checkpointing": f.recompute == "full", "cpu_offload": f.param_offload}}  # fmt: skip
    policy["model_name"] = _model_path(setup)
    recipe = {
        "defaults": NEMO_RL_BASE, "grpo": grpo, "policy": policy,
        "loss_fn": {"reference_policy_kl_penalty": 0.01 if setup.use_kl_loss else 0.0},
        "cluster": {"num_nodes": n, "gpus_per_node": g},
    }  # fmt: skip
    return yaml.safe_dump(recipe, sort_keys=False)
