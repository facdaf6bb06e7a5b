"""The README's main table: `rlsim compare` with its defaults on the bundled trace, as Markdown.

    python benchmarks/compare_table.py [--markdown | --readme]

Runs `rlsim compare --markdown` (every default policy, 64 H100s, `h100-qwen2.5-32b-tp4`, veRL's
engine limits, P0 512 x R0 16, the trace's two epochs; about two minutes on a 2-core machine) and
prints its table; `--readme` also writes it into README.md. The simulation is deterministic, so
`tests/test_readme_tables.py` re-runs it in CI and holds the README's table equal to it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from readme_tables import emit


def main() -> int:
    out = subprocess.run([sys.executable, "-m", "rlsim.cli", "compare", "--markdown"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    if out.returncode:
        print(out.stderr, file=sys.stderr)
        return out.returncode
    table = out.stdout.strip()
    if "--markdown" in sys.argv or "--readme" in sys.argv:
        emit("compare_default", table, sys.argv)
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
