"""The recorded real runs of tests/data/recorded_runs, validated: docs/real.md's table of them.

    python -m doctables.recorded_runs [--markdown | --readme]

Validates every run of every recorded batch (`python benchmarks/validate_real.py --record
tests/data/recorded_runs` records one) with `rlsim validate`'s API and prints, per run, the rollout
and step time Diff%, the replay's batch identity and the in-run fit's held-out MAPE. Validation
only simulates, so the figures are deterministic: `tests/test_readme_tables.py` holds docs/real.md's
table equal to them, and `tests/test_recorded_runs.py` holds them to docs/real.md's bands.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from rlsim.package_data.markers import emit
from rlsim.real.validate import validate

RECORDED = Path(__file__).resolve().parents[1] / "tests" / "data" / "recorded_runs"


def validated(batch: Path, run: str, tmp: Path) -> dict:
    """`validate` on a copy of the batch's run and its trace, laid out as in the batch (the run names
    its trace relative to itself), so that nothing validation might write lands in the test data."""
    shutil.copy2(batch / "tiny.parquet", tmp / "tiny.parquet")
    return validate(shutil.copytree(batch / run, tmp / run))


def main() -> int:
    head = "| batch | run | rollout time | step time | replay: same batch | in-run fit held-out MAPE |"
    rows = [head, "|---" * 6 + "|"]
    for batch in sorted(d for d in RECORDED.iterdir() if d.is_dir()):
        for run in json.loads((batch / "manifest.json").read_text())["runs"]:
            with tempfile.TemporaryDirectory() as tmp:
                res = validated(batch, run, Path(tmp))
            total, it = res["parts"]["total"], res["parts"]["schedule"]["iterations"]
            cal = batch / run / "calibration" / "profile.json"
            mape = json.loads(cal.read_text())["fit_error"]["heldout_mape"] if cal.exists() else None
            rows.append(
                f"| {batch.name} | {run.removeprefix('run-')} | {total['rollout_time_pct']:+.1f}% | "
                f"{total['step_time_pct']:+.1f}% | {it['same_batch']:,} / {it['real']:,} | "
                f"{'-' if mape is None else f'{mape:.1%}'} |"
            )
    if "--markdown" in sys.argv or "--readme" in sys.argv:
        emit("recorded_runs", "\n".join(rows), sys.argv)
    else:
        print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
