"""The `rlsim compare` tables of the README and docs/simulate.md: the defaults, and DAPO's dynamic sampling.

    python -m doctables.compare_table [--markdown | --readme]

Runs `rlsim compare --markdown` twice on the bundled trace (64 H100s, `h100-qwen2.5-32b-tp4`,
veRL's engine limits, P0 512 x R0 16): with its defaults (every default policy, the trace's two
epochs; about two minutes on a 2-core machine), the table `compare_default`; and sync against
three policies with dynamic sampling over 8 steps (half a minute), `compare_dynamic_sampling`;
and the asynchronous policies with their knobs on a disaggregated cluster (48 rollout GPUs, 16
training), against sync on the same cluster (three minutes), `compare_async`.
`--readme` also writes them into README.md. The simulation is deterministic, and a policy's row
depends on no other policy's but sync's, so `tests/test_readme_tables.py` re-runs each table on
sync and a sample of its policies and holds their rows equal to the table's, and re-runs the
tables whole, as this script does: both among the checks too long for CI (`.ci/long`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rlsim.package_data.markers import emit

ASYNC = (
    "sync,one_step_off,k_step_off(k=2),async_partial,fully_async,fully_async(staleness_threshold=0.1),"
    "fully_async(partial_rollout=false),fully_async(staleness_threshold=1,trigger_parameter_sync_step=1),areal"
)
TABLES = {
    "compare_default": [],
    "compare_dynamic_sampling": ["--policies", "sync,sync+dynamic_sampling,rollpacker+dynamic_sampling,"
                                 "async_partial+dynamic_sampling", "--max-steps", "8"],
    "compare_async": ["--placement", "disaggregated", "--train-gpus", "16", "--policies", ASYNC],
}  # fmt: skip


def main() -> int:
    for name, extra in TABLES.items():
        out = subprocess.run([sys.executable, "-m", "rlsim.cli", "compare", "--markdown", *extra], capture_output=True,
                             text=True, cwd=Path(__file__).resolve().parents[1])  # fmt: skip
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            return out.returncode
        table = out.stdout.strip()
        if "--markdown" in sys.argv or "--readme" in sys.argv:
            emit(name, table, sys.argv)
        else:
            print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
