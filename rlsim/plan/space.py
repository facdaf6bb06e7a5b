"""The planner's search space: every (policy, GPUs, placement, rollout TP, engine knobs, response
cap) a user asks about, checked and expanded into candidates before anything is simulated.

- **GPUs**: a range (`16..256`: powers of two and both ends) or a list (`16,32,64`).
- **Placement**: `colocated` (rollout and training share every GPU, veRL's hybrid engine) or
  `disaggregated` at each `train_shares` fraction of the GPUs for training; the rollout pool is
  rounded down to whole instances and training gets the rest (the split actually simulated is in
  each candidate's `train_gpus`).
- **Rollout TP**: the profile's family, the shipped profiles of the same model on the same GPU at
  other tensor-parallel sizes (`tp_family`); they are derived from the same model facts and
  iteration model (`rlsim.package_data.profiles`), so only TP changes between them. A calibrated
  profile has no family: only its own TP can be searched.
- **Engine knobs**: `max_num_seqs` and `gpu_memory_utilization` (None keeps the profile's); the
  engine's other settings are held fixed, as given (`Candidate.engine`).
- **Rollout engine**: whose scheduling rules the instances follow, `vllm`, `sglang` or both
  (`EngineConfig.per_rollout_engine`: a setting only one engine has goes to that engine's
  candidates only). Speculating policies (HistoSpec) are searched under vLLM's rules only, where
  speculative decoding is modelled.
- **Response cap**: `max_response_len`, each with the clip ratio it implies on the user's trace
  (the share of the trace's samples longer than the cap, which are then cut).
- **Staleness**: for the policies with a staleness knob (`fully_async`'s `staleness_threshold`,
  `areal`'s `max_head_offpolicyness`, integers only), each value of `staleness` set in the
  policy string (`fully_async(staleness_threshold=0.5)`); other policies are searched once.
  A policy that runs only disaggregated (`fully_async`, `areal`) is searched only there.

Every impossible question is one sentence (an `RlsimError`): an empty space, a split that leaves
no training GPU or no rollout instance, a TP that does not divide a colocated GPU count, a GPU
budget below one instance.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlsim.config import MAX_GPUS, PLACEMENTS, EngineConfig
from rlsim.errors import RlsimError
from rlsim.profile import PROFILE_DIR, load_profile, shipped_profiles
from rlsim.rollout_engines import DEFAULT as DEFAULT_ENGINE
from rlsim.rollout_engines import REGISTRY as ENGINES
from rlsim.rollout_engines import rollout_engine
from rlsim.text import counted

SEARCHED_ENGINE_FIELDS = ("max_num_seqs", "gpu_memory_utilization")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One configuration the planner may simulate."""

    policy: str
    num_gpus: int
    placement: str
    train_gpus: int  # disaggregated: the training pool; colocated: 0 (training uses every GPU)
    tp: int
    profile: str  # the profile of that TP
    max_num_seqs: int | None = None
    gpu_memory_utilization: float | None = None
    max_response_len: int = 20480
    # the engine settings the search holds fixed: `EngineConfig` fields by name (the two above searched)
    engine: dict[str, Any] = field(default_factory=dict)

    def engine_config(self) -> EngineConfig:
        """The candidate's one engine configuration."""
        return EngineConfig(
            **self.engine, max_num_seqs=self.max_num_seqs, gpu_memory_utilization=self.gpu_memory_utilization
        )

    @property
    def rollout_gpus(self) -> int:
        return self.num_gpus - self.train_gpus

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def label(self) -> str:
        """Short and readable: `64 GPUs, disagg 48+16, TP 4, seqs 256, mem 0.8` (led by the rollout
        engine where it is not vLLM: `SGLang, 64 GPUs, ...`)."""
        place = "coloc" if self.placement == "colocated" else f"disagg {self.rollout_gpus}+{self.train_gpus}"
        parts = [counted(self.num_gpus, "GPU"), place, f"TP {self.tp}"]
        rollout = rollout_engine(self.engine.get("rollout_engine", DEFAULT_ENGINE))
        if not rollout.default:
            parts.insert(0, rollout.label)
        if self.max_num_seqs is not None:
            parts.append(f"seqs {self.max_num_seqs}")
        if self.gpu_memory_utilization is not None:
            parts.append(f"mem {self.gpu_memory_utilization:g}")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """The lists the candidates are the product of (one value each: that dimension is fixed)."""

    policies: tuple[str, ...]
    gpus: tuple[int, ...]
    placements: tuple[str, ...] = ("colocated",)
    train_shares: tuple[float, ...] = (0.25,)
    tps: tuple[int, ...] = ()  # empty: the profile's own TP
    max_num_seqs: tuple[int | None, ...] = (None,)
    gpu_memory_utilization: tuple[float | None, ...] = (None,)
    max_response_len: tuple[int, ...] = (20480,)
    staleness: tuple[float, ...] = ()  # empty: each policy's own
    rollout_engines: tuple[str, ...] = ("vllm",)

    def __post_init__(self) -> None:
        names = ("policies", "gpus", "placements", "max_num_seqs", "gpu_memory_utilization", "max_response_len",
                 "rollout_engines")  # fmt: skip
        for name in names:
            if not getattr(self, name):
                raise RlsimError(f"the search space is empty: no {name.replace('_', ' ')} to try")
        for p in self.placements:
            if p not in PLACEMENTS:
                raise RlsimError(f"--placement must be among {', '.join(PLACEMENTS)}, got {p!r}")
        if "disaggregated" in self.placements and not self.train_shares:
            raise RlsimError("the search space is empty: disaggregated placement needs at least one --train-share")
        for s in self.train_shares:
            if not 0 < s < 1:
                raise RlsimError(f"--train-share must be a fraction between 0 and 1, got {s:g}")
        for g in self.gpus:
            if g < 1:
                raise RlsimError(f"a GPU count must be positive, got {g}")
        for t in self.tps:
            if t < 1:
                raise RlsimError(f"--tp must be positive, got {t}")
        for v in self.max_num_seqs:
            if v is not None and v < 1:
                raise RlsimError(f"--max-num-seqs must be positive, got {v}")
        for u in self.gpu_memory_utilization:
            if u is not None and not 0 < u <= 1:
                raise RlsimError(f"--gpu-memory-utilization must be in (0, 1], got {u:g}")
        for c in self.max_response_len:
            if c < 1:
                raise RlsimError(f"--max-response-len must be positive, got {c}")
        for v in self.staleness:
            if v < 0:
                raise RlsimError(f"--staleness must be >= 0, got {v:g}")


def parse_list(text: str, kind: type, what: str) -> tuple:
    """`"256,1024"` -> (256, 1024); an empty text is an empty tuple."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            out.append(kind(part))
        except ValueError:
            raise RlsimError(f"{what} must be a comma-separated list of {kind.__name__} values, got {text!r}") from None
    return tuple(out)


def parse_gpus(text: str) -> tuple[int, ...]:
    """`16..256` (powers of two and both ends) or `16,32,64`."""
    if ".." in text:
        lo, _, hi = text.partition("..")
        try:
            a, b = int(lo), int(hi)
        except ValueError:
            raise RlsimError(f"--gpus must look like 8..256 or 16,32,64, got {text!r}") from None
        if a < 1 or b < a:
            raise RlsimError(f"--gpus must be a range of at least 1 GPU, low end first, got {text!r}")
        vals = tuple(sorted({a, b} | {2**k for k in range(20) if a <= 2**k <= b}))
    else:
        try:
            vals = parse_list(text, int, "--gpus")
        except RlsimError:
            vals = ()
        if not vals:
            raise RlsimError(f"--gpus must look like 8..256 or 16,32,64, got {text!r}")
    if max(vals) > MAX_GPUS or min(vals) < 1:
        raise RlsimError(f"--gpus {text}: rlsim simulates from 1 to at most {MAX_GPUS:,} GPUs")
    return tuple(sorted(set(vals)))


def tp_family(profile: str) -> dict[int, str]:
    """TP -> profile name: the shipped profiles of `profile`'s model on its GPU at every TP
    (its own TP alone for a profile outside the shipped families). A profile file's family is
    the files beside it named as it is but for the TP (`rlsim profile derive` names them
    `GPU-MODEL-tpN[-epN][-fp8]`; `rlsim plan --model` derives the family there)."""
    base = load_profile(profile)
    family = {base.tensor_parallel_size: profile}
    tag = f"-tp{base.tensor_parallel_size}"
    if str(profile).endswith(".json") and tag in base.name:
        head, _, tail = base.name.partition(tag)
        for path in sorted(Path(profile).parent.glob(f"{head}-tp*.json")):
            p = load_profile(path)
            if p.name == f"{head}-tp{p.tensor_parallel_size}{tail}":
                family.setdefault(p.tensor_parallel_size, str(path))
    if not str(profile).endswith(".json") and (PROFILE_DIR / f"{profile}.json").exists():
        gpu = base.hardware.split("x ", 1)[-1]
        for name in shipped_profiles():
            p = load_profile(name)
            if p.model == base.model and p.hardware.split("x ", 1)[-1] == gpu:
                family.setdefault(p.tensor_parallel_size, name)
    return dict(sorted(family.items()))


STALENESS_KNOBS = {"fully_async": "staleness_threshold", "areal": "max_head_offpolicyness"}


def with_staleness(policy: str, values: Sequence[float]) -> list[str]:
    """The policy string once per staleness value, for a policy with a staleness knob
    (`fully_async(partial_rollout=false)` -> `fully_async(partial_rollout=false,staleness_threshold=0.5)`);
    the string alone otherwise, or when it sets the knob itself."""
    from policies.registry import parse_policy, split_policy, with_knob

    base, _ = split_policy(policy)
    knob = STALENESS_KNOBS.get(parse_policy(policy).name)
    if knob is None or not values or f"{knob}=" in base:
        return [policy]
    out = []
    for v in values:
        if knob == "max_head_offpolicyness":
            if v != int(v):
                continue
            v = int(v)
        out.append(with_knob(policy, knob, f"{v:g}"))
    return out or [policy]


def speculates(policy: str) -> bool:
    """Whether the policy drafts tokens (HistoSpec), which only vLLM's rules model."""
    from policies.registry import parse_policy

    return parse_policy(policy).histospec is not None


def disaggregated_only(policy: str) -> bool:
    """Whether the policy runs only on a disaggregated cluster (its class says `placement`)."""
    from policies.registry import parse_policy, policy_class

    return getattr(policy_class(parse_policy(policy).name), "placement", None) == "disaggregated"


def candidates(
    space: SearchSpace, profile: str, gpu_budget: int | None = None, engine: EngineConfig | None = None
) -> list[Candidate]:
    """Every candidate of the space (GPU counts above `gpu_budget` left out), in a fixed order,
    each under `engine` with the searched max_num_seqs and gpu_memory_utilization."""
    base, default = engine or EngineConfig(), EngineConfig()
    fixed_by_engine = {}  # per rollout engine: the settings held fixed, defaults left out of the key
    for e in base.per_rollout_engine(",".join(space.rollout_engines)):
        held = {k: v for k, v in asdict(e).items() if k not in SEARCHED_ENGINE_FIELDS}
        fixed_by_engine[e.rollout_engine] = {k: v for k, v in held.items() if v != getattr(default, k)}
    family = tp_family(profile)
    tps = space.tps or tuple(t for t, name in family.items() if name == profile)
    missing = [t for t in tps if t not in family]
    if missing:
        raise RlsimError(
            f"no profile of {profile} at TP {', '.join(map(str, missing))}: its family has TP "
            f"{', '.join(map(str, family))}"
        )
    gpus = [g for g in space.gpus if gpu_budget is None or g <= gpu_budget]
    if gpu_budget is not None:
        if gpu_budget < min(tps):
            t = min(tps)
            raise RlsimError(f"--gpu-budget {gpu_budget} is below one rollout instance (TP {t}: {t} GPUs)")
        if not gpus:
            raise RlsimError(f"the search space is empty: every GPU count in --gpus is above --gpu-budget {gpu_budget}")
    for pol in space.policies:
        if "disaggregated" not in space.placements and disaggregated_only(pol):
            raise RlsimError(f"{pol} runs only disaggregated: add --placement disaggregated")
    policies = [v for pol in space.policies for v in with_staleness(pol, space.staleness)]
    speculating = {pol for pol in policies if speculates(pol)}
    if speculating and not any(rollout_engine(r).speculates for r in space.rollout_engines):
        them = [e for e in ENGINES.values() if e.speculates]
        raise RlsimError(
            f"{sorted(speculating)[0]} speculates (HistoSpec), which is modelled under "
            f"{' and '.join(e.label for e in them)}'s rules only: add --rollout-engine {them[0].name}"
        )
    out = []
    for g in gpus:
        for tp in tps:
            places: list[tuple[str, int]] = []
            if "colocated" in space.placements:
                if g % tp:
                    raise RlsimError(f"--tp {tp} does not divide {g} GPUs: a colocated rollout needs whole instances")
                places.append(("colocated", 0))
            if "disaggregated" in space.placements:
                for share in space.train_shares:
                    train = round(g * share)
                    if train < 1:
                        raise RlsimError(
                            f"--train-share {share:g} of {g} GPUs leaves no training GPU ({g * share:g}); raise the "
                            "share or the GPU count"
                        )
                    rollout = (g - train) // tp * tp
                    if rollout < tp:
                        raise RlsimError(
                            f"--train-share {share:g} of {g} GPUs leaves {g - train} for rollout, less than one "
                            f"TP {tp} instance; lower the share or raise the GPU count"
                        )
                    if ("disaggregated", g - rollout) not in places:
                        places.append(("disaggregated", g - rollout))
            knobs = itertools.product(
                places, space.max_num_seqs, space.gpu_memory_utilization, space.max_response_len, policies,
                space.rollout_engines,
            )  # fmt: skip
            for (place, train), seqs, util, cap, pol, rollout in knobs:
                if place == "colocated" and disaggregated_only(pol):
                    continue
                if not rollout_engine(rollout).speculates and pol in speculating:
                    continue
                fixed = fixed_by_engine[rollout]
                out.append(Candidate(pol, g, place, train, tp, family[tp], seqs, util, cap, dict(fixed)))
    if not out:
        raise RlsimError("the search space is empty")
    return out


def clip_ratio(lengths: Sequence[int] | object, cap: int) -> float:
    """Share of the trace's samples that reach `cap` (cut there when it is the response limit)."""
    arr = np.asarray(lengths)
    return float((arr >= cap).mean()) if arr.size else math.nan
