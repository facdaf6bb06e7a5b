"""`--from verl:CONFIG`: a veRL run's Hydra config, read as veRL 0.7.0 composes it.

CONFIG is either
- a YAML config: the one a run writes (`.hydra/config.yaml`, every key), or a partial one laid
  over the defaults (a `defaults:` list naming one of the configs below picks them), or
- a file of Hydra overrides, as a launch script passes them (`key=value`, `+key=value` to add a
  key, `++key=value` to add or set, `~key` to delete, `group@package=choice` to pick a config
  group's choice; `--config-name=NAME` picks the config, else the entry point after `-m` does, as
  its `@hydra.main` names it: `main_ppo`'s `ppo_trainer`, the recipes' own; the words before it,
  such as `python3`, are skipped). Shell variables must be expanded first: a `$` is refused.

The configs are veRL 0.7.0's (github.com/volcengine/verl, tag v0.7.0, commit
f9c855f7cf04d603c9546bc01776c74806a879c1): its config tree `verl/trainer/config/` and the two async
recipes' `config/` folders (`recipe/one_step_off_policy`, `recipe/fully_async_policy`), vendored in
`verl_v0.7.0/` with their licence (Apache-2.0). Hydra composes them, as veRL's entry points do
(`initialize_config_dir` + `compose(name, overrides)`, each override read by Hydra's grammar), and
OmegaConf resolves the result (`${oc.select:...}` as veRL writes it). A partial YAML is merged over
its composed config in struct mode, as Hydra merges one.

What is mapped, key by key, is `KEYS` below and docs/simulate.md's table; keys that change cost,
set away from the defaults, that rlsim does not model are listed in `RunSetup.unmodelled`.
"""

from __future__ import annotations

import re
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

from rlsim.config import EngineConfig
from rlsim.derive.models import shipped_models
from rlsim.derive.train import Trainer
from rlsim.errors import RlsimError
from rlsim.framework_costs import FrameworkSettings
from rlsim.frameworks.files import load_yaml, read_text
from rlsim.frameworks.keys import get as _get
from rlsim.frameworks.keys import positive_int as _int
from rlsim.frameworks.run_setup import RunSetup

RELEASE = "verl_v0.7.0"
# each config veRL's entry points compose, and its folder in veRL's tree (vendored in RELEASE)
CONFIG_DIRS = {
    "ppo_trainer": "verl/trainer/config", "ppo_megatron_trainer": "verl/trainer/config",
    "one_step_off_ppo_trainer": "recipe/one_step_off_policy/config",
    "one_step_off_ppo_megatron_trainer": "recipe/one_step_off_policy/config",
    "fully_async_ppo_trainer": "recipe/fully_async_policy/config",
    "fully_async_ppo_megatron_trainer": "recipe/fully_async_policy/config",
}  # fmt: skip
CONFIGS = tuple(CONFIG_DIRS)
ARR = "actor_rollout_ref"
# the entry points' own config (`@hydra.main(config_name=...)`), for overrides without --config-name
ENTRY_CONFIGS = {
    "verl.trainer.main_ppo": "ppo_trainer",
    "recipe.fully_async_policy.fully_async_main": "fully_async_ppo_trainer",
    "recipe.one_step_off_policy.main_ppo": "one_step_off_ppo_trainer",
}
# keys read that change cost, and rlsim's model has no term for: (key, its default, what it does)
UNMODELLED = (
    (f"{ARR}.actor.ppo_epochs", 1, "more than one pass of updates over a batch"),
    (f"{ARR}.model.lora_rank", 0, "LoRA training"),
    (f"{ARR}.rollout.multi_turn.enable", False, "multi-turn rollout (give a multi-turn trace instead)"),
    (f"{ARR}.rollout.quantization", None, "a quantized rollout"),
    (f"{ARR}.rollout.over_sample_rate", 0, "rollout over-sampling"),
    ("reward_model.enable", False, "a reward model's pass"),
    ("algorithm.use_pf_ppo", False, "PF-PPO's resampling"),
)


def _load_yaml(text: str, where: str) -> dict:
    out = load_yaml(text, where)
    if out is None:
        return {}
    if not isinstance(out, dict):
        raise RlsimError(f"{where}: a veRL config is a mapping of keys, not a {type(out).__name__}")
    return out


def _tree() -> Path:
    """The vendored veRL 0.7.0 config tree (a folder in both an editable and a wheel install)."""
    return Path(str(resources.files("rlsim.frameworks") / RELEASE))


def _search_path() -> str:
    """Hydra's search path as an override: veRL's trainer configs, then the two recipes' folders
    (a recipe's own `hydra.searchpath` names `verl/trainer/config` relative to a veRL checkout)."""
    dirs = [_tree() / d for d in dict.fromkeys(CONFIG_DIRS.values())]
    return "hydra.searchpath=[" + ",".join(f"'file://{d}'" for d in dirs) + "]"


def compose(name: str, overrides: list[str] | tuple[str, ...] = (), where: str | None = None) -> Any:  # noqa: ANN401
    """veRL's config `name` (one of `CONFIGS`) composed by Hydra from the vendored tree, as veRL's
    entry points compose it: `initialize_config_dir` + `compose(name, overrides)`, each override
    read by Hydra's own grammar. (An OmegaConf DictConfig, out of struct mode.)"""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    where = where or name
    if name not in CONFIG_DIRS:
        raise RlsimError(f"{where}: --config-name {name}: rlsim knows veRL's {', '.join(CONFIG_DIRS)}")
    config_dir = _tree() / CONFIG_DIRS[name]
    _parse(overrides, where)
    try:
        with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
            cfg = hydra_compose(config_name=name, overrides=[*overrides, _search_path()])
    except (HydraException, OmegaConfBaseException) as exc:
        raise RlsimError(f"{where}: {_composition_sentence(exc)}") from None
    from omegaconf import OmegaConf

    OmegaConf.set_struct(cfg, False)
    cfg.pop("hydra", None)
    return cfg


def _parse(overrides: list[str] | tuple[str, ...], where: str) -> None:
    """Each override through Hydra's own parser, so a refusal names the override it refuses."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for w in overrides:
        try:
            parser.parse_override(w)
        except HydraException as exc:
            first = str(exc).splitlines()[0]
            raise RlsimError(
                f"{where}: {w} is not an override Hydra parses ({first}): Hydra's override prefixes are +, ++ and ~ "
                "(KEY=VALUE sets a key, +KEY=VALUE adds one, ++KEY=VALUE adds or sets, ~KEY deletes)"
            ) from None


# Hydra's composition errors, as one sentence each: (its words, rlsim's sentence over the key)
_COMPOSITION = (
    (r"Could not override '([^']+)'", "{0} is not a key of veRL 0.7.0's config: write +{0}=... to add it"),
    (r"Could not append to config\. An item is already at '([^']+)'",
     "+{0} adds a key the config already has: write {0}=... (or ++{0}=...)"),
    (r"Could not delete from config\. '([^']+)' does not exist", "~{0} deletes a key the config does not have"),
    (r"Ambiguous value for argument '([^']+)'",
     "{0}: a comma makes a Hydra sweep, which one run does not take: write [a,b] for a list, or quote the value"),
)


def _composition_sentence(exc: Exception) -> str:
    """A Hydra composition error in one sentence: rlsim's for the override rules, else Hydra's own
    lines joined, without the search path and the docs' address."""
    text = str(exc)
    group = r"Could not find '([^']+)'\s*Available options in '([^']+)':\s*(.*?)\n\s*Config search"
    missing = re.search(group, text, re.S)
    if missing:
        options = ", ".join(missing.group(3).split())
        return f"veRL 0.7.0 has no config {missing.group(1)} (its {missing.group(2)} configs: {options})"
    for pattern, sentence in _COMPOSITION:
        m = re.search(pattern, text)
        if m:
            return sentence.format(m.group(1))
    return _hydra_sentence(exc)


def _hydra_sentence(exc: Exception) -> str:
    """A Hydra error in one line: its lines joined, without the search path and the docs' address."""
    lines = [ln.strip() for ln in str(exc).splitlines()]
    if any(ln.startswith("Config search path") for ln in lines):
        lines = lines[: next(i for i, ln in enumerate(lines) if ln.startswith("Config search path"))]
    lines = [ln for ln in lines if ln and not ln.startswith(("See https://hydra.cc", "provider="))]
    text = "; ".join(ln.rstrip(".:") for ln in lines)
    return text.replace("Available options in", "options in").replace(":;", ":")


def default_config(name: str) -> dict:
    """veRL 0.7.0's config `name` (one of `CONFIGS`) as Hydra composes it, before overrides."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose(name), resolve=False)


def _overrides(text: str, where: str) -> tuple[str, list[str]]:
    """(the config name, the override words) of a file of Hydra overrides."""
    text = text.replace("\\\n", " ")
    try:
        words = shlex.split(text, comments=True)
    except ValueError as exc:
        raise RlsimError(f"{where}: cannot split its words ({exc})") from None
    name, out, i = "ppo_trainer", [], 0
    launch = True  # the words before the entry point (or the first override) launch it: python3, a script
    while i < len(words):
        w = words[i]
        if w == "-m" and i + 1 < len(words):  # the entry point: its own config, unless --config-name says
            entry = words[i + 1].replace("verl.experimental.", "recipe.")
            if entry not in ENTRY_CONFIGS:
                raise RlsimError(
                    f"{where}: -m {words[i + 1]} is not an entry point of veRL 0.7.0 rlsim reads "
                    f"({', '.join(ENTRY_CONFIGS)}): give --config-name, or a run's .hydra/config.yaml"
                )
            name, i, launch = ENTRY_CONFIGS[entry], i + 1, False
        elif w.startswith("--config-name"):
            if "=" in w:
                name = w.split("=", 1)[1]
            elif i + 1 < len(words):
                name, i = words[i + 1], i + 1
            name = name.removesuffix(".yaml")
        elif w.startswith("--config-path") and "=" not in w:
            i += 1  # its folder: the config is found by name in the vendored tree
        elif re.search(r"\$(?!\{)", w):  # $NAME; ${...} is an OmegaConf interpolation, as Hydra reads it
            raise RlsimError(
                f"{where}: {w.split('=')[0]} holds a shell variable ({w}): expand the script's variables first"
            )
        elif w.startswith("~") or w.startswith("+") or ("=" in w and not w.startswith("-")):
            out.append(w)  # Hydra's grammar reads it (and refuses what it does not parse)
            launch = False
        elif not launch and not w.startswith("-"):
            raise RlsimError(
                f"{where}: {w} is not an override: write KEY=VALUE (or +KEY=VALUE to add a key, ~KEY to delete one)"
            )
        i += 1
    return name, out


def read_config(path: Path) -> tuple[dict, str]:
    """The resolved config of a veRL YAML or overrides file, and the name of its defaults."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    where = str(path)
    text = read_text(path, f"--from verl:{path}")
    if path.suffix in (".yaml", ".yml"):
        raw = _load_yaml(text, where)
        defaults = raw.get("defaults")
        if defaults is not None and not isinstance(defaults, list):
            raise RlsimError(f"{where}: its defaults: is a list (of config names), not a {type(defaults).__name__}")
        names = [d for d in defaults or [] if d != "_self_"]
        if defaults and (len(names) != 1 or names[0] not in CONFIGS):
            raise RlsimError(
                f"{where}: its defaults list is one of veRL 0.7.0's configs ({', '.join(CONFIGS)}) and _self_, "
                f"not {names}: give a config group's choice as an override (actor@actor_rollout_ref.actor=...)"
            )
        name = names[0] if defaults else None
        strategy = (raw.get(ARR) or {}).get("actor", {}).get("strategy") if isinstance(raw.get(ARR), dict) else None
        name = name or ("ppo_megatron_trainer" if strategy == "megatron" else "ppo_trainer")
        base = compose(name, where=where)
        own = {k: v for k, v in raw.items() if k not in ("defaults", "hydra")}
        if set(base) <= set(own):  # a run's written config: every section, keys its run added with + among them
            cfg = OmegaConf.merge(base, OmegaConf.create(own))
        else:  # a partial YAML: merged as Hydra merges one, in struct mode
            cfg = _merge_struct(base, own, where)
    else:
        name, words = _overrides(text, where)
        cfg = compose(name, words, where=where)
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False), name
    except OmegaConfBaseException as exc:
        raise RlsimError(f"{where}: {_unresolved(exc)}") from None


def _unresolved(exc: Exception) -> str:
    """One sentence for an OmegaConf error while resolving: the key and the interpolation that does
    not resolve (no key of that name, or a cycle), and what a shell variable would need."""
    from omegaconf.errors import InterpolationResolutionError

    key = getattr(exc, "full_key", None)
    first = str(exc).splitlines()[0]
    if isinstance(exc, (InterpolationResolutionError, RecursionError)) or "nterpolation" in type(exc).__name__:
        return (f"{key or 'a key'}: its interpolation does not resolve ({first}); a ${{...}} names another key of the "
                "config (a shell variable must be expanded first)")  # fmt: skip
    return first


def _merge_struct(base, raw: dict, where: str):  # noqa: ANN001, ANN202 - OmegaConf DictConfigs
    """A partial YAML `raw` merged over veRL's defaults in struct mode, as Hydra merges a config: a
    key the defaults lack (a typo, a section of another release) is one sentence naming it. (A
    run's written config, which holds every section, is merged as it is: the keys its run added
    with + are in it.)"""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError

    OmegaConf.set_struct(base, True)
    try:
        merged = OmegaConf.merge(base, OmegaConf.create(raw))
    except ConfigKeyError as exc:
        key = getattr(exc, "full_key", None) or str(exc).splitlines()[0]
        raise RlsimError(
            f"{where}: {key} is not a key of veRL 0.7.0's config: correct it, or drop it (a partial YAML is merged "
            "as Hydra merges one; a run's own .hydra/config.yaml holds every section and is read whole)"
        ) from None
    OmegaConf.set_struct(merged, False)
    return merged


def known_model(path: str) -> str | None:
    """The model rlsim knows that a config's `model.path` names: its last part, a shipped name or
    the last part of its Hugging Face id (a Base or Instruct checkpoint shares its model's config)."""
    table = shipped_models()
    leaf = Path(str(path).rstrip("/")).name.lower()
    by_hf = {str(v.get("source", "")).split("/")[-1].lower(): k for k, v in table.items()}
    for cand in (leaf, leaf.removesuffix("-base"), leaf.removesuffix("-instruct")):
        if cand in table:
            return cand
        if cand in by_hf:
            return by_hf[cand]
    return None


def _optimizer_steps(cfg: dict, where: str) -> int:
    """AdamW steps a step's batch makes: `data.train_batch_size / ppo_mini_batch_size x
    ppo_epochs`, as veRL's actor splits a batch into mini-batches (both sizes in prompts; a last,
    smaller mini-batch is one more step) and steps once each, every epoch. Without dynamic batch
    size veRL asserts that the batch holds a mini-batch. A fully_async step is
    `ppo_mini_batch_size x require_batches x trigger_parameter_sync_step` prompts (`read_verl`), so
    `require_batches x trigger_parameter_sync_step` mini-batches."""
    actor = _get(cfg, f"{ARR}.actor")
    mini = _int(cfg, f"{ARR}.actor.ppo_mini_batch_size", where)
    epochs = _int(cfg, f"{ARR}.actor.ppo_epochs", where) if actor.get("ppo_epochs") is not None else 1
    at = _get(cfg, "async_training") or {}
    if at:
        return int(at.get("require_batches", 1)) * int(at.get("trigger_parameter_sync_step", 1)) * epochs
    batch = _int(cfg, "data.train_batch_size", where)
    if batch < mini and not actor.get("use_dynamic_bsz"):
        raise RlsimError(
            f"{where}: data.train_batch_size {batch} is smaller than {ARR}.actor.ppo_mini_batch_size {mini}, which "
            "veRL refuses without dynamic batch size: set ppo_mini_batch_size to at most the batch"
        )
    return -(-batch // mini) * epochs


def _trainer(cfg: dict, where: str) -> Trainer:
    """The trainer backend, layout and what it does around the FLOPs."""
    actor, ref = _get(cfg, f"{ARR}.actor"), _get(cfg, f"{ARR}.ref") or {}
    strategy = actor.get("strategy")
    dyn = bool(actor.get("use_dynamic_bsz"))
    settings: dict[str, Any] = {}
    if dyn:
        settings["max_token_len"] = int(actor.get("ppo_max_token_len_per_gpu") or 0)
        lp = _get(cfg, f"{ARR}.rollout.log_prob_max_token_len_per_gpu") or settings["max_token_len"]
        settings["log_prob_max_token_len"] = int(lp)
    elif actor.get("ppo_micro_batch_size_per_gpu"):
        settings["micro_batch_size"] = int(actor["ppo_micro_batch_size_per_gpu"])
    if strategy in ("fsdp", "fsdp2"):
        fsdp = actor.get("fsdp_config") or {}
        settings["param_offload"] = bool(fsdp.get("param_offload"))
        settings["optimizer_offload_fraction"] = 1.0 if fsdp.get("optimizer_offload") else 0.0
        settings["ref_offload"] = bool((ref.get("fsdp_config") or {}).get("param_offload"))
        settings["recompute"] = "full" if _get(cfg, f"{ARR}.model.enable_gradient_checkpointing") else "none"
        cp = int(actor.get("ulysses_sequence_parallel_size") or fsdp.get("ulysses_sequence_parallel_size") or 1)
        layout = {"cp": cp}
        backend = "fsdp2"
    elif strategy == "megatron":
        mg = actor.get("megatron") or {}
        opt = (actor.get("optim") or {}).get("override_optimizer_config") or {}
        settings["param_offload"] = bool(mg.get("param_offload"))
        settings["grad_offload"] = bool(mg.get("grad_offload"))
        if mg.get("optimizer_offload") or opt.get("optimizer_cpu_offload"):
            settings["optimizer_offload_fraction"] = float(opt.get("optimizer_offload_fraction", 1.0))
        settings["ref_offload"] = bool((ref.get("megatron") or {}).get("param_offload"))
        tc = mg.get("override_transformer_config") or {}
        granularity = tc.get("recompute_granularity")
        if granularity in ("full", "selective"):
            settings["recompute"] = granularity
            if granularity == "full" and tc.get("recompute_num_layers"):
                settings["recompute_layers"] = int(tc["recompute_num_layers"])
        vpp = mg.get("virtual_pipeline_model_parallel_size")
        if vpp:
            settings["vpp"] = int(vpp)
        layout = {k: int(mg.get(v) or 1) for k, v in (("tp", "tensor_model_parallel_size"),
                  ("pp", "pipeline_model_parallel_size"), ("ep", "expert_model_parallel_size"),
                  ("cp", "context_parallel_size"))}  # fmt: skip
        backend = "megatron"
    else:
        raise RlsimError(f"{where}: {ARR}.actor.strategy {strategy!r}: rlsim models fsdp, fsdp2 and megatron")
    settings["optimizer_steps"] = _optimizer_steps(cfg, where)
    try:
        return Trainer(backend, **layout, framework=FrameworkSettings(**settings))
    except RlsimError as exc:
        raise RlsimError(f"{where}: {exc}") from None


def _policy(cfg: dict, name: str) -> str:
    """The config's own mode: veRL's synchronous trainer, or one of its two async recipes."""
    if name.startswith("one_step_off"):
        return "one_step_off"
    if not name.startswith("fully_async"):
        return "sync"
    at = _get(cfg, "async_training") or {}
    ce = at.get("checkpoint_engine") or {}
    knobs = {
        "staleness_threshold": at.get("staleness_threshold"), "require_batches": at.get("require_batches"),
        "trigger_parameter_sync_step": at.get("trigger_parameter_sync_step"),
        "ppo_mini_batch_size": _get(cfg, f"{ARR}.actor.ppo_mini_batch_size"),
        "partial_rollout": at.get("partial_rollout"), "use_rollout_log_probs": at.get("use_rollout_log_probs"),
        "checkpoint_engine": ce.get("enable"), "device_buffer_size_M": ce.get("device_buffer_size_M"),
    }  # fmt: skip
    text = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in knobs.items() if v is not None)
    return f"fully_async({text})"


def _chunk_budget(roll: dict, engine_name: str, where: str) -> int | None:
    """The rollout's chunk budget: vLLM is given `rollout.max_num_batched_tokens`; veRL's SGLang server
    (`async_sglang_server.py`) passes no chunk size, so SGLang sizes it by the GPU's memory
    (`rlsim.config.sglang_chunked_prefill_size`, None here) unless `engine_kwargs.sglang` names one."""
    if engine_name == "vllm":
        return int(roll["max_num_batched_tokens"])
    size = ((roll.get("engine_kwargs") or {}).get("sglang") or {}).get("chunked_prefill_size")
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise RlsimError(
            f"{where}: {ARR}.rollout.engine_kwargs.sglang.chunked_prefill_size {size!r}: a positive integer"
        )
    return size


def read_verl(path: Path) -> RunSetup:
    """The `RunSetup` of a veRL config (the module docstring)."""
    cfg, name = read_config(path)
    where = str(path)
    roll = _get(cfg, f"{ARR}.rollout") or {}
    engine_name = roll.get("name")
    if engine_name in (None, "???"):
        raise RlsimError(f"{where}: {ARR}.rollout.name is not set (vllm or sglang)")
    if engine_name not in ("vllm", "sglang"):
        raise RlsimError(f"{where}: {ARR}.rollout.name {engine_name!r}: rlsim models vllm and sglang")
    trainer_pool = _int(cfg, "trainer.nnodes", where) * _int(cfg, "trainer.n_gpus_per_node", where)
    if name.startswith(("one_step_off", "fully_async")):  # the rollout on its own pool
        rollout_pool = _int(cfg, "rollout.nnodes", where) * _int(cfg, "rollout.n_gpus_per_node", where)
        num_gpus, placement, train_gpus = trainer_pool + rollout_pool, "disaggregated", trainer_pool
    else:
        num_gpus, placement, train_gpus = trainer_pool, "colocated", 0
    policy = _policy(cfg, name)
    if policy.startswith("fully_async"):
        mini = _int(cfg, f"{ARR}.actor.ppo_mini_batch_size", where)
        at = _get(cfg, "async_training") or {}
        prompts = mini * int(at.get("require_batches", 1)) * int(at.get("trigger_parameter_sync_step", 1))
    else:
        prompts = _int(cfg, "data.train_batch_size", where)
    engine = EngineConfig(
        gpu_memory_utilization=float(roll["gpu_memory_utilization"]), max_num_seqs=int(roll["max_num_seqs"]),
        max_num_batched_tokens=_chunk_budget(roll, engine_name, where),
        enable_prefix_caching=bool(roll.get("enable_prefix_caching", True)),
        free_cache_engine=bool(roll.get("free_cache_engine", True)) if placement == "colocated" else False,
        enable_chunked_prefill=bool(roll.get("enable_chunked_prefill", True)),
        enforce_eager=bool(roll.get("enforce_eager", False)), rollout_engine=engine_name,
    )  # fmt: skip
    model_path = str(_get(cfg, f"{ARR}.model.path") or "")
    kl = bool(_get(cfg, f"{ARR}.actor.use_kl_loss")) or bool(_get(cfg, "algorithm.use_kl_in_reward"))
    unmodelled = [
        f"{k}={_get(cfg, k)!r} ({what})" for k, default, what in UNMODELLED if _get(cfg, k, default) != default
    ]
    if _get(cfg, "algorithm.adv_estimator") == "gae":
        unmodelled.append("algorithm.adv_estimator='gae' (a critic's passes)")
    quantization = roll.get("quantization")  # vLLM's: fp8 weights, the KV cache in the model's bf16
    if quantization not in (None, "fp8"):
        unmodelled.append(f"{ARR}.rollout.quantization={quantization!r} (costed as bf16)")
    fp8 = {"dtype": "fp8", "kv_cache_dtype": "bf16"} if quantization == "fp8" else {}
    return RunSetup(
        framework="verl", source=where, model=known_model(model_path), model_path=model_path, num_gpus=num_gpus,
        placement=placement, train_gpus=train_gpus, tp=_int(cfg, f"{ARR}.rollout.tensor_model_parallel_size", where),
        pp=_int(cfg, f"{ARR}.rollout.pipeline_model_parallel_size", where),
        ep=_int(cfg, f"{ARR}.rollout.expert_parallel_size", where),
        dp=_int(cfg, f"{ARR}.rollout.data_parallel_size", where), engine=engine, trainer=_trainer(cfg, where),
        policy=policy, prompts_per_step=prompts, samples_per_prompt=_int(cfg, f"{ARR}.rollout.n", where),
        max_response_len=_int(cfg, "data.max_response_length", where), use_kl_loss=kl, unmodelled=tuple(unmodelled),
        # veRL's vLLM rollout caps prompt plus response at rollout.max_model_len where it is set (else at
        # max_prompt_length + max_response_length, which binds no prompt veRL admits)
        max_model_len=_int(cfg, f"{ARR}.rollout.max_model_len", where) if roll.get("max_model_len") else None,
        **fp8,
    )  # fmt: skip
