"""Dotted keys of a resolved framework config (a nested dict), as the readers and writers look them up."""

from __future__ import annotations

from typing import Any

from rlsim.errors import RlsimError

ABSENT = object()


def get(cfg: dict, key: str, default: Any = None) -> Any:  # noqa: ANN401 - a config value
    """`cfg`'s value at the dotted `key`, or `default` where a part of it is missing."""
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def has(cfg: dict, key: str) -> bool:
    return get(cfg, key, ABSENT) is not ABSENT


def positive_int(cfg: dict, key: str, where: str, default: int | None = None) -> int:
    """`cfg`'s positive integer at `key` (or `default`), or one sentence naming the key."""
    v = get(cfg, key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise RlsimError(f"{where}: {key} must be a positive integer, got {v!r}")
    return v
