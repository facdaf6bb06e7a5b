"""A result computed once per test run, whichever pytest-xdist worker asks first: the others wait
for it and read it back (a module's fixture would otherwise compute it in every worker that runs
one of the module's tests; the vLLM parity grid took about seven minutes in each of CI's two)."""

from __future__ import annotations

import fcntl
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest


def once(tmp_path_factory: pytest.TempPathFactory, key: str, compute: Callable[[], object]) -> object:
    """`compute()`'s result for `key`, computed by the first worker of this run to ask (pickled)."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # (one per run, shared by its workers)
    root = tmp_path_factory.getbasetemp().parent / f"once-{uid}" if uid else tmp_path_factory.getbasetemp() / "once"
    root.mkdir(parents=True, exist_ok=True)
    path: Path = root / f"{key}.pickle"
    with (root / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return pickle.loads(path.read_bytes())
        value = compute()
        path.write_bytes(pickle.dumps(value))
        return value
