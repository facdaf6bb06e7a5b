"""`--from nemo-rl:RECIPE.yaml`: a NeMo RL recipe read with its `defaults:` chain, as NeMo RL loads it.

NeMo RL (github.com/NVIDIA-NeMo/RL) composes a recipe by its own rule, not Hydra's
(`load_config_with_inheritance` in `nemo_rl/utils/config.py`, commit 7ea279abf): `defaults:` names
one parent file or a list of them, each relative to the file that names it and read with its own
chain first; parents merge in order, then the file itself, by OmegaConf; a mapping marked
`_override_: true` replaces its parent's instead of merging into it. Its interpolations use
OmegaConf's and four resolvers NeMo RL registers (`add`, `mul`, `div`, `max`), registered here
the same way when absent. The recipe's parent files are the user's own NeMo RL checkout's, beside
the recipe, so nothing of NeMo RL is vendored.

What NeMo RL leaves to vLLM, rlsim takes from vLLM 0.32: the `LLM` class's `max_num_seqs` and
`max_num_batched_tokens` on the run's GPU (`vllm/engine/arg_utils.py`, `_set_default_args`: 1,024
and 16,384 on a GPU of 70 GB or more other than an A100, else 256 and 8,192), applied once `--gpu`
names it (`RunSetup.vllm_defaults`), unless the recipe passes them to vLLM itself
(`policy.generation.vllm_kwargs`, as NeMo RL's DeepSeek-V3 FP8 recipe sets `max_num_seqs` 32).
`vllm_cfg.precision` fp8 quantizes the rollout's weights and `kv_cache_dtype` "auto" keeps its KV
cache in bf16 (`_precision`); the derived profile is the recipe's (`RunSetup.dtype`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlsim.config import EngineConfig
from rlsim.derive.train import Trainer
from rlsim.errors import RlsimError
from rlsim.framework_costs import FrameworkSettings
from rlsim.frameworks.files import load_yaml, read_text
from rlsim.frameworks.keys import get as _get
from rlsim.frameworks.keys import positive_int as _int
from rlsim.frameworks.run_setup import RunSetup
from rlsim.frameworks.verl import known_model

RESOLVERS = {
    "add": lambda a, b: a + b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b, "max": lambda a, b: max(a, b),
}  # fmt: skip
UNMODELLED = (
    ("grpo.max_rollout_turns", 1, "multi-turn rollouts (give a multi-turn trace instead)"),
    ("policy.dtensor_cfg.lora_cfg.enabled", False, "LoRA training"),
    ("policy.generation.mcore_generation_config.num_speculative_tokens", 0, "speculative decoding"),
    ("policy.megatron_cfg.fp8_cfg.enabled", False, "Megatron's FP8 training: rlsim trains at the bf16 peak"),
)

VLLM_LIMITS = ("max_num_seqs", "max_num_batched_tokens")  # vllm_kwargs rlsim's engine takes
PRECISIONS = {"bfloat16": "bf16", "fp8": "fp8"}  # vllm_cfg.precision: the weights' (fp8: vLLM's quantization)


def _precision(vc: dict, kwargs: dict) -> tuple[str, str, list[str]]:
    """The rollout's weights and KV cache dtypes, and what of them is read but not modelled:
    `vllm_cfg.precision` quantizes the weights (fp8) and `kv_cache_dtype` "auto" keeps the KV
    cache in the model's own bf16 (vLLM's rule), an fp8 one halves it; CUDA graphs captured only
    up to a batch size (`compilation_config.cudagraph_capture_sizes`) leave larger batches eager,
    which rlsim does not model (it graphs every batch unless enforce_eager)."""
    precision, kv = str(vc.get("precision") or "bfloat16"), str(vc.get("kv_cache_dtype") or "auto")
    more = []
    if precision not in PRECISIONS:
        more.append(f"policy.generation.vllm_cfg.precision={precision!r} (costed as bf16)")
    dtype = PRECISIONS.get(precision, "bf16")
    sizes = ((kwargs.get("compilation_config") or {}).get("cudagraph_capture_sizes")) or ()
    if sizes:
        more.append(
            f"policy.generation.vllm_kwargs.compilation_config.cudagraph_capture_sizes up to {max(sizes)} (batches "
            "above it run without CUDA graphs; rlsim graphs every batch)"
        )
    return dtype, "fp8" if kv.startswith("fp8") else "bf16", more


def _load(path: Path, seen: tuple[Path, ...] = ()):  # noqa: ANN202 - an OmegaConf DictConfig
    """NeMo RL's `load_config_with_inheritance` (the module docstring)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if path in seen:
        raise RlsimError(f"{path}: its defaults chain comes back to itself")
    cfg = OmegaConf.create(load_yaml(read_text(path, f"--from nemo-rl:{seen[0] if seen else path}"), str(path)) or {})
    if not isinstance(cfg, DictConfig):
        raise RlsimError(f"{path}: a NeMo RL recipe is a mapping of keys")
    if "defaults" not in cfg:
        return cfg
    parents = cfg.pop("defaults")
    parents = [str(d) for d in parents] if isinstance(parents, ListConfig) else [str(parents)]
    base = OmegaConf.create({})
    for parent in parents:
        p = Path(parent) if parent.startswith("/") else path.parent / parent
        base = _merge(base, _load(p, (*seen, path)))
    return _merge(base, cfg)


def _merge(base, over):  # noqa: ANN001, ANN202 - OmegaConf DictConfigs
    """NeMo RL's `merge_with_override`: `_override_: true` replaces a section instead of merging it."""
    from omegaconf import DictConfig, OmegaConf

    for key in list(over.keys()):
        if OmegaConf.is_missing(over, key):
            continue
        if isinstance(over[key], DictConfig) and over[key].get("_override_", False):
            over[key].pop("_override_")
            if key in base:
                base.pop(key)
    return OmegaConf.merge(base, over)


def read_config(path: Path) -> dict:
    """The recipe resolved, its defaults chain merged."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    # NeMo RL's own call (OmegaConf 2.3, as Hydra pins it; 2.4 renamed it register_resolver)
    register = getattr(OmegaConf, "register_new_resolver", None) or OmegaConf.register_resolver
    for name, fn in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            register(name, fn)
    cfg = _load(path)
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        raw = _raw(OmegaConf.to_container(cfg, resolve=False), key) if key else None
        what = f"{key}: {raw} does not resolve" if raw is not None else "a value does not resolve"
        cause = str(exc).splitlines()[0]
        fix = f"a ${{...}} names another key, or a resolver ({', '.join(RESOLVERS)}) and its arguments"
        raise RlsimError(f"{path}: {what} ({cause}); {fix}") from None


def _raw(cfg: dict, key: str) -> object:
    """The value at `key` (dotted, as OmegaConf names it) as the recipe wrote it, before resolving."""
    node: object = cfg
    for part in key.replace("[", ".").replace("]", "").split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _optimizer_steps(cfg: dict, where: str) -> int:
    """AdamW steps a step makes: its samples over `policy.train_global_batch_size` (NeMo RL's
    trainer steps once a global batch; at 2,048 samples and 512 a batch, four times)."""
    samples = _int(cfg, "grpo.num_prompts_per_step", where) * _int(cfg, "grpo.num_generations_per_prompt", where)
    if _get(cfg, "policy.train_global_batch_size") is None:
        return 1
    gbs = _int(cfg, "policy.train_global_batch_size", where)
    if samples % gbs:
        raise RlsimError(
            f"{where}: policy.train_global_batch_size {gbs} does not divide a step's {samples} samples "
            "(grpo.num_prompts_per_step x grpo.num_generations_per_prompt), as NeMo RL requires"
        )
    return samples // gbs


def _trainer(cfg: dict, where: str) -> Trainer:
    policy = _get(cfg, "policy") or {}
    mc, dt = policy.get("megatron_cfg") or {}, policy.get("dtensor_cfg") or {}
    settings: dict[str, Any] = {}
    packing = (policy.get("sequence_packing") or {}).get("enabled") or (policy.get("dynamic_batching") or {}).get(
        "enabled"
    )
    if packing:  # token budgets a micro-batch a GPU, packed
        src = policy["sequence_packing"] if (policy.get("sequence_packing") or {}).get("enabled") else policy[
            "dynamic_batching"
        ]
        settings["max_token_len"] = int(src["train_mb_tokens"])
        settings["log_prob_max_token_len"] = int(src["logprob_mb_tokens"])
    else:
        settings["micro_batch_size"] = int(policy.get("train_micro_batch_size") or 1)
    if mc.get("enabled"):
        settings["recompute"] = "full" if mc.get("activation_checkpointing") else "none"
        opt = mc.get("optimizer") or {}
        if opt.get("optimizer_cpu_offload"):
            settings["optimizer_offload_fraction"] = float(opt.get("optimizer_offload_fraction") or 0.0)
        vpp = mc.get("virtual_pipeline_model_parallel_size")
        layout = {k: int(mc.get(v) or 1) for k, v in (("tp", "tensor_model_parallel_size"),
                  ("pp", "pipeline_model_parallel_size"), ("ep", "expert_model_parallel_size"),
                  ("cp", "context_parallel_size"))}  # fmt: skip
        if vpp and layout["pp"] > 1:
            settings["vpp"] = int(vpp)
        backend = "megatron"
    elif dt.get("enabled", True):
        if int(dt.get("tensor_parallel_size") or 1) > 1:
            raise RlsimError(
                f"{where}: policy.dtensor_cfg.tensor_parallel_size {dt['tensor_parallel_size']}: rlsim's FSDP backend "
                "shards data-parallel only; a tensor-parallel layout is megatron's"
            )
        settings["recompute"] = "full" if dt.get("activation_checkpointing") else "none"
        settings["param_offload"] = bool(dt.get("cpu_offload"))
        layout, backend = {"cp": int(dt.get("context_parallel_size") or 1)}, "fsdp2"
    else:
        raise RlsimError(f"{where}: neither policy.megatron_cfg nor policy.dtensor_cfg is enabled")
    settings["optimizer_steps"] = _optimizer_steps(cfg, where)
    try:
        return Trainer(backend, **layout, framework=FrameworkSettings(**settings))
    except RlsimError as exc:
        raise RlsimError(f"{where}: {exc}") from None


def read_nemo_rl(path: Path) -> RunSetup:
    """The `RunSetup` of a NeMo RL recipe (the module docstring)."""
    cfg = read_config(path)
    where = str(path)
    gen = _get(cfg, "policy.generation") or {}
    backend = gen.get("backend", "vllm")
    if backend not in ("vllm", "sglang"):
        raise RlsimError(f"{where}: policy.generation.backend {backend!r}: rlsim models vllm and sglang")
    vc = gen.get("vllm_cfg") or {}
    total = _int(cfg, "cluster.num_nodes", where) * _int(cfg, "cluster.gpus_per_node", where)
    colocated = (gen.get("colocated") or {}).get("enabled", True)
    if colocated:
        placement, train_gpus = "colocated", 0
    else:
        res = (gen.get("colocated") or {}).get("resources") or {}
        gen_gpus = int(res.get("num_nodes") or 0) * int(res.get("gpus_per_node") or 0)
        if not 0 < gen_gpus < total:
            raise RlsimError(
                f"{where}: the generation's own resources ({gen_gpus} GPUs) must be a part of the cluster's {total}"
            )
        placement, train_gpus = "disaggregated", total - gen_gpus
    grpo = _get(cfg, "grpo") or {}
    asy = grpo.get("async_grpo") or {}
    if asy.get("enabled"):
        k = asy.get("max_trajectory_age_steps", 1)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise RlsimError(
                f"{where}: grpo.async_grpo.max_trajectory_age_steps {k!r}: an asynchronous run's trajectories are at "
                "least one step old; turn async_grpo off for on-policy GRPO"
            )
        policy = "one_step_off" if k == 1 else f"k_step_off(k={k})"
    else:
        policy = "sync"
    if grpo.get("use_dynamic_sampling"):
        policy += "+dynamic_sampling"
    kwargs = gen.get("vllm_kwargs") or {}  # passed to vLLM's engine as they are
    limits = {k: _int(cfg, f"policy.generation.vllm_kwargs.{k}", where) for k in VLLM_LIMITS if k in kwargs}
    engine = EngineConfig(
        gpu_memory_utilization=float(vc.get("gpu_memory_utilization", 0.9)),
        enforce_eager=bool(vc.get("enforce_eager")),
        enable_prefix_caching=False, free_cache_engine=bool(colocated), rollout_engine=backend, **limits,
    )  # fmt: skip
    kl = float(_get(cfg, "loss_fn.reference_policy_kl_penalty") or 0.0) > 0
    unmodelled = [f"{k}={_get(cfg, k)!r} ({what})" for k, d, what in UNMODELLED if _get(cfg, k, d) != d]
    dtype, kv_dtype, more = _precision(vc, kwargs)
    unmodelled += more
    model_path = str(_get(cfg, "policy.model_name") or "")
    return RunSetup(
        framework="nemo-rl", source=where, model=known_model(model_path), model_path=model_path, num_gpus=total,
        placement=placement, train_gpus=train_gpus, tp=int(vc.get("tensor_parallel_size") or 1),
        pp=int(vc.get("pipeline_parallel_size") or 1), ep=int(vc.get("expert_parallel_size") or 1), dp=1,
        engine=engine, trainer=_trainer(cfg, where), policy=policy,
        prompts_per_step=_int(cfg, "grpo.num_prompts_per_step", where),
        samples_per_prompt=_int(cfg, "grpo.num_generations_per_prompt", where),
        max_response_len=_int(cfg, "policy.generation.max_new_tokens", where), use_kl_loss=kl,
        unmodelled=tuple(unmodelled),
        engine_keys=("gpu_memory_utilization", "enforce_eager", "enable_prefix_caching", "free_cache_engine",
                     "rollout_engine", *limits),
        vllm_defaults=True, dtype=dtype, kv_cache_dtype=kv_dtype, max_model_len=_max_model_len(cfg, vc, where),
    )  # fmt: skip


def _max_model_len(cfg: dict, vc: dict, where: str) -> int | None:
    """vLLM's `max_model_len` (`vllm_cfg.max_model_len`, NeMo RL's `policy.max_total_sequence_length`
    in its base config): the whole sequence's cap, so each request's response is capped at the
    model length less its prompt (where `max_new_tokens` equals the model length, as NeMo RL's
    recipes set it); null leaves vLLM at the model's own context (no cap of the run's)."""
    if vc.get("max_model_len") is None:
        return None
    return _int(cfg, "policy.generation.vllm_cfg.max_model_len", where)
