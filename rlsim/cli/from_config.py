"""`--from verl:CONFIG` on the commands that simulate: a run's own config in place of the options it sets.

The config sets the cluster, the rollout engine and its layout, the trainer, the batch and the
mode (`rlsim.frameworks.run_setup.RunSetup`); `--gpu` names the GPU, `--model` the model where
the config names only a local path (or a `--profile`, measured on the user's cluster, stands for
both), and `--trace` gives the lengths, as without it. An option the
config sets that the user also gave on the command line exits 2 in one sentence: the command's
context says where each parameter's value came from, so no default has to stand for "not given".
"""

from __future__ import annotations

import dataclasses
import sys

import typer

from rlsim.cli.ui import console as make_console
from rlsim.config import EngineConfig
from rlsim.errors import RlsimError


def once(flag: str):  # noqa: ANN201 - a click callback
    """A callback for an option declared as a list (so that click keeps every time it is given): one
    sentence where it was given more than once (click would keep the last without a word); the
    command takes its one value with `single`."""

    def one(value):  # noqa: ANN001, ANN202
        if value and len(value) > 1:
            raise RlsimError(f"{flag} given {'twice' if len(value) == 2 else f'{len(value)} times'} "
                             f"({', '.join(value)}): give it once")  # fmt: skip
        return value

    return one


def single(values: list[str] | None) -> str | None:
    """The one value of an option `once` checks (None where it was not given)."""
    return values[0] if values else None


# declared as a list (`list[str] | None`) so that a second --from is seen; the command takes `single(from_)`
FROM = typer.Option(
    None,
    "--from",
    help="A run's own config: verl:CONFIG (a veRL run's YAML, or a file of its Hydra overrides) or "
    "nemo-rl:RECIPE.yaml (with its defaults chain). It sets the GPUs, rollout engine and layout, trainer, batch and "
    "mode; give --gpu, and --model where the config names a local path (or your own --profile); --trace gives the "
    "lengths.",
    callback=once("--from"),
)


def read_from(spec: str):  # noqa: ANN201 - rlsim.frameworks.run_setup.RunSetup
    """The setup of `--from FRAMEWORK:CONFIG` (`rlsim.frameworks.registry`, one for every command)."""
    from rlsim.frameworks.registry import read

    return read(spec)


def given_on_command_line(ctx: typer.Context) -> set[str]:
    """The parameters of the running command that the user gave (not left at their defaults)."""
    given = set()
    for name in ctx.params:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            given.add(name)
    return given


def refuse_clash(given: set[str], sets: set[str], spec: str) -> None:
    """One sentence for the first option the user gave that `--from` also sets."""
    clash = sorted(given & sets)
    if clash:
        flag = "--" + clash[0].replace("_", "-")
        raise RlsimError(f"{flag} is set by --from {spec} too: leave it out, or change it in the config")


def model_of(spec: str, setup, opts: dict) -> str:  # noqa: ANN001 - rlsim.frameworks.run_setup.RunSetup
    """The model to derive on `--gpu`: `--model`, else the one the config names (one sentence
    where neither names a model rlsim knows, or the two disagree)."""
    if opts.get("gpu") is None:
        raise RlsimError(f"--from {spec} needs --gpu (or a --profile): a config does not name the GPUs it ran on")
    model = opts.get("model")
    if model is not None and setup.model is not None and model.lower() != setup.model:
        raise RlsimError(f"--model {model}: the config's model names {setup.model_path} ({setup.model})")
    model = model or setup.model
    if model is None:
        raise RlsimError(
            f"--from {spec}: its model {setup.model_path!r} is not a model rlsim knows; give --model (a name from "
            "rlsim profile list, or a config.json)"
        )
    return model


def apply_from(ctx: typer.Context, spec: str, opts: dict, engine: EngineConfig, extra: tuple[str, ...] = ()):  # noqa: ANN201 - (options, EngineConfig, RunSetup)
    """The command's options and engine with `--from`'s laid over them, and the profile derived
    from the config on `--gpu` in `opts["profile"]`, with the setup read; one sentence where an
    option clashes or is missing. A `--profile` the user gives (one measured on their own
    cluster) stands for `--gpu` and `--model`. `extra`: the command's own options the config
    also sets (compare's --rollout-engine)."""
    from rlsim.derive.cache import derived_profile_path

    setup = read_from(spec)
    given = given_on_command_line(ctx)
    refuse_clash(given, set(setup.options()) | set(setup.engine_keys) | set(extra), spec)
    out = dict(opts) | setup.options()
    if "profile" in given:  # the user's own profile (measured on their cluster) instead of a derived one
        if opts.get("gpu") is not None or opts.get("model") is not None:
            raise RlsimError("--profile states the model and GPU: give it or --gpu (with --model), not both")
        from rlsim.profile import load_profile

        prof = load_profile(opts["profile"])
        if (prof.tensor_parallel_size, prof.pipeline_parallel_size) != (setup.tp, setup.pp):
            raise RlsimError(
                f"--profile {opts['profile']} is TP {prof.tensor_parallel_size} x PP {prof.pipeline_parallel_size}; "
                f"the config's rollout runs at TP {setup.tp} x PP {setup.pp}"
            )
        memory, gpu_name = float(prof.gpu_facts.get("memory_bytes", 0.0)), prof.hardware
        measured_kv = not (prof.model_facts and memory)  # a measured KV capacity, not one derived from memory
        if opts.get("terms"):  # terms (a calibration's) lie over the user's own profile too
            from rlsim.derive.cache import profile_with_terms

            out["profile"] = profile_with_terms(opts["profile"], opts["terms"])
    else:
        measured_kv = False
        model = model_of(spec, setup, opts)  # its one sentence before anything else is read
        from rlsim.derive.gpus import load_gpu

        spec_gpu = load_gpu(opts["gpu"])
        memory, gpu_name = spec_gpu.memory_bytes, spec_gpu.name
    stated = setup.engine_for(memory, gpu_name)
    keys = (*setup.engine_keys, *(("max_num_seqs", "max_num_batched_tokens") if setup.vllm_defaults else ()))
    if measured_kv:  # the KV capacity the profile measured stands for the config's memory fraction
        keys = tuple(k for k in keys if k != "gpu_memory_utilization")
    merged = dataclasses.replace(engine, **{k: getattr(stated, k) for k in keys})
    if "profile" not in given:  # derived at the memory fraction the run gives vLLM (the config's, else the option's)
        out["profile"] = derived_profile_path(
            model, opts["gpu"], setup.tp, setup.ep, out["dtype"], setup.trainer.text(), opts.get("terms"),
            setup.pp, setup.dp, gpu_memory_utilization=merged.gpu_memory_utilization,
            kv_cache_dtype=setup.kv_cache_dtype,
        )  # fmt: skip
    err = make_console(sys.stderr)
    err.print(setup.describe(), highlight=False, soft_wrap=True)
    if measured_kv:
        err.print(
            f"profile {opts['profile']}: its measured KV capacity stands for the config's gpu_memory_utilization "
            f"{setup.engine.gpu_memory_utilization}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    if setup.unmodelled:
        err.print(f"read but not modelled: {'; '.join(setup.unmodelled)}", highlight=False, soft_wrap=True)
    return out, merged, setup
