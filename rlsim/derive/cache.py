"""Derived profiles where every `--profile` reads them: a profile from a model's config and a GPU's
datasheet (`rlsim.derive.derive`), with fitted terms laid over it on request, written under the
user's cache (`rlsim.paths.cache_dir`) in a folder keyed by everything its name leaves out.

`profile_or_derived` is what the simulating commands do with `--profile` or `--model/--gpu/--tp`,
`derive_family` what `rlsim plan --model/--gpu` does (one profile per TP, side by side), and
`profile_with_terms` lays terms over a given profile.
"""

from __future__ import annotations

import hashlib
import json
import sys

from rlsim.config import EngineConfig
from rlsim.errors import RlsimError
from rlsim.paths import cache_dir


def derived_profile_path(
    model: str,
    gpu: str,
    tp: int,
    ep: int = 1,
    dtype: str = "bf16",
    trainer: str = "fsdp2",
    terms: str | None = None,
    pp: int = 1,
    dp: int = 1,
    gpu_memory_utilization: float | None = None,
    kv_cache_dtype: str | None = None,
) -> str:
    """Derive the profile and write it under ~/.cache/rlsim/profiles (or $RLSIM_CACHE_DIR); its path.
    The folder is keyed by everything the profile's name leaves out (the model's config, the GPU's
    facts, the trainer, the terms, the memory fraction and a KV cache dtype other than the
    weights'), so that two runs deriving the same name with other settings never read each
    other's file; the TPs of one setting lie side by side, as `rlsim plan` finds them.
    `gpu_memory_utilization`: the run's (None: veRL's 0.5), so that the weights are held against
    the memory the run gives vLLM, not against the default's; `kv_cache_dtype`: the KV cache's
    (None: `dtype`'s)."""
    from rlsim.derive.derive import derive_profile, setup
    from rlsim.derive.terms import load_terms
    from rlsim.derive.train import Trainer
    from rlsim.files import atomic_write_text

    s, parsed = setup(model, gpu, tp, ep, dtype, kv_cache_dtype, pp=pp, dp=dp), Trainer.parse(trainer)
    raw = derive_profile(s, EngineConfig(gpu_memory_utilization=gpu_memory_utilization), parsed)
    fitted = None
    if terms:
        fitted, _ = load_terms(terms)
        raw = lay_terms(raw, terms)
    key = json.dumps(
        [repr(s.model), repr(s.gpu), repr(parsed), repr(fitted)]
        + ([gpu_memory_utilization] if gpu_memory_utilization is not None else [])
        + ([s.kv_cache_dtype] if s.kv_cache_dtype != s.dtype else [])
    )
    root = cache_dir() / "profiles"
    folder = root / hashlib.sha256(key.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{raw['name']}.json"
    atomic_write_text(path, json.dumps(raw, indent=2) + "\n")
    return str(path)


def lay_terms(raw: dict, terms: str) -> dict:
    """The profile `raw` with the terms of `terms` (a shipped name or a file) laid over it: a
    calibrated file's record in its provenance (the bands' basis), and one sentence on stderr
    where that file was calibrated over another derivation of this profile."""
    from rlsim.derive.terms import calibrated_provenance, derivation_warning, load_terms, terms_record

    fitted, provenance = load_terms(terms)
    record = terms_record(terms)
    warning = derivation_warning(record, raw, terms)
    if warning:
        print(warning, file=sys.stderr)
    out = fitted.apply(raw, provenance)
    calibrated = calibrated_provenance(record, terms)
    if calibrated is not None:
        out.setdefault("provenance", {})
        if not isinstance(out["provenance"], dict):
            out["provenance"] = {"source": out["provenance"]}
        out["provenance"]["calibrated"] = calibrated
    return out


def profile_with_terms(profile: str, terms: str) -> str:
    """A given profile (measured, or derived elsewhere) with `terms` laid over it, written beside
    the derived ones (keyed by both files' contents); its path."""
    from rlsim.files import atomic_write_text, read_json_object
    from rlsim.profile import load_profile, profile_file

    load_profile(profile)  # a bad profile is its own sentence, before the terms
    raw = lay_terms(read_json_object(profile_file(profile)), terms)
    key = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]
    folder = cache_dir() / "profiles" / key
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{raw.get('name', 'profile')}.json"
    atomic_write_text(path, json.dumps(raw, indent=2) + "\n")
    return str(path)


def profile_or_derived(
    profile: str,
    model: str | None,
    gpu: str | None,
    tp: int,
    ep: int,
    dtype: str,
    trainer: str = "fsdp2",
    terms: str | None = None,
    pp: int = 1,
    dp: int = 1,
    gpu_memory_utilization: float | None = None,
) -> str:
    """`--profile`, or the profile `--model/--gpu/--tp` derive (the two are exclusive), at the
    run's `gpu_memory_utilization` (None: veRL's default)."""
    if model is None and gpu is None:
        if trainer != "fsdp2" or pp != 1 or dp != 1:
            raise RlsimError(
                "--trainer, --pp and --dp go with --model and --gpu: a given --profile states its own costs"
            )
        return profile_with_terms(profile, terms) if terms else profile  # terms lie over any profile
    if model is None or gpu is None:
        raise RlsimError("--model and --gpu go together (with --tp): they derive the profile")
    return derived_profile_path(
        model, gpu, tp, ep, dtype, trainer, terms, pp, dp, gpu_memory_utilization=gpu_memory_utilization
    )


def derive_family(
    model: str | None,
    gpu: str | None,
    tps: tuple[int, ...],
    dtype: str,
    trainer: str = "fsdp2",
    terms: str | None = None,
    gpu_memory_utilization: float | None = None,
    kv_cache_dtype: str | None = None,
) -> tuple[str, tuple[int, ...]]:
    """`rlsim plan --model M --gpu G`: the derived profile at every TP asked (default: 1, 2, 4 and
    8 where the model derives: heads divided, weights fitting, within the scale-up domain), side by
    side so that the planner finds them as one family; the smallest TP's path, and the TPs.
    `gpu_memory_utilization`: the smallest the plan searches (None: veRL's default), so that the
    weights fit at every memory fraction searched; `kv_cache_dtype`: the KV cache's (None: `dtype`'s)."""
    if model is None or gpu is None:
        raise RlsimError("--model and --gpu go together: they derive the profiles the plan searches")
    paths: dict[int, str] = {}
    for t in tps or (1, 2, 4, 8):
        try:
            paths[t] = derived_profile_path(
                model, gpu, t, dtype=dtype, trainer=trainer, terms=terms,
                gpu_memory_utilization=gpu_memory_utilization, kv_cache_dtype=kv_cache_dtype,
            )  # fmt: skip
        except RlsimError:
            if tps:
                raise
    if not paths:
        raise RlsimError(f"{model} derives on {gpu} at none of TP 1, 2, 4, 8 (see rlsim profile derive)")
    return paths[min(paths)], tuple(sorted(paths))
