"""The policy registry: a dict plus a `str` Enum for CLI choices, and `module:Class` for users'
own policies (a class with no required constructor arguments)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from enum import Enum

from policies.sync import SyncPolicy
from rlsim.errors import RlsimError

REGISTRY: dict[str, Callable[[], object]] = {
    "sync": SyncPolicy,
}


class PolicyName(str, Enum):
    """Registered policy names (CLI choices)."""

    sync = "sync"


def make_policy(name: str) -> object:
    """A fresh policy object by registered name or `package.module:Class`."""
    if name in REGISTRY:
        return REGISTRY[name]()
    if ":" in name:
        module, _, cls = name.partition(":")
        try:
            obj = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError) as exc:
            raise RlsimError(f"cannot load policy {name!r}: {exc}") from None
        return obj()
    raise RlsimError(f"unknown policy {name!r}; registered: {', '.join(REGISTRY)} (or module:Class)")
