"""The cluster, RL and profile options of the simulating commands, declared once, as config objects.

`rlsim simulate` and `rlsim compare` take the same options for the run they simulate: the
cluster and the RL batch (`RunOptions`, one option per field, `@run_options()`) and the profile
(`ProfileOptions`: `--profile`, or `--model/--gpu/--tp...` deriving one, `@profile_options()`),
as they take the engine's (`EngineConfig`, `rlsim.cli.engine_options`). `simulated_run` turns
them, with `--from` and the trace, into what the library runs: the `ClusterConfig`, `RLConfig`,
`EngineConfig`, tool workers and profile path (`SimulatedRun`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import typer

from rlsim.cli.engine_options import config_options
from rlsim.cli.from_config import apply_from
from rlsim.config import EngineConfig, option_field
from rlsim.errors import RlsimError

DEFAULT_PROFILE = "h100-qwen2.5-32b-tp4"  # rollout TP 4, as veRL's DAPO recipe


def same_as(cls: type, name: str) -> Any:  # noqa: ANN401 - a dataclass field
    """A new field declared as `cls`'s field `name` (its default, its option): one option, one help
    text, in two config objects."""
    f = cls.__dataclass_fields__[name]
    return field(default=f.default, metadata=f.metadata)


@dataclass(frozen=True, slots=True)
class RunOptions:
    """The cluster and the RL batch of a simulated run, as the commands take them (None: the
    trace's, or a real log's own)."""

    gpus: int = option_field(64, "Total GPUs.")
    placement: str = option_field("colocated", "colocated or disaggregated.")
    train_gpus: int = option_field(0, "Training GPUs (disaggregated only).", "--train-gpus", "--trainer-gpus")
    dispatch: str = option_field(
        "least_loaded", "least_loaded (each sample to the instance with the fewest unfinished requests, as veRL's "
        "agent loop), round_robin (sample by sample) or per_prompt (a prompt's samples together).",
    )  # fmt: skip
    prompts_per_step: int | None = option_field(
        None, "P0: prompts per step (default: a real log's own, else 512 or all the trace's prompts if fewer)."
    )
    samples_per_prompt: int | None = option_field(
        None, "R0: samples per prompt, the GRPO group (default: a real log's own, else 16 or the trace's if fewer)."
    )
    max_response_len: int | None = option_field(None, "Response cap in tokens (default: the trace's).")
    max_model_len: int | None = option_field(
        None, "vLLM's max_model_len: each response is also capped at it less the request's prompt (default: none)."
    )
    epochs: int | None = option_field(None, "Epochs over the trace's prompts (default: every epoch the trace holds).")
    max_steps: int | None = option_field(None, "Stop after this many steps.")
    seed: int = option_field(0, "Seed of the data order.")
    reward_latency: float = option_field(
        0.05, "Seconds to score one sample (a trace's reward_time_s column overrides it).", "--reward-latency"
    )
    use_kl_loss: bool = option_field(False, "KL term on: a reference model scores every batch.", "--use-kl-loss")
    tool_workers: int | None = option_field(
        None, "Multi-turn traces: CPU tool workers, the tool calls that run at once (default: no limit)."
    )
    tool_latency_scale: float = option_field(1.0, "Multi-turn traces: multiply every tool call's latency by this.")
    tool_latency_s: float | None = option_field(
        None, "Multi-turn traces: every tool call takes this many seconds (a what-if sweep).", "--tool-latency-s"
    )

    def with_trace(self, trace) -> RunOptions:  # noqa: ANN001 - rlsim.trace.format.Trace
        """The RL options left unset (None) from the trace: its epochs, its cap, and for a real log
        its own group size and prompts per step (a synthetic trace may hold spare samples, as the
        bundled one does for RollPacker's over-provisioning, so its R0 stays DAPO's 16)."""
        meta = trace.meta
        real = meta.source.startswith("real:")
        per_epoch = int(trace.table.loc[trace.table["epoch"] == trace.epochs[0], "prompt_id"].nunique())
        logged = meta.source_params.get("prompts_per_step") if real else None
        defaults = {
            "epochs": len(trace.epochs),
            "max_response_len": meta.max_response_len,
            "samples_per_prompt": meta.samples_per_prompt if real else min(16, meta.samples_per_prompt),
            "prompts_per_step": int(logged) if logged else min(512, per_epoch),
        }
        return replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})

    def configs(self, profile: str):  # noqa: ANN201 - (ClusterConfig, RLConfig)
        """The cluster and RL configs of a run on `profile` (a name or a path)."""
        from rlsim.config import ClusterConfig, RLConfig

        cluster = ClusterConfig(num_gpus=self.gpus, profile=profile, placement=self.placement,
                                train_gpus=self.train_gpus, dispatch=self.dispatch)  # fmt: skip
        rl = RLConfig(
            prompts_per_step=self.prompts_per_step, samples_per_prompt=self.samples_per_prompt,
            max_response_len=self.max_response_len, epochs=self.epochs, max_steps=self.max_steps, seed=self.seed,
            use_kl_loss=self.use_kl_loss, reward_latency_s=self.reward_latency, max_model_len=self.max_model_len,
        )  # fmt: skip
        return cluster, rl

    def tools(self, trace):  # noqa: ANN001, ANN201 - rlsim.driver.turns.ToolConfig
        """The tool workers of a multi-turn run; on a single-turn trace, which calls no tool, a tool
        option set is refused, not ignored."""
        from rlsim.driver.turns import ToolConfig
        from rlsim.trace.turns import has_turns

        if not has_turns(trace.table):
            given = {"--tool-workers": self.tool_workers is not None, "--tool-latency-s": self.tool_latency_s is
                     not None, "--tool-latency-scale": self.tool_latency_scale != 1.0}  # fmt: skip
            for flag in (f for f, on in given.items() if on):
                raise RlsimError(
                    f"{flag} applies to multi-turn traces only, and this trace is single-turn (no tool calls)"
                )
        return ToolConfig(self.tool_workers, self.tool_latency_scale, self.tool_latency_s)


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """The profile a run is priced with: a shipped or given one, or one derived from a model and
    a GPU (`rlsim.derive.cache`)."""

    profile: str = option_field(
        DEFAULT_PROFILE, "Shipped profile name or JSON path (default: rollout TP 4, as veRL's DAPO recipe)."
    )
    model: str | None = option_field(
        None, "Derive the profile: a model name (rlsim profile list), a config.json or its directory."
    )
    gpu: str | None = option_field(
        None, "With --model: a GPU name (rlsim profile list) or a JSON file of its datasheet facts."
    )
    tp: int = option_field(1, "With --model: tensor-parallel size of each rollout instance.", "--tp")
    ep: int = option_field(
        1, "With --model: expert-parallel size (1, or --tp for vLLM's enable_expert_parallel).", "--ep"
    )
    pp: int = option_field(
        1, "With --model: pipeline stages of each rollout instance (vLLM's pipeline_parallel_size; the instance takes "
        "TP x PP GPUs, its stages across nodes where they must be).", "--pp",
    )  # fmt: skip
    dp: int = option_field(
        1, "Data-parallel attention ranks stepping in lockstep (vLLM's data_parallel_size with "
        "enable_expert_parallel; an MoE model, --ep = --dp x --tp); each rank is one instance of --tp GPUs.", "--dp",
    )  # fmt: skip
    dtype: str = option_field("bf16", "With --model: weights and KV cache in bf16 or fp8.", "--dtype")
    trainer: str = option_field(
        "fsdp2", "With --model: the trainer backend and layout, fsdp2 (veRL's FSDP: 31.8% MFU, TorchTitan's "
        "published run) or megatron (47%, Megatron-LM's); settings in brackets: megatron(tp=2,pp=4,ep=8,cp=2,"
        "mfu=0.4).", "--trainer",
    )  # fmt: skip
    terms: str | None = option_field(
        None, "With --model: framework terms fitted to published runs laid over the derivation: nemo-rl (fitted on "
        "half of NeMo RL's published step times) or a JSON file of them.", "--terms",
    )  # fmt: skip

    def path(self, gpu_memory_utilization: float | None) -> str:
        """`--profile`, or the profile `--model/--gpu/--tp` derive (the two are exclusive), at the
        run's `gpu_memory_utilization` (None: veRL's default)."""
        from rlsim.derive.cache import profile_or_derived

        return profile_or_derived(self.profile, self.model, self.gpu, self.tp, self.ep, self.dtype, self.trainer,
                                  self.terms, self.pp, self.dp, gpu_memory_utilization)  # fmt: skip


def run_options() -> Callable:
    """Replace the command's `run` parameter by one option per `RunOptions` field."""
    return config_options(RunOptions, "run")


def profile_options() -> Callable:
    """Replace the command's `prof` parameter by one option per `ProfileOptions` field."""
    return config_options(ProfileOptions, "prof")


@dataclass(frozen=True, slots=True)
class SimulatedRun:
    """What the library simulates: the configs, the tool workers, the profile's path, and the
    framework config `--from` read (None without it)."""

    cluster: Any  # rlsim.config.ClusterConfig
    rl: Any  # rlsim.config.RLConfig
    engine: EngineConfig
    tools: Any  # rlsim.driver.turns.ToolConfig
    profile: str
    setup: Any = None  # rlsim.frameworks.run_setup.RunSetup

    @property
    def framework(self) -> str | None:
        return None if self.setup is None else self.setup.framework


def from_options(
    ctx: typer.Context, from_: str | None, run: RunOptions, prof: ProfileOptions, engine: EngineConfig,
    extra: tuple[str, ...] = (),
) -> tuple[RunOptions, str, EngineConfig, Any]:  # fmt: skip
    """(The run's options, its profile's path, its engine, the config read) with `--from`'s laid
    over what the user left unset (`rlsim.cli.from_config`); without `--from`, the profile given
    or derived. `extra`: the command's own options the config also sets."""
    if from_ is None:
        return run, prof.path(engine.gpu_memory_utilization), engine, None
    opts, engine, setup = apply_from(ctx, from_, asdict(run) | asdict(prof), engine, extra=extra)
    run = replace(run, **{f.name: opts[f.name] for f in fields(RunOptions)})
    return run, opts["profile"], engine, setup


def simulated_run(run: RunOptions, profile: str, engine: EngineConfig, trace, setup: Any = None) -> SimulatedRun:  # noqa: ANN001, ANN401
    """The configs of the run on this trace: the options it leaves unset from the trace, the
    response caps checked against the trace's, the tool workers of a multi-turn trace."""
    from rlsim.cli.options import check_len

    run = run.with_trace(trace)
    cluster, rl = run.configs(profile)
    check_len(trace, rl.max_response_len, rl.max_model_len)
    return SimulatedRun(cluster, rl, engine, run.tools(trace), profile, setup)
