"""The options of `rlsim plan` and `rlsim sweep`, declared once as config objects, and the plan they ask for.

`SearchOptions` holds the axes a plan searches (each a list or a range, as the command line
writes them) and the batch it holds fixed; `ExecutorOptions` where the simulations run (a local
pool or Ray), for `plan` and `sweep` alike; the objective and the halving are the planner's own
`rlsim.plan.planner.PlanConfig`. `plan_request` turns them, with `--from` and the profile
options, into what the planner takes: the search space, the profile family's path, the RL
config and the engine (`PlanRequest`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

import typer

from rlsim.cli.run_options import ProfileOptions
from rlsim.config import EngineConfig, option_field
from rlsim.errors import RlsimError


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """What a plan searches (lists of values) and the batch it holds fixed."""

    gpus: str = option_field("8..256", "GPU counts: a range (powers of two, 8..256) or a list (16,32,64).")
    placement: str = option_field("colocated", "Placements to try: colocated, disaggregated, or both.")
    train_share: str = option_field(
        "0.25,0.5", "Disaggregated: fractions of the GPUs for training (rollout rounded to whole instances)."
    )
    tp: str = option_field(
        "", "Rollout TP sizes to try, e.g. 2,4,8 (default: the profile's own; with --model, 1,2,4,8 where the "
        "weights fit).", "--tp",
    )  # fmt: skip
    max_num_seqs: str = option_field("", "vLLM max_num_seqs values to try, e.g. 256,1024.")
    gpu_memory_utilization: str = option_field("", "vLLM gpu_memory_utilization values to try, e.g. 0.5,0.8.")
    max_response_len: str = option_field("20480", "Response caps to try, e.g. 16384,20480.")
    staleness: str = option_field(
        "", "Staleness bounds to try for the policies that have one (fully_async's staleness_threshold, areal's "
        "max_head_offpolicyness), e.g. 0.1,0.5,1.",
    )  # fmt: skip
    policies: str = option_field("", "Comma-separated policies (default: every registered one but oracle).")
    rollout_engine: str = option_field(
        "vllm", "Whose scheduling rules to try: vllm, sglang, or both (vllm,sglang: each candidate under each; "
        "speculating policies under vLLM's only).",
    )  # fmt: skip
    prompts_per_step: int = option_field(512, "P0: prompts per step.")
    samples_per_prompt: int = option_field(16, "R0: samples per prompt.")


@dataclass(frozen=True, slots=True)
class ExecutorOptions:
    """Where many simulations run."""

    executor: str = option_field("process", "process (a local pool) or ray (a Ray cluster).")
    workers: int = option_field(0, "Worker processes (process) or CPUs (local ray); 0: one per core.", min=0)
    ray_address: str | None = option_field(None, "Address of a running Ray cluster (ray executor).")

    def pool(self):  # noqa: ANN201 - a concurrent.futures executor
        from rlsim.plan.sweep import make_executor

        return make_executor(self.executor, self.workers or None, self.ray_address)


# what `plan --from` takes from the config: the search axes (where the command line names none) and
# the settings it holds fixed (which the command line must then leave out)
FROM_AXES = ("gpus", "placement", "train_share", "tp", "max_num_seqs", "gpu_memory_utilization", "max_response_len",
             "policies", "rollout_engine")  # fmt: skip
FROM_FIXED = ("prompts_per_step", "samples_per_prompt", "trainer", "max_model_len")


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """What the planner searches: the space, the profile family (its smallest TP's path), the RL
    config, the engine, and the model as `--emit` names it."""

    space: Any  # rlsim.plan.space.SearchSpace
    profile: str
    rl: Any  # rlsim.config.RLConfig
    engine: EngineConfig
    emit_model: str | None


def _gpu_of(opts: dict, given: set[str]) -> tuple[float, str]:
    """(memory in bytes, name) of the GPU a plan runs on: the user's --profile's, else --gpu's."""
    if "profile" in given:
        from rlsim.profile import load_profile

        prof = load_profile(opts["profile"])
        return float(prof.gpu_facts.get("memory_bytes", 0.0)), prof.hardware
    from rlsim.derive.gpus import load_gpu

    gpu = load_gpu(opts["gpu"])
    return gpu.memory_bytes, gpu.name


def _from_config(ctx: typer.Context, spec: str, opts: dict) -> dict:
    """`plan --from FRAMEWORK:CONFIG`: each search axis the command line does not name is the
    config's one value, and the settings the config states are held fixed (one sentence where the
    command line gives one of them too); the profiles are derived on --gpu (the model from the
    config or --model), or taken from --profile's family."""
    from rlsim.cli.from_config import given_on_command_line, model_of, read_from, refuse_clash

    setup = read_from(spec)
    given = given_on_command_line(ctx)
    stated = {k for k in setup.engine_keys if k in ctx.params and k not in FROM_AXES}  # the engine's, held fixed
    refuse_clash(given, set(FROM_FIXED) | stated | ({"dtype"} if setup.dtype else set()), spec)
    if max(setup.pp, setup.ep, setup.dp) > 1:
        raise RlsimError(
            f"--from {spec}: its rollout runs at PP {setup.pp}, EP {setup.ep}, DP {setup.dp}; plan searches TP "
            "families of single-stage, non-expert-parallel profiles: simulate or compare it instead"
        )
    # a profile of the user's own: its family is searched and nothing is derived
    model = opts.get("model") if "profile" in given else model_of(spec, setup, opts)
    engine = setup.engine_for(*_gpu_of(opts, given))  # vLLM's own limits where the framework leaves them to it
    axes = {
        "gpus": str(setup.num_gpus), "placement": setup.placement, "tp": str(setup.tp),
        "train_share": f"{setup.train_gpus / setup.num_gpus:g}" if setup.placement == "disaggregated" else "0.25,0.5",
        "max_num_seqs": str(engine.max_num_seqs or ""),
        "gpu_memory_utilization": f"{setup.engine.gpu_memory_utilization or ''}",
        "max_response_len": str(setup.max_response_len), "policies": setup.policy,
        "rollout_engine": setup.engine.rollout_engine,
    }  # fmt: skip
    out = {k: (opts[k] if k in given else v) for k, v in axes.items()}
    fields = opts["engine"].__dataclass_fields__
    keys = (*setup.engine_keys, *(("max_num_batched_tokens",) if setup.vllm_defaults else ()))
    fixed = {k: getattr(engine, k) for k in keys if k not in FROM_AXES and k in fields}
    return out | {
        "prompts_per_step": setup.prompts_per_step, "samples_per_prompt": setup.samples_per_prompt,
        "trainer": setup.trainer.text(), "engine": dataclasses.replace(opts["engine"], **fixed),
        "use_kl_loss": setup.use_kl_loss, "model": model, "dtype": setup.dtype or opts["dtype"],
        "model_path": setup.model_path, "max_model_len": setup.max_model_len,
        "kv_cache_dtype": setup.kv_cache_dtype,
    }  # fmt: skip


def _checkpoint(model: str | None) -> str | None:
    """`--model`'s checkpoint folder where it names a config.json or its folder (else None: a name
    rlsim knows, written as its Hugging Face id)."""
    from pathlib import Path

    if model is None:
        return None
    path = Path(model)
    if path.is_file():
        return str(path.parent)
    return str(path) if path.is_dir() else None


def plan_request(
    ctx: typer.Context, from_: str | None, search: SearchOptions, prof: ProfileOptions, engine: EngineConfig,
    max_model_len: int | None,
) -> PlanRequest:  # fmt: skip
    """The plan the options ask for, `--from`'s config laid over what the command line leaves
    unset; the profile family derived where `--model/--gpu` name one."""
    from policies.registry import REGISTRY, split_policies
    from rlsim.cli.options import say_if_compiling
    from rlsim.config import RLConfig
    from rlsim.derive.cache import derive_family
    from rlsim.plan.space import SearchSpace, disaggregated_only, parse_gpus, parse_list

    use_kl_loss, kv_cache_dtype, emit_model = False, None, _checkpoint(prof.model)
    if from_ is not None:  # the axes not named on the command line, and the rest, from the config
        a = _from_config(ctx, from_, asdict(search) | asdict(prof) | {"engine": engine})
        search = dataclasses.replace(
            search, **{k: a[k] for k in (*FROM_AXES, "prompts_per_step", "samples_per_prompt")}
        )
        prof = dataclasses.replace(prof, trainer=a["trainer"], model=a["model"], dtype=a["dtype"])
        engine, use_kl_loss, emit_model = a["engine"], a["use_kl_loss"], a["model_path"]
        kv_cache_dtype, max_model_len = a["kv_cache_dtype"], a["max_model_len"]
    say_if_compiling()
    profile, tps = prof.profile, parse_list(search.tp, int, "--tp")
    if prof.model is not None or prof.gpu is not None:  # the family of derived profiles, one per TP
        utils = parse_list(search.gpu_memory_utilization, float, "--gpu-memory-utilization")
        least = min(utils) if utils else engine.gpu_memory_utilization  # the weights fit at every one searched
        profile, tps = derive_family(prof.model, prof.gpu, tps, prof.dtype, prof.trainer, prof.terms, least,
                                     kv_cache_dtype)  # fmt: skip
    # HistoSpec variants are left out by default: a plan estimates an epoch from its first steps,
    # where no prompt has a previous visit to draft from yet. By default every registered policy
    # but the oracle and k_step_off (at its default k it is one_step_off); those that run only
    # disaggregated, where that placement is searched.
    places = parse_list(search.placement, str, "--placement")
    names = split_policies(search.policies) or [
        p for p in REGISTRY
        if p not in ("oracle", "k_step_off") and ("disaggregated" in places or not disaggregated_only(p))
    ]  # fmt: skip
    space = SearchSpace(
        policies=tuple(names), gpus=parse_gpus(search.gpus), placements=places,
        train_shares=parse_list(search.train_share, float, "--train-share"), tps=tps,
        max_num_seqs=parse_list(search.max_num_seqs, int, "--max-num-seqs") or (None,),
        gpu_memory_utilization=parse_list(search.gpu_memory_utilization, float, "--gpu-memory-utilization") or (None,),
        max_response_len=parse_list(search.max_response_len, int, "--max-response-len"),
        staleness=parse_list(search.staleness, float, "--staleness"),
        rollout_engines=tuple(e.rollout_engine for e in engine.per_rollout_engine(search.rollout_engine)),
    )  # fmt: skip
    rl = RLConfig(prompts_per_step=search.prompts_per_step, samples_per_prompt=search.samples_per_prompt, epochs=1,
                  use_kl_loss=use_kl_loss, max_model_len=max_model_len)  # fmt: skip
    return PlanRequest(space, profile, rl, engine, emit_model)
