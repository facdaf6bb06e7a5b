"""PlanCache: every planner estimate kept by its configuration, so a second question reuses the first's points.

The key holds the candidate, the RL step, the steps simulated, the seed, and digests of the trace
file, the profile and rlsim's own source (`code_digest`): a changed simulator never reuses a stale
point. The file is JSON lines, one appended per estimate; a line cut short by a crash is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import policies
import rlsim


def digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:  # noqa: PTH123
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def code_digest() -> str:
    """Of rlsim's and the policies' source: a changed simulator invalidates the cache."""
    h = hashlib.sha256()
    for pkg in (rlsim, policies):
        root = Path(pkg.__file__).parent
        for f in sorted(root.rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


class PlanCache:
    """Estimates by configuration key, in a JSON-lines file (one line appended per estimate; a line
    cut short by a crash is skipped on reading). `path=None`: in memory only."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.rows: dict[str, dict[str, Any]] = {}
        self.hits = 0
        if path is not None and path.exists():
            for line in path.read_text(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                    self.rows[entry["key"]] = entry["row"]
                except (ValueError, KeyError, TypeError):
                    continue

    def get(self, key: str) -> dict[str, Any] | None:
        row = self.rows.get(key)
        if row is not None:
            self.hits += 1
        return row

    def put(self, key: str, row: dict[str, Any]) -> None:
        self.rows[key] = row
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:  # noqa: PTH123
                f.write(json.dumps({"key": key, "row": row}) + "\n")


def default_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rlsim" / "plan.jsonl"
