"""Profiles: the fitted cost model of one rollout instance (one vLLM engine on TP GPUs).

An engine iteration with B running sequences, C tokens of KV context, N_dec new decode (or
draft-verification) tokens and N_pre prefill tokens costs

    t = t_w_s + alpha_s * B + beta_s * C + gamma_s * N_dec + prefill_s_per_token * N_pre
        + prefill_request_s * R_pre

(docs/architecture.md, "The model of time"), R_pre the requests the iteration prefills (vLLM's
`num_ctx_requests`): `prefill_request_s` is the per-request term, each request's scheduling, input
preparation and submission beyond its tokens (0 where not measured or fitted). The rest of the RL
step (old log-probs, reference, update, weight sync, sleep and wake) is costed by `rlsim.step_costs`
from the profile's `model_facts` and `gpu_facts` when it has them (shipped GPU profiles do), else
from the fitted `train` block and `weight_sync_s` (calibrated profiles). `model_facts` also lets
`with_engine` re-derive the KV capacity for another `gpu_memory_utilization`. Profiles are JSON
files (rlsim/profiles/*.json); `load_profile` accepts a path or the name of a shipped profile
and rejects a malformed one with one sentence.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from rlsim.config import EngineConfig
from rlsim.errors import RlsimError
from rlsim.framework_costs import FrameworkSettings
from rlsim.rollout_engines import REGISTRY as ENGINE_REGISTRY
from rlsim.rollout_engines import rollout_engine as engine_entry
from rlsim.roofline import check_roofline

# The engine settings a profile file records, as top-level fields.
PROFILE_ENGINE_FIELDS = (
    "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "block_size", "async_scheduling",
)  # fmt: skip
PROFILE_DIR = Path(str(resources.files("rlsim") / "profiles"))
# 1: the five coefficients; 2: adds linear_t0_s (the compute knee) and the per-term provenance of
# the derivation (rlsim.derive.derive). A version-1 file loads unchanged (its knee is measured from t_w_s).
SCHEMA_VERSION = 2
MAX_ITERATION_S = 60.0  # a profile's iteration of one sequence above this is a unit error


TRAINER_DEFAULTS = {"backend": "", "tp": 1, "pp": 1, "ep": 1, "cp": 1}  # TrainCost's trainer, when not stated


@dataclass(frozen=True, slots=True)
class TrainCost:
    """Training-stage cost: fixed overhead plus FLOPs per trained token at a stated MFU.

    A profile fitted by `rlsim calibrate train` also holds the measured forward pass without gradient
    (veRL's `old_log_prob` and `ref` phases): `forward_fixed_s + tokens * forward_s_per_token`
    on one device, tokens counted padded as its trainer pads them (`padded_micro_batch_tokens`).
    Then the FLOPs terms cost the update alone (`update_actor`); where the forward was not
    measured (0, older profiles) they cost the whole training stage.
    """

    flops_per_token: float
    peak_flops_per_gpu: float
    mfu: float
    fixed_s: float
    forward_fixed_s: float = 0.0
    forward_s_per_token: float = 0.0
    # > 0: the tokens above are padded ones, the trainer padding micro-batches of at most this many
    # tokens to their longest sample (rlsim.real.trainer; rlsim.step_costs.padded_tokens); 0: unpadded
    padded_micro_batch_tokens: int = 0
    # The forward-only passes' (old log-probs, the reference's) own efficiency, where a calibration
    # on a logged run set it apart from the update's (`rlsim.derive.terms`, `forward_mfu`); 0: `mfu`.
    # Over a measured forward (`forward_s_per_token`) it is relative to the measurement (1: as measured).
    forward_mfu: float = 0.0
    # The trainer a derived profile assumes (`rlsim.derive.train`): its backend, whose published
    # MFU `mfu` defaults to, and its layout, which prices what the MFU does not hold (tensor- and
    # expert-parallel traffic, the pipeline's bubble); "" in a fitted profile (measured whole)
    backend: str = ""
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    # What the framework does around the FLOPs (recompute, virtual stages, micro-batches, offload):
    # `rlsim.framework_costs`; written flat in the train block, only what differs from its defaults
    framework: FrameworkSettings = FrameworkSettings()

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name not in ("backend", "framework") and not math.isfinite(getattr(self, f.name)):
                raise RlsimError(f"field 'train.{f.name}' must be a finite number")
        if self.peak_flops_per_gpu <= 0:
            raise RlsimError(f"field 'train.peak_flops_per_gpu' must be positive, got {self.peak_flops_per_gpu}")
        if self.flops_per_token < 0:
            raise RlsimError(f"field 'train.flops_per_token' must be >= 0, got {self.flops_per_token}")
        if not 0 < self.mfu <= 1:
            raise RlsimError(f"field 'train.mfu' must be in (0, 1], got {self.mfu}")
        if not 0 <= self.forward_mfu <= 1:
            raise RlsimError(f"field 'train.forward_mfu' must be in (0, 1] (0: the mfu), got {self.forward_mfu}")
        for name in ("fixed_s", "forward_fixed_s", "forward_s_per_token", "padded_micro_batch_tokens"):
            if getattr(self, name) < 0:
                raise RlsimError(f"field 'train.{name}' must be >= 0, got {getattr(self, name)}")
        for name in ("tp", "pp", "ep", "cp"):
            if getattr(self, name) < 1:
                raise RlsimError(f"field 'train.{name}' must be >= 1, got {getattr(self, name)}")

    def seconds(self, tokens: int, gpus: int) -> float:
        return self.fixed_s + tokens * self.flops_per_token / (gpus * self.peak_flops_per_gpu * self.mfu)

    @property
    def measures_forward(self) -> bool:
        return self.forward_s_per_token > 0

    def forward_seconds(self, tokens: int, gpus: int) -> float:
        """One forward pass without gradient over `tokens` trained tokens (0 where not measured)."""
        if not self.measures_forward:
            return 0.0
        return self.forward_fixed_s + tokens * self.forward_s_per_token / gpus / (self.forward_mfu or 1.0)


@dataclass(frozen=True, slots=True)
class Profile:
    """Cost model of one rollout instance plus training and weight-sync costs."""

    name: str
    hardware: str
    model: str
    tensor_parallel_size: int
    t_w_s: float
    alpha_s: float
    beta_s: float
    gamma_s: float
    prefill_s_per_token: float
    kv_capacity_tokens: int  # KV tokens one instance holds under `engine`
    # The engine its costs hold for (derived at veRL's defaults, or what a calibrated engine ran):
    # max_num_seqs and max_num_batched_tokens always, gpu_memory_utilization where known, block_size,
    # and async_scheduling (vLLM 0.32 turns it on wherever the executor supports it, GPU executors,
    # and the CPU platform turns it off; a file's null follows that rule from `hardware`).
    engine: EngineConfig
    train: TrainCost
    weight_sync_s: float
    spec: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    fit_error: dict[str, Any] = field(default_factory=dict)
    # num_params, num_layers, hidden_size, num_kv_heads, head_dim, dtype_bytes, num_tensors
    model_facts: dict[str, Any] = field(default_factory=dict)
    # memory_bytes, hbm_bytes_per_s, nvlink_bytes_per_s, scale_up_domain, scale_out_bytes_per_s,
    # host_link_bytes_per_s, weight_sync_per_tensor_s (an older file: weight_sync_bytes_per_s)
    gpu_facts: dict[str, Any] = field(default_factory=dict)
    # The linear layers' weight-read time at zero tokens, where the compute knee is measured from
    # (rlsim.derive.derive.closed_form); None in profiles that do not separate it (the knee then uses t_w_s).
    linear_t0_s: float | None = None
    # (decode tokens, seconds) knots of what the line `t_w_s + gamma_s x N` misses where the
    # decode cost is not linear in the tokens (a mixture-of-experts model reads more experts as its
    # batch grows: `rlsim.derive.derive`); interpolated, held past the last knot; empty: linear
    decode_residual_s: tuple[tuple[float, float], ...] = ()
    # Seconds per request an iteration prefills, beyond its tokens (the module docstring)
    prefill_request_s: float = 0.0
    # Pipeline stages of one instance (vLLM's pipeline_parallel_size): the instance takes
    # TP x PP GPUs, each holding a stage's layers (`rlsim.derive.derive`); 1 in a profile without it
    pipeline_parallel_size: int = 1
    # The rollout engine the costs were measured on (`rlsim.rollout_engines`): vLLM for every derived or
    # calibrated profile, SGLang for the slime fit; written only where it is not vLLM
    rollout_engine: str = "vllm"
    # Data-parallel attention with expert parallelism (vLLM's data_parallel_size with
    # enable_expert_parallel): one instance is one DP rank (TP x PP GPUs, its own scheduler and KV),
    # `data_parallel_size` ranks step in lockstep, and their MoE layers' routed experts cost
    # `dp_moe_s` at the group's tokens (`dp_group_s`; `rlsim.derive.derive`); 1 and empty without it
    data_parallel_size: int = 1
    dp_moe_s: tuple[tuple[float, float], ...] = ()
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        for name in (
            "t_w_s",
            "alpha_s",
            "beta_s",
            "gamma_s",
            "prefill_s_per_token",
            "weight_sync_s",
            "prefill_request_s",
        ):
            if getattr(self, name) < 0:
                raise RlsimError(f"profile {self.name}: {name} must be >= 0")
        for name in ("tensor_parallel_size", "kv_capacity_tokens", "pipeline_parallel_size", "data_parallel_size"):
            if getattr(self, name) <= 0:
                raise RlsimError(f"profile {self.name}: {name} must be positive")
        if (self.data_parallel_size > 1) != bool(self.dp_moe_s):
            raise RlsimError(
                f"profile {self.name}: data_parallel_size > 1 and dp_moe_s (the lockstep group's MoE cost) "
                "go together"
            )
        engine = self.engine
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "async_scheduling"):
            if getattr(engine, name) is None:
                raise RlsimError(f"profile {self.name}: its engine's {name} must be set")
        if self.t_w_s + self.alpha_s + self.gamma_s <= 0:
            raise RlsimError(f"profile {self.name}: an iteration must cost time")
        if engine.block_size > self.kv_capacity_tokens:
            raise RlsimError(
                f"profile {self.name}: block_size {engine.block_size} exceeds the KV capacity of "
                f"{self.kv_capacity_tokens} tokens"
            )
        # Seconds per iteration, not per step: an engine iteration of one sequence past a minute, or
        # one at the engine's limits that overflows, is a unit error that would run for ever.
        one = self.t_w_s + self.alpha_s + self.gamma_s
        if one > MAX_ITERATION_S:
            raise RlsimError(
                f"profile {self.name}: one sequence's decode iteration takes {one:.3g} s; the coefficients are "
                f"seconds per iteration (no engine takes over {MAX_ITERATION_S:.0f} s)"
            )
        seqs, kv = engine.max_num_seqs, self.kv_capacity_tokens
        full = self.iteration_s(seqs, kv, seqs, engine.max_num_batched_tokens)
        if not full <= 60 * MAX_ITERATION_S:  # NaN too
            raise RlsimError(
                f"profile {self.name}: an iteration at the engine's limits ({engine.max_num_seqs} sequences, "
                f"{self.kv_capacity_tokens:,} KV tokens) takes {full:.3g} s; a coefficient is in the wrong unit"
            )

    def iteration_s(
        self, batch: int, context: int, decode_tokens: int, prefill_tokens: int = 0, prefill_requests: int = 0
    ) -> float:
        """Time of one engine iteration."""
        return (
            self.t_w_s
            + self.alpha_s * batch
            + self.beta_s * context
            + self.gamma_s * decode_tokens
            + self.prefill_s_per_token * prefill_tokens
            + self.prefill_request_s * prefill_requests
        )

    def compute_excess_s(self, tokens: float) -> float:
        """Time past the compute knee: an iteration's linear layers cannot run faster than its
        tokens at the compute-bound (prefill) rate, `prefill_s_per_token`, whatever the line
        fitted on small decode batches says. Zero below the knee
        `t_w_s / (prefill_s_per_token - gamma_s)` tokens (about 1,200 for the H100 7B profile);
        it binds when speculative decoding verifies several tokens per sequence in a large batch.
        Profiles that state `linear_t0_s` measure the knee from the linear layers' own intercept
        (`rlsim.derive.derive.closed_form`), not from the whole fixed time."""
        t0 = self.t_w_s if self.linear_t0_s is None else self.linear_t0_s
        excess = max(0.0, (self.prefill_s_per_token - self.gamma_s) * tokens - t0)
        return excess + self.decode_residual(tokens) if self.decode_residual_s else excess

    def decode_residual(self, tokens: float) -> float:
        """`decode_residual_s` interpolated at `tokens` (held past the last knot)."""
        return _interpolate(self.decode_residual_s, tokens, extend=False)

    def dp_group_s(self, max_tokens: float, total_tokens: float | None = None) -> float:
        """A data-parallel group's MoE time in one lockstep iteration whose busiest rank runs
        `max_tokens` tokens: vLLM pads every rank's batch to the busiest one's for its CUDA graphs
        (`coordinate_batch_across_dp`), so the experts see `data_parallel_size` x that many
        tokens; under `enforce_eager` (no graphs, no padding) they see the ranks' own,
        `total_tokens` where given. `dp_moe_s` interpolated, extended along its last segment,
        where the experts are compute-bound; 0 without data-parallel attention."""
        if not self.dp_moe_s:
            return 0.0
        eager = self.engine.enforce_eager and total_tokens is not None
        tokens = total_tokens if eager else self.data_parallel_size * max_tokens
        return _interpolate(self.dp_moe_s, max(tokens, 1.0), extend=True)

    @property
    def instance_gpus(self) -> int:
        """GPUs one instance takes: its TP group times its pipeline stages."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def decode_throughput(self, batch: int, context_per_seq: int) -> float:
        """Output tokens per second of a steady decode batch (docs/calibrate.md's sanity line)."""
        return batch / (self.iteration_s(batch, batch * context_per_seq, batch) + self.dp_group_s(batch))

    def to_dict(self) -> dict[str, Any]:
        """The profile's JSON: its engine's recorded settings as top-level fields."""
        out = asdict(self)
        engine = out.pop("engine")
        for name, default in TRAINER_DEFAULTS.items():  # a fitted profile's train block stays as it was written
            if out["train"][name] == default:
                del out["train"][name]
        out["train"].pop("framework")
        if not out["train"]["forward_mfu"]:  # nor one whose forward passes run at the update's MFU
            del out["train"]["forward_mfu"]
        out["train"] |= self.train.framework.stated()
        if not out["prefill_request_s"]:  # a profile without the per-request term is written as before it
            del out["prefill_request_s"]
        if out["pipeline_parallel_size"] == 1:  # nor one without pipeline stages
            del out["pipeline_parallel_size"]
        if engine_entry(out["rollout_engine"]).default:  # nor one measured on the default engine (vLLM)
            del out["rollout_engine"]
        if out["data_parallel_size"] == 1:  # nor one without data-parallel attention
            del out["data_parallel_size"], out["dp_moe_s"]
        return out | {k: engine[k] for k in PROFILE_ENGINE_FIELDS}


def _interpolate(knots: tuple[tuple[float, float], ...], x: float, extend: bool) -> float:
    """Piecewise-linear `knots` at `x`, from (0, 0); past the last knot held, or with `extend`
    continued along the last segment."""
    if x <= 0 or not knots:
        return 0.0
    i = bisect.bisect_left(knots, (x, -math.inf))
    if i >= len(knots):
        if not extend or len(knots) < 2:
            return knots[-1][1]
        i = len(knots) - 1
    (x1, y1), (x0, y0) = knots[i], knots[i - 1] if i else (0.0, 0.0)
    return y1 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def shipped_profiles() -> list[str]:
    """Names of the profiles under rlsim/profiles/."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def _resolve(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        return path
    shipped = PROFILE_DIR / f"{name_or_path}.json"
    if shipped.exists():
        return shipped
    raise RlsimError(f"unknown profile {str(name_or_path)!r}; shipped profiles: {', '.join(shipped_profiles())}")


def profile_from_dict(raw: dict[str, Any], where: str = "profile") -> Profile:
    """Build a `Profile` from parsed JSON, naming the first missing or bad field."""
    optional = (
        "spec", "provenance", "fit_error", "model_facts", "gpu_facts", "gpu_memory_utilization", "block_size",
        "linear_t0_s", "async_scheduling", "schema_version", "decode_residual_s", "prefill_request_s",
        "pipeline_parallel_size", "rollout_engine", "data_parallel_size", "dp_moe_s",
    )  # fmt: skip
    version = raw.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RlsimError(f"{where}: field 'schema_version' must be a positive integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise RlsimError(
            f"{where} is profile schema {version}; this rlsim reads schemas 1-{SCHEMA_VERSION} (upgrade rlsim)"
        )
    required = [f.name for f in fields(Profile) if f.name not in optional and f.name != "engine"]
    required[required.index("kv_capacity_tokens") + 1 : 0] = ["max_num_seqs", "max_num_batched_tokens"]
    for name in required:
        if name not in raw:
            raise RlsimError(f"{where} is missing field '{name}'")
    train = raw["train"]
    if not isinstance(train, dict):
        raise RlsimError(f"{where}: field 'train' must be an object")
    for name in ("flops_per_token", "peak_flops_per_gpu", "mfu", "fixed_s"):
        if name not in train:
            raise RlsimError(f"{where} is missing field 'train.{name}'")
    try:
        kwargs = {k: raw[k] for k in required if k not in ("train", "max_num_seqs", "max_num_batched_tokens")}
        for k in ("tensor_parallel_size", "kv_capacity_tokens"):
            kwargs[k] = int(kwargs[k])
        limits = {k: int(raw[k]) for k in ("max_num_seqs", "max_num_batched_tokens")}
        for k, v in limits.items():
            if v <= 0:
                raise RlsimError(f"{k} must be positive")
        for k in ("t_w_s", "alpha_s", "beta_s", "gamma_s", "prefill_s_per_token", "weight_sync_s"):
            kwargs[k] = float(kwargs[k])
        names = ("flops_per_token", "peak_flops_per_gpu", "mfu", "fixed_s", "forward_fixed_s", "forward_s_per_token",
                 "forward_mfu")  # fmt: skip
        cost = TrainCost(
            **{k: float(train[k]) for k in names if k in train},
            padded_micro_batch_tokens=int(train.get("padded_micro_batch_tokens", 0)),
            backend=str(train.get("backend", "")),
            **{k: int(train[k]) for k in ("tp", "pp", "ep", "cp") if k in train},
            framework=FrameworkSettings.from_values(train),
        )
    except (TypeError, ValueError) as exc:
        raise RlsimError(f"{where}: a field has the wrong type ({exc})") from None
    except RlsimError as exc:
        raise RlsimError(f"{where}: {exc}") from None
    for name in ("model_facts", "gpu_facts"):
        if not isinstance(raw.get(name, {}), dict):
            raise RlsimError(f"{where}: field '{name}' must be an object")
        for key, value in raw.get(name, {}).items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if number and not (math.isfinite(value) and value >= 0):
                raise RlsimError(f"{where}: field '{name}.{key}' must be a finite number >= 0, got {value}")
    bad = [k for k, v in kwargs.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise RlsimError(f"{where}: field '{bad[0]}' must be a finite number")
    for name in ("spec", "provenance", "fit_error"):
        if not isinstance(raw.get(name, {}), dict):
            raise RlsimError(f"{where}: field '{name}' must be an object")
    return Profile(
        train=cost,
        spec=raw.get("spec", {}),
        provenance=raw.get("provenance", {}),
        fit_error=raw.get("fit_error", {}),
        model_facts=raw.get("model_facts", {}),
        gpu_facts=raw.get("gpu_facts", {}),
        engine=_engine(raw, limits, where),
        linear_t0_s=_optional_seconds(raw.get("linear_t0_s"), f"{where}: field 'linear_t0_s'"),
        decode_residual_s=_knots(raw.get("decode_residual_s", []), f"{where}: field 'decode_residual_s'"),
        prefill_request_s=_optional_seconds(raw.get("prefill_request_s"), f"{where}: field 'prefill_request_s'") or 0.0,
        pipeline_parallel_size=_positive_int(
            raw.get("pipeline_parallel_size", 1), f"{where}: field 'pipeline_parallel_size'"
        ),
        rollout_engine=_rollout_engine(raw.get("rollout_engine", "vllm"), f"{where}: field 'rollout_engine'"),
        data_parallel_size=_positive_int(raw.get("data_parallel_size", 1), f"{where}: field 'data_parallel_size'"),
        dp_moe_s=_knots(raw.get("dp_moe_s", []), f"{where}: field 'dp_moe_s'"),
        **kwargs,
    )


def _positive_int(value: Any, where: str) -> int:  # noqa: ANN401 - a JSON value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RlsimError(f"{where} must be a positive integer, got {value!r}")
    return value


def _rollout_engine(value: Any, where: str) -> str:  # noqa: ANN401 - a JSON value
    if value not in ENGINE_REGISTRY:
        raise RlsimError(f"{where} must be one of {', '.join(ENGINE_REGISTRY)}, got {value!r}")
    return value


def default_async_scheduling(hardware: str) -> bool:
    """vLLM 0.32's default: on wherever the executor supports it (GPU executors), off on the CPU
    platform (`VllmConfig` against `CpuPlatform`)."""
    return not hardware.strip().upper().startswith("CPU")


def _engine(raw: dict[str, Any], limits: dict[str, int], where: str) -> EngineConfig:
    """The engine a profile file records; async scheduling, where the file leaves it null, as vLLM
    0.32 sets it: on unless the hardware is a CPU (`VllmConfig`'s default against `CpuPlatform`)."""
    gmu = raw.get("gpu_memory_utilization")
    if gmu is not None and (isinstance(gmu, bool) or not isinstance(gmu, (int, float)) or not 0 < gmu <= 1):
        raise RlsimError(f"{where}: field 'gpu_memory_utilization' must be in (0, 1], got {gmu!r}")
    async_scheduling = _optional_bool(raw.get("async_scheduling"), f"{where}: field 'async_scheduling'")
    if async_scheduling is None:
        async_scheduling = default_async_scheduling(str(raw["hardware"]))
    return EngineConfig(
        gpu_memory_utilization=gmu,
        block_size=_positive_int(raw.get("block_size", 16), f"{where}: field 'block_size'"),
        async_scheduling=async_scheduling,
        **limits,
    )


def _knots(value: Any, what: str) -> tuple[tuple[float, float], ...]:
    """Ascending (tokens > 0, finite seconds) pairs."""
    try:
        knots = tuple((float(x), float(y)) for x, y in value)
    except (TypeError, ValueError):
        raise RlsimError(f"{what} must be a list of [tokens, seconds] pairs") from None
    xs = [x for x, _ in knots]
    if any(x <= 0 or not math.isfinite(x) for x in xs) or xs != sorted(set(xs)):
        raise RlsimError(f"{what}: the tokens must be positive and ascending")
    if not all(math.isfinite(y) for _, y in knots):
        raise RlsimError(f"{what}: the seconds must be finite")
    return knots


def _optional_bool(value: Any, what: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise RlsimError(f"{what} must be true, false or null, got {value!r}")
    return value


def _optional_seconds(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise RlsimError(f"{what} must be a finite number >= 0, got {value!r}")
    return float(value)


def profile_file(name_or_path: str | Path) -> Path:
    """The JSON file of a shipped profile's name, or the path given."""
    return _resolve(name_or_path)


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a profile by shipped name (e.g. `h100-qwen2.5-32b-tp2`) or JSON path."""
    path = _resolve(name_or_path)
    if path.is_dir():
        raise RlsimError(f"profile {path} is a directory; give a profile JSON file or a shipped name")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RlsimError(f"{path}: no such profile file") from None
    except UnicodeDecodeError:
        raise RlsimError(f"{path} is not UTF-8 text (a profile is a JSON file)") from None
    except json.JSONDecodeError as exc:
        raise RlsimError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(raw, dict):
        raise RlsimError(f"{path} must hold a JSON object")
    if "name" not in raw and "hidden_size" in raw | raw.get("text_config", {}):
        raise RlsimError(
            f"{path} is a model config, not a profile: derive one with rlsim profile derive --model {path} --gpu GPU "
            "(or pass --model and --gpu where the command takes them)"
        )
    if "name" in raw and "hbm_bytes_per_s" in raw and "t_w_s" not in raw:
        raise RlsimError(f"{path} is a GPU's datasheet facts, not a profile: pass it as --gpu, with --model")
    profile = profile_from_dict(raw, str(path))
    check_roofline(profile, str(path))
    return profile
