"""The policy registry: a dict of the registered policies, `module:Class` for users' own
policies, and one small grammar for knobs and the HistoSpec engine feature:

    NAME[(knob=value,...)][+histospec[(knob=value,...)]]

e.g. `rollpacker(eta_p=1.5)+histospec`, `sortedrl(mode=partial,max_staleness=2)`,
`mypkg.mod:MyPolicy`. Knobs are the fields of the policy's `Config` dataclass; values are
converted to the field's type and validated by the dataclass.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from policies.async_partial import AsyncPartialPolicy
from policies.fully_async import AReaLPolicy, FullyAsyncPolicy
from policies.histopipe import HistoPipePolicy
from policies.one_step_off import KStepOffPolicy, OneStepOffPolicy
from policies.oracle import OraclePolicy
from policies.rollpacker import RollPackerPolicy
from policies.seer import SeerPolicy
from policies.sortedrl import SortedRLPolicy
from policies.sync import SyncPolicy
from rlsim.config import DynamicSamplingConfig, SpecConfig
from rlsim.errors import RlsimError

REGISTRY: dict[str, Callable[..., object]] = {
    "sync": SyncPolicy,
    "rollpacker": RollPackerPolicy,
    "sortedrl": SortedRLPolicy,
    "histopipe": HistoPipePolicy,
    "async_partial": AsyncPartialPolicy,
    "one_step_off": OneStepOffPolicy,
    "k_step_off": KStepOffPolicy,
    "fully_async": FullyAsyncPolicy,
    "areal": AReaLPolicy,
    "seer": SeerPolicy,
    "oracle": OraclePolicy,
}

# What `rlsim compare` runs by default: every policy, HistoSpec with the two schedulers it was
# paired with, Seer with and without its grouped drafting, the oracle last. Any other combination
# runs by name (`sync+histospec`).
COMPARE_DEFAULT = (
    "sync",
    "rollpacker",
    "sortedrl",
    "histopipe",
    "async_partial",
    "one_step_off",
    "rollpacker+histospec",
    "histopipe+histospec",
    "seer",
    "seer+grouped_spec",
    "oracle",
)


@dataclass(frozen=True)
class PolicySpec:
    """A parsed policy string: the policy, its knobs, and the features' configs (None: off)."""

    name: str
    knobs: dict[str, Any]
    histospec: SpecConfig | None
    dynamic_sampling: DynamicSamplingConfig | None = None


_PART = re.compile(r"^\s*([A-Za-z_][\w.:]*)\s*(?:\((.*)\))?\s*$")


def _split_outside_parens(text: str, sep: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [*parts, cur]


def split_policies(text: str) -> list[str]:
    """The policy strings of a comma-separated list (`--policies`): split on commas outside
    parentheses, since knob lists hold commas; one sentence where a non-blank list names none."""
    names = [p.strip() for p in _split_outside_parens(text, ",") if p.strip()]
    if text.strip() and not names:
        raise RlsimError(f"--policies {text!r} names no policy; leave it out for the defaults")
    return names


def split_policy(text: str) -> tuple[str, list[str]]:
    """A policy string's policy part and its features (`NAME(knobs)+histospec(...)` ->
    (`NAME(knobs)`, [`histospec(...)`])), split on `+` outside parentheses."""
    base, *features = _split_outside_parens(text, "+")
    return base, features


def with_knob(text: str, knob: str, value: str) -> str:
    """The policy string with `knob=value` added to its policy's knobs, its features kept:
    `fully_async(partial_rollout=false)+histospec` -> `fully_async(partial_rollout=false,KNOB=VALUE)+histospec`."""
    base, features = split_policy(text)
    name, knobs = _parse_part(base)
    knobs[knob] = value
    head = f"{name}({','.join(f'{k}={v}' for k, v in knobs.items())})"
    return "+".join([head, *(f.strip() for f in features)])


def _convert(cls: type, knobs: dict[str, str], what: str) -> dict[str, Any]:
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for key, raw in knobs.items():
        if key not in types:
            raise RlsimError(f"{what} has no knob {key!r}; knobs: {', '.join(types) or 'none'}")
        typ = types[key]
        try:
            if raw.lower() == "none" and "None" in typ:
                out[key] = None
            elif typ.startswith("bool"):
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                out[key] = raw.lower() in ("true", "1")
            elif typ.startswith("int"):
                out[key] = int(raw)
            elif typ.startswith("float"):
                out[key] = float(raw)
                if not math.isfinite(out[key]):
                    raise RlsimError(f"{what} knob {key}={raw!r} must be a finite number")
            else:
                out[key] = raw
        except ValueError:
            raise RlsimError(f"{what} knob {key}={raw!r} is not a valid {typ}") from None
    return out


def _parse_part(part: str) -> tuple[str, dict[str, str]]:
    m = _PART.match(part)
    if not m:
        raise RlsimError(f"cannot parse policy {part.strip()!r}; expected NAME or NAME(knob=value,...)")
    knobs: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in (m.group(2) or "").split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise RlsimError(f"policy knob {item!r} must read knob=value")
        knobs[key.strip()] = value.strip()
    return m.group(1), knobs


def policy_class(name: str) -> type:
    if name in REGISTRY:
        return REGISTRY[name]
    if ":" in name:
        module, _, cls = name.partition(":")
        try:
            found = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError) as exc:
            raise RlsimError(f"cannot load policy {name!r}: {exc}") from None
        told = callable(getattr(found, "on_event", None)) or callable(getattr(found, "on_events", None))
        if not isinstance(found, type) or not callable(getattr(found, "on_step_start", None)) or not told:
            raise RlsimError(
                f"{name!r} is not a policy class (a class with on_step_start and on_event or on_events; "
                "see rlsim/protocol.py)"
            )
        return found
    raise RlsimError(f"unknown policy {name!r}; registered: {', '.join(REGISTRY)} (or module:Class)")


def parse_policy(text: str) -> PolicySpec:
    """Parse `NAME[(knobs)][+histospec[(knobs)]][+dynamic_sampling[(knobs)]]`, checking every knob."""
    base, features = split_policy(text)
    name, raw = _parse_part(base)
    cls = policy_class(name)
    config_cls = getattr(cls, "Config", None)
    if raw and config_cls is None:
        raise RlsimError(f"policy {name!r} takes no knobs")
    knobs = _convert(config_cls, raw, f"policy {name!r}") if raw else {}
    spec = ds = None
    for feat in features:
        fname, fraw = _parse_part(feat)
        if fname == "histospec":
            spec = SpecConfig(**_convert(SpecConfig, fraw, "histospec"))
        elif fname == "grouped_spec":  # Seer's drafts from the group's sibling responses
            spec = SpecConfig(**{"source": "grouped", **_convert(SpecConfig, fraw, "grouped_spec")})
        elif fname == "dynamic_sampling":
            ds = DynamicSamplingConfig(**_convert(DynamicSamplingConfig, fraw, "dynamic_sampling"))
        else:
            raise RlsimError(
                f"unknown feature {fname!r} in {text!r}; available: histospec, grouped_spec, dynamic_sampling"
            )
    return PolicySpec(name, knobs, spec, ds)


def make_policy(text: str) -> object:
    """A fresh policy object from a policy string (see the module docstring)."""
    spec = parse_policy(text)
    cls = policy_class(spec.name)
    try:
        return cls(**spec.knobs)
    except TypeError as exc:
        raise RlsimError(f"cannot build policy {spec.name!r}: {exc}") from None


def _knobs(cfg: type | None) -> str:
    if cfg is None:
        return "none"
    return ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(cfg) if f.name != "source")


def describe() -> list[tuple[str, str, str]]:
    """Every registered policy and engine feature as (name, knobs with defaults, what and where
    from): what `rlsim policies` prints and the knobs table of docs/policies.md is written from."""

    def first_paragraph(doc: str | None) -> str:
        return " ".join((doc or "").strip().split("\n\n")[0].split())

    rows = []
    for name, cls in REGISTRY.items():
        what = first_paragraph(sys.modules[cls.__module__].__doc__ or cls.__doc__)
        # a parameterisation of another policy, not a second one (at its default knobs)
        same = getattr(cls(), "same_as", None)
        if same:
            what = f"= {same}: {first_paragraph(cls.__doc__)}"
        rows.append((name, _knobs(getattr(cls, "Config", None)), what))
    rows.append(("+histospec", _knobs(SpecConfig), "engine feature: RhymeRL HistoSpec, drafts from the last visit"))
    rows.append(("+grouped_spec", _knobs(SpecConfig), "engine feature: Seer, drafts from sibling responses"))
    rows.append(("+dynamic_sampling", _knobs(DynamicSamplingConfig), "DAPO: drops zero-variance groups"))
    return rows
