"""Run configuration: frozen, slotted dataclasses validated on construction, one per concern.

Defaults are close to DAPO's recipe (512 prompts x 16 samples per step, 20,480 max response
tokens, Qwen2.5-32B, no KL term) on 64 H100s with rollout TP 2, two epochs. The rollout engine's
limits default to veRL's rollout config (`verl/trainer/config/rollout/rollout.yaml`:
`gpu_memory_utilization: 0.5`, `max_num_seqs: 1024`, `max_num_batched_tokens: 8192`,
`free_cache_engine: True`); vLLM v1 enables prefix caching by default.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from rlsim.errors import RlsimError
from rlsim.rollout_engines import others_settings, rollout_engine

PLACEMENTS = ("colocated", "disaggregated")
MAX_GPUS = 16_384  # a cluster's size rlsim simulates (every instance is simulated, with its KV blocks and timeline)
# least_loaded and round_robin place every sample on its own (veRL's agent loop, slime and AReaL
# send each sample as its own request); per_prompt keeps a prompt's samples together, rotating
# over instances prompt by prompt (rlsim's placement before per-sample dispatch).
DISPATCH = ("least_loaded", "round_robin", "per_prompt")


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """GPUs, the rollout instance cost profile, and how training shares the GPUs."""

    num_gpus: int = 64
    profile: str = "h100-qwen2.5-32b-tp4"  # veRL's DAPO recipe rolls Qwen2.5-32B out at TP 4
    placement: str = "colocated"
    train_gpus: int = 0  # disaggregated only: GPUs of the training pool
    dispatch: str = "least_loaded"

    def __post_init__(self) -> None:
        if self.num_gpus <= 0:
            raise RlsimError(f"num_gpus must be positive, got {self.num_gpus}")
        if self.num_gpus > MAX_GPUS:
            raise RlsimError(
                f"num_gpus {self.num_gpus:,} is beyond what rlsim simulates: at most {MAX_GPUS:,} GPUs (the largest "
                "published RL runs use a few thousand)"
            )
        if self.placement not in PLACEMENTS:
            raise RlsimError(f"placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.dispatch not in DISPATCH:
            raise RlsimError(f"dispatch must be one of {', '.join(DISPATCH)}, got {self.dispatch!r}")
        if self.placement == "disaggregated" and not 0 < self.train_gpus < self.num_gpus:
            raise RlsimError(f"disaggregated placement needs 0 < train_gpus < num_gpus, got {self.train_gpus}")
        if self.placement == "colocated" and self.train_gpus:
            raise RlsimError("train_gpus applies only to the disaggregated placement")

    @property
    def rollout_gpus(self) -> int:
        return self.num_gpus - self.train_gpus if self.placement == "disaggregated" else self.num_gpus

    @property
    def training_gpus(self) -> int:
        return self.train_gpus if self.placement == "disaggregated" else self.num_gpus

    def num_instances(self, instance_gpus: int) -> int:
        """Rollout instances of `instance_gpus` GPUs each (a profile's TP group, times its pipeline stages)."""
        if self.rollout_gpus % instance_gpus:
            raise RlsimError(
                f"{self.rollout_gpus} rollout GPUs are not divisible by the profile's {instance_gpus} GPUs an instance "
                "(its tensor parallel size, times its pipeline stages)"
            )
        return self.rollout_gpus // instance_gpus


def sglang_chunked_prefill_size(gpu_memory_bytes: float) -> int:
    """SGLang 0.5.23's `chunked_prefill_size` where the run leaves it unset, by the GPU's memory
    (`arg_groups/memory_hook.py`, `_handle_gpu_memory_settings`: 2,048 under 20 GiB, 4,096 under
    60, 8,192 under 160 (H100, H200), 16,384 above (B200, MI300))."""
    mib = gpu_memory_bytes / 2**20
    for below, size in ((20 * 1024, 2048), (60 * 1024, 4096), (160 * 1024, 8192)):
        if mib < below:
            return size
    return 16384


@dataclass(frozen=True, slots=True)
class SGLangSettings:
    """What SGLang 0.5.23's admission and retraction read beside its limits: the server argument
    `--schedule-conservativeness` and the environment variables named beside each field (their
    defaults SGLang's). The ratio's start, floor and decay follow as
    `NewTokenRatioTracker.from_config` derives them (`scheduler_components/new_token_ratio_tracker.py`)."""

    schedule_conservativeness: float = 1.0  # --schedule-conservativeness
    init_new_token_ratio: float = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
    min_new_token_ratio_factor: float = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
    new_token_ratio_decay_steps: int = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
    retract_decode_steps: int = 20  # SGLANG_RETRACT_DECODE_STEPS
    clip_max_new_tokens_estimation: int = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION

    def __post_init__(self) -> None:
        if not self.schedule_conservativeness >= 0:
            raise RlsimError(f"schedule_conservativeness must be non-negative, got {self.schedule_conservativeness}")
        for name in ("init_new_token_ratio", "min_new_token_ratio_factor"):
            if not 0 <= getattr(self, name) < math.inf:
                raise RlsimError(f"SGLANG_{name.upper()} must be a non-negative number, got {getattr(self, name)}")
        for name in ("new_token_ratio_decay_steps", "retract_decode_steps", "clip_max_new_tokens_estimation"):
            if getattr(self, name) <= 0:
                raise RlsimError(f"SGLANG_{name.upper()} must be positive, got {getattr(self, name)}")

    @property
    def init_ratio(self) -> float:
        return min(self.init_new_token_ratio * self.schedule_conservativeness, 1.0)

    @property
    def min_ratio(self) -> float:
        return min(self.init_ratio * self.min_new_token_ratio_factor, 1.0)

    @property
    def ratio_decay(self) -> float:
        return (self.init_ratio - self.min_ratio) / self.new_token_ratio_decay_steps

    @staticmethod
    def env_names() -> tuple[str, ...]:
        skip = "schedule_conservativeness"  # (a server argument)
        return tuple(f"SGLANG_{f.name.upper()}" for f in fields(SGLangSettings) if f.name != skip)

    @classmethod
    def parse(cls, env: str | None, schedule_conservativeness: float | None = None) -> SGLangSettings:
        """`--sglang-env NAME=VALUE,...` (SGLang's environment variables above) and the conservativeness."""
        values: dict[str, Any] = {}
        if schedule_conservativeness is not None:
            values["schedule_conservativeness"] = schedule_conservativeness
        names = cls.env_names()
        for part in (env or "").split(","):
            if not part.strip():
                continue
            key, eq, raw = part.partition("=")
            key = key.strip()
            if not eq or key not in names:
                raise RlsimError(f"--sglang-env takes NAME=VALUE pairs of {', '.join(names)}: got {part.strip()!r}")
            name = key.removeprefix("SGLANG_").lower()
            kind = int if isinstance(getattr(cls(), name), int) else float
            try:
                values[name] = kind(raw.strip())
            except ValueError:
                raise RlsimError(f"--sglang-env {key} must be {'an integer' if kind is int else 'a number'}, "
                                 f"got {raw.strip()!r}") from None  # fmt: skip
        return cls(**values)


def option_field(default: Any, help: str, *decls: str, flag: str | None = None, **more: Any) -> Any:  # noqa: A002, ANN401 - the CLI's word
    """A config field with what its command-line option says, as plain metadata (the library
    imports no typer): its help, its names where not `--field-name` (`decls`), a switch's on/off
    name (`flag`), the least value (`min`). `rlsim.cli.engine_options.config_options` declares
    the option from it, once for every command that takes it."""
    return field(default=default, metadata={"help": help, "decls": decls, "flag": flag, **more})


def _knob(default: Any, help: str, flag: str | None = None) -> Any:  # noqa: A002, ANN401 - the CLI's word
    return option_field(default, help, flag=flag)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The vLLM engine of every rollout instance, one object from the CLI to the scheduler, with
    vLLM's and veRL's names.

    A profile holds the engine its costs hold for (`Profile.engine`: a shipped GPU profile is
    derived at veRL's defaults, a calibrated one records what its engine ran);
    `rlsim.step_costs.with_engine` lays a run's settings over it, a `None` keeping the profile's,
    and every part of a run (the simulated scheduler, the driver, the policies, real engines)
    then reads the settings from that one object. `gpu_memory_utilization` re-derives the KV
    capacity from the profile's model and GPU facts.
    """

    gpu_memory_utilization: float | None = _knob(
        None, "vLLM gpu_memory_utilization; re-derives KV capacity (default: the profile's, veRL's 0.5)."
    )
    max_num_seqs: int | None = _knob(None, "vLLM max_num_seqs (default: the profile's, veRL's 1024).")
    max_num_batched_tokens: int | None = _knob(
        None, "vLLM max_num_batched_tokens (default: the profile's, veRL's 8192)."
    )
    enable_prefix_caching: bool = _knob(True, "vLLM prefix caching.", "enable-prefix-caching")
    free_cache_engine: bool = _knob(
        True,
        "Colocated engines sleep through training (KV freed, weights offloaded), so carried requests "
        "re-prefill, as veRL's hybrid engine.",
        "free-cache-engine",
    )
    block_size: int | None = _knob(None, "vLLM block_size: KV tokens per block (default: the profile's, 16).")
    enable_chunked_prefill: bool = _knob(True, "vLLM chunked prefill.", "enable-chunked-prefill")
    async_scheduling: bool | None = _knob(
        None,
        "vLLM async scheduling: the next batch is scheduled before the last one's tokens are known "
        "(default: the profile's platform: on for GPU profiles, off for CPU-calibrated ones, as vLLM 0.32).",
        "async-scheduling",
    )
    enforce_eager: bool | None = _knob(
        None,
        "vLLM enforce_eager: no CUDA graphs, every kernel launched from Python; each iteration pays a launch "
        "cost per layer (default: off, vLLM's).",
        "enforce-eager",
    )
    schedule_policy: str | None = _knob(
        None,
        "SGLang --schedule-policy (rollout engine sglang only): fcfs (SGLang's default) or lpm, longest cached "
        "prefix first, which SGLang turns back into fcfs over a queue of more than 128.",
    )
    parallel_sampling: bool | None = _knob(
        None,
        "SGLang (rollout engine sglang only): send each launch's samples of a prompt as one request with n > 1, "
        "which SGLang's tokenizer manager turns into a prefill of the prompt alone before the n samples (default: "
        "off, one request per sample, as veRL, slime and AReaL send them). Needs --dispatch per_prompt.",
        "parallel-sampling",
    )
    schedule_conservativeness: float | None = _knob(
        None,
        "SGLang --schedule-conservativeness (rollout engine sglang only): scales the new-token ratio its admission "
        "reserves for running requests' outputs (default: 1.0, SGLang's).",
    )
    page_size: int | None = _knob(
        None,
        "SGLang --page-size (rollout engine sglang only): KV tokens a page; the radix cache matches, holds and evicts "
        "whole pages, admission reserves by the page, decoding takes a page as a request's tokens start one "
        "(default: 1, SGLang's; SGLang raises it to 64 under FlashMLA and TRT-LLM MLA, to 128 under FA4 on "
        "Blackwell: give what the run's attention backend takes).",
    )
    sglang_env: str | None = _knob(
        None,
        "SGLang's scheduling environment variables (rollout engine sglang only), NAME=VALUE,...: "
        "SGLANG_INIT_NEW_TOKEN_RATIO (0.7), SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR (0.14), "
        "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS (600), SGLANG_RETRACT_DECODE_STEPS (20), "
        "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION (4096).",
    )
    rollout_engine: str = _knob(
        "vllm",
        "Whose scheduling rules the rollout instances follow: vllm (0.32) or sglang (0.5.23). Under sglang, "
        "gpu_memory_utilization is mem_fraction_static, max_num_seqs max_running_requests, max_num_batched_tokens "
        "chunked_prefill_size, prefix caching the radix cache, enforce_eager disable_cuda_graph.",
    )

    def __post_init__(self) -> None:
        u = self.gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise RlsimError(f"gpu_memory_utilization must be in (0, 1], got {u}")
        if self.block_size is not None and self.block_size <= 0:
            raise RlsimError(f"block_size must be positive, got {self.block_size}")
        if self.page_size is not None and self.page_size <= 0:
            raise RlsimError(f"page_size must be positive, got {self.page_size}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise RlsimError(f"{name} must be positive, got {v}")
        rollout_engine(self.rollout_engine)  # (an unknown one: one sentence)
        self.sglang_settings()  # (refused here, in one sentence, not at the first schedule)

    def sglang_settings(self) -> SGLangSettings:
        """SGLang's conservativeness and ratio settings of this run (SGLang's defaults where unset)."""
        return SGLangSettings.parse(self.sglang_env, self.schedule_conservativeness)

    def check_settings_for_engine(self) -> None:
        """Refuse a run's setting that its rollout engine does not have (call before `over`: a
        profile's own settings are vLLM's names for what both engines share)."""
        this = rollout_engine(self.rollout_engine)
        for name, owner in others_settings(this.name).items():
            if getattr(self, name) is not None:
                article = "an" if owner.label[0] in "AEFHILMNORSX" else "a"
                raise RlsimError(
                    f"{name} is {article} {owner.label} setting that {this.label} does not have{this.lacks_note}: "
                    f"drop it or use --rollout-engine {owner.name}"
                )

    def per_rollout_engine(self, value: str) -> list[EngineConfig]:
        """`--rollout-engine vllm,sglang`: these settings under each engine named, in order. Under
        more than one, a setting only one engine has goes to that engine's runs only."""
        names = [v.strip() for v in value.split(",") if v.strip()]
        if not names:
            raise RlsimError("--rollout-engine is empty: use vllm, sglang or vllm,sglang")
        if len(set(names)) < len(names):
            raise RlsimError(f"--rollout-engine names an engine twice: {value}")
        for name in names:
            rollout_engine(name)
        both = len(names) > 1
        out = [replace(self, rollout_engine=n, **dict.fromkeys(others_settings(n) if both else (), None))
               for n in names]  # fmt: skip
        for e in out:
            e.check_settings_for_engine()
        return out

    def over(self, base: EngineConfig) -> EngineConfig:
        """These settings, with each unset (`None`) one taken from `base`."""
        return replace(self, **{
            f.name: getattr(base, f.name) for f in fields(self) if getattr(self, f.name) is None
        })  # fmt: skip

    def set_values(self) -> dict[str, Any]:
        """The vLLM settings that are not `None`, by name (what a vLLM engine is given): not which
        engine's rules the simulator follows, nor a setting only SGLang has."""
        skip = ("rollout_engine", *others_settings("vllm"))
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True, slots=True)
class RLConfig:
    """The RL step: batch shape, response cap, run length, reward cost, seed."""

    prompts_per_step: int = 512
    samples_per_prompt: int = 16
    max_response_len: int = 20480
    epochs: int = 2
    max_steps: int | None = None
    reward_latency_s: float = 0.05
    reward_workers: int = 64
    use_kl_loss: bool = False  # DAPO drops the KL term; with it on, a reference model scores every batch
    seed: int = 0
    # vLLM's max_model_len: a request's response is capped at min(max_response_len, max_model_len
    # less its prompt), as vLLM caps it (None: max_response_len alone)
    max_model_len: int | None = None

    def response_cap(self, prompt_tokens):  # noqa: ANN001, ANN201 - a numpy or pandas array, the same kind back
        """Each request's response cap given its prompt tokens, as vLLM applies it."""
        if self.max_model_len is None:
            return prompt_tokens * 0 + self.max_response_len
        return (self.max_model_len - prompt_tokens.astype("int64")).clip(None, self.max_response_len)

    def __post_init__(self) -> None:
        for name in (
            "prompts_per_step",
            "samples_per_prompt",
            "max_response_len",
            "epochs",
            "reward_workers",
        ):
            if getattr(self, name) <= 0:
                raise RlsimError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps <= 0:
            raise RlsimError(f"max_steps must be positive, got {self.max_steps}")
        if not (math.isfinite(self.reward_latency_s) and self.reward_latency_s >= 0):
            raise RlsimError(f"reward_latency_s must be a finite number >= 0, got {self.reward_latency_s}")
        if self.seed < 0:
            raise RlsimError(f"seed must be >= 0, got {self.seed}")
        if self.max_model_len is not None and not 1 < self.max_model_len < 2**31:
            raise RlsimError(f"max_model_len must be between 2 and {2**31 - 1:,} tokens, got {self.max_model_len}")


def config_dict(*configs: Any) -> dict[str, Any]:
    """Configs as one JSON-ready dict keyed by class name (echoed into every result file)."""
    return {type(c).__name__: asdict(c) for c in configs}


@dataclass(frozen=True, slots=True)
class DynamicSamplingConfig:
    """`max_num_gen_batches`: generation batches per step before training on what is valid
    (0: no limit)."""

    max_num_gen_batches: int = 10

    def __post_init__(self) -> None:
        if self.max_num_gen_batches < 0:
            raise RlsimError(f"max_num_gen_batches must be >= 0, got {self.max_num_gen_batches}")


SPEC_SOURCES = ("auto", "parametric", "tokens", "grouped")


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """HistoSpec knobs (`--policy sync+histospec(source=parametric,acceptance_prob=0.8)`)."""

    source: str = "auto"  # tokens when the trace has token ids, else parametric
    acceptance_prob: float | None = None  # parametric only; default: profile, else 0.75
    min_draft: int = 2
    max_draft: int = 16
    init_draft: int = 2
    lookahead: int | None = None  # KV slots reserved per speculating request; None = max_draft
    draft_us: float = 2.5  # drafter CPU time per speculating request per verify step
    drift: float = 0.002  # relative acceptance lost per policy version between visits

    def __post_init__(self) -> None:
        if self.source not in SPEC_SOURCES:
            raise RlsimError(f"histospec source must be one of {', '.join(SPEC_SOURCES)}, got {self.source!r}")
        if self.acceptance_prob is not None and not 0.0 <= self.acceptance_prob < 1.0:
            raise RlsimError(f"histospec acceptance_prob must lie in [0, 1), got {self.acceptance_prob}")
        if not 1 <= self.min_draft <= self.init_draft <= self.max_draft:
            raise RlsimError("histospec needs 1 <= min_draft <= init_draft <= max_draft")
        if self.lookahead is not None and self.lookahead < 0:
            raise RlsimError("histospec lookahead must be >= 0")
        if self.draft_us < 0:
            raise RlsimError("histospec draft_us must be >= 0")
        if not 0.0 <= self.drift < 1.0:
            raise RlsimError(f"histospec drift must lie in [0, 1), got {self.drift}")
