"""The recorded real runs of tests/data/recorded_runs, validated: docs/real.md's table of them.

    python benchmarks/recorded_runs.py [--markdown | --readme]

Validates every run of every recorded batch (`python benchmarks/validate_real.py --record
tests/data/recorded_runs` records one) with `rlsim validate`'s API and prints, per run, the rollout
and step time Diff%, the replay's batch identity and the in-run fit's held-out MAPE. Validation
only simulates, so the figures are deterministic: `tests/test_readme_tables.py` holds docs/real.md's
table equal to them, and `tests/test_recorded_runs.py` holds them to docs/real.md's bands.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from readme_tables import emit

from rlsim.real.validate import validate

RECORDED = Path(__file__).resolve().parents[1] / "tests" / "data" / "recorded_runs"


def validated(batch: Path, run: str, tmp: Path) -> dict:
    """`validate` on a copy of the batch's run and its trace, laid out as in the batch (the run names
    its trace relative to itself), so that nothing validation might write lands in the test data."""
    shutil.copy2(batch / "tiny.parquet", tmp / "tiny.parquet")
    return validate(shutil.copytree(batch / run, tmp / run))


def relativize(batch: Path, recorded_from: Path) -> None:
    """Rewrite every path of `batch` that names a file of the folder it was recorded from relative to
    the run directory that holds it (the batch itself for its own files, `records/` for the
    calibration records'), in its JSON files and its Parquet files' metadata, so that committed data
    names no machine's absolute paths and the batch works in any clone. The model's path is kept so,
    as provenance; validation opens only the trace, which the runs name relative to themselves."""
    root = str(recorded_from.resolve())

    def rewrite(value: object, base: Path) -> object:
        if isinstance(value, dict):
            return {k: rewrite(v, base) for k, v in value.items()}
        if isinstance(value, list):
            return [rewrite(v, base) for v in value]
        if isinstance(value, str) and (value == root or value.startswith(root + "/")):
            return Path(os.path.relpath(batch / value[len(root) + 1 :], base)).as_posix()
        return value

    for path in sorted(batch.rglob("*")):
        rel = path.relative_to(batch)
        base = batch / rel.parts[0] if len(rel.parts) > 1 else batch
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            if (new := rewrite(data, base)) != data:
                indent = 2 if path.read_text().startswith("{\n") else None
                path.write_text(json.dumps(new, indent=indent) + "\n")
        elif path.suffix == ".parquet":
            table = pq.read_table(path)
            old = table.schema.metadata or {}
            meta = {k: json.dumps(rewrite(json.loads(v), base)).encode() if _is_json(v) else v for k, v in old.items()}
            if meta != old:
                codec = pq.ParquetFile(path).metadata.row_group(0).column(0).compression.lower()
                pq.write_table(table.replace_schema_metadata(meta), path, compression=codec)


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


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
