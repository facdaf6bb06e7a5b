"""Benchmark of bad input: drive every command with malformed traces, impossible settings, bad
policies, profiles, grids, paths and run directories, and count the inputs answered with one
`error:` line and exit code 2 (no traceback). Prints each one that is not, then the count.

    python benchmarks/bad_input_sweep.py        # about 2-4 minutes on a 2-core machine

`tests/test_bad_input.py` holds each class the robustness issue names; this sweep is broader.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rlsim.trace.format import META_KEY, save
from rlsim.trace.synth import SynthConfig, synthesize

REPO = Path(__file__).resolve().parent.parent


def bad_traces(d: Path) -> dict[str, str]:
    """Trace files broken in one way each, from a valid one."""
    good = save(synthesize(SynthConfig(num_prompts=32, samples_per_prompt=4, epochs=1, seed=3)), d / "good.parquet")
    t = pq.read_table(good)
    meta = json.loads(t.schema.metadata[META_KEY])
    n = t.num_rows

    def write(name: str, table: pa.Table | None = None, m: object = None) -> str:
        table = t if table is None else table
        if m is not None:
            table = table.replace_schema_metadata({META_KEY: json.dumps(m).encode()})
        pq.write_table(table, d / name)
        return str(d / name)

    def column(name: str, values: pa.Array) -> pa.Table:
        return t.set_column(t.column_names.index(name), name, values)

    (d / "empty.parquet").write_bytes(b"")
    (d / "text.parquet").write_text("hello")
    return {
        "empty file": str(d / "empty.parquet"),
        "text file": str(d / "text.parquet"),
        "directory": str(d / "dir"),
        "missing": str(d / "nope.parquet"),
        "no metadata": write("nometa.parquet", t.replace_schema_metadata({})),
        "metadata a list": write("ml.parquet", m=[1, 2]),
        "cap 0": write("mc0.parquet", m=meta | {"max_response_len": 0}),
        "cap a string": write("mcs.parquet", m=meta | {"max_response_len": "big"}),
        "samples per prompt -1": write("mr.parquet", m=meta | {"samples_per_prompt": -1}),
        "schema version 99": write("ms9.parquet", m=meta | {"schema_version": 99}),
        "no num_output_tokens": write("do.parquet", t.drop_columns(["num_output_tokens"])),
        "negative lengths": write("neg.parquet", column("num_output_tokens", pa.array([-5] * n, pa.int32()))),
        "lengths over the cap": write("oc.parquet", column("num_output_tokens", pa.array([10**6] * n, pa.int32()))),
        "lengths as strings": write("sl.parquet", column("num_output_tokens", pa.array(["a"] * n))),
        "null lengths": write("nl.parquet", column("num_output_tokens", pa.array([None] * n, pa.int32()))),
        "unknown finish reason": write("bf.parquet", column("finish_reason", pa.array(["weird"] * n))),
        "duplicate rows": write("dup.parquet", pa.concat_tables([t, t])),
        "no rows": write("zr.parquet", t.slice(0, 0)),
    }


def cases(d: Path) -> list[tuple[str, list[str]]]:
    """(label, rlsim arguments) for every bad input."""
    (d / "file").write_text("x")
    (d / "dir").mkdir()
    out: list[tuple[str, list[str]]] = []
    for name, tr in bad_traces(d).items():
        out += [
            (f"trace inspect: {name}", ["trace", "inspect", tr]),
            (f"simulate: {name}", ["simulate", "--trace", tr, "--max-steps", "1", "-o", str(d / "o" / name)]),
            (f"compare: {name}", ["compare", "--trace", tr, "--max-steps", "1", "--policies", "sync"]),
            (f"trace fit: {name}", ["trace", "fit", tr, "-o", str(d / f"{name}.json")]),
            (f"plan: {name}", ["plan", "--trace", tr, "--target-epoch-hours", "3", "--steps", "1", "--policies", "sync",
                               "--gpus", "8..8"]),
        ]  # fmt: skip
    g = str(d / "good.parquet")
    sim = [
        ("--gpus", "0"), ("--gpus", "-4"), ("--prompts-per-step", "0"), ("--samples-per-prompt", "99"),
        ("--epochs", "0"), ("--epochs", "9"), ("--max-response-len", "0"), ("--gpu-memory-utilization", "0"),
        ("--gpu-memory-utilization", "2"), ("--gpu-memory-utilization", "nan"), ("--block-size", "0"),
        ("--block-size", "100000000"), ("--placement", "sideways"), ("--dispatch", "random"), ("--profile", "nope"),
        ("--reward-latency", "-1"), ("--reward-latency", "nan"), ("--policy", "rollpacker(eta_p="),
        ("--policy", "rollpacker(nope=1)"), ("--policy", "rollpacker(eta_p=abc)"), ("--policy", "rollpacker(eta_p=-1)"),
        ("--policy", "sync+nope"), ("--policy", "sync+histospec(lookahead=-3)"), ("--policy", "nomod:Cls"),
        ("--max-num-seqs", "0"), ("--max-num-batched-tokens", "0"), ("--seed", "-1"), ("--max-steps", "0"),
        ("--gpus", "abc"), ("--nope", "1"),
    ]  # fmt: skip
    for k, (opt, val) in enumerate(sim):
        out.append((f"simulate {opt} {val}", ["simulate", "--trace", g, opt, val, "-o", str(d / "o" / f"s{k}")]))
    out += [
        ("simulate disaggregated --train-gpus 0",
         ["simulate", "--trace", g, "--placement", "disaggregated", "--train-gpus", "0", "-o", str(d / "o/t0")]),
        ("simulate disaggregated, every GPU training",
         ["simulate", "--trace", g, "--placement", "disaggregated", "--gpus", "8", "--train-gpus", "8",
          "-o", str(d / "o/t1")]),
    ]  # fmt: skip
    synth = [("--num-prompts", "0"), ("--preset", "nope"), ("--preset", str(d / "file")), ("--rho", "2"),
             ("--length-scale", "0"), ("--length-scale", "nan"), ("--clip-ratio", "2"), ("--start-step", "-5"),
             ("--max-response-len", "0")]  # fmt: skip
    for k, (opt, val) in enumerate(synth):
        out.append((f"trace synth {opt} {val}", ["trace", "synth", "-o", str(d / f"synth{k}.parquet"), opt, val]))
    out += [
        ("trace import: missing", ["trace", "import", str(d / "nope"), "-o", str(d / "i0.parquet")]),
        ("trace import: a file", ["trace", "import", str(d / "file"), "-o", str(d / "i1.parquet")]),
        ("trace import: empty folder", ["trace", "import", str(d / "dir"), "-o", str(d / "i2.parquet")]),
        ("trace import: unknown format", ["trace", "import", str(d / "dir"), "--format", "nope", "-o", str(d / "i3")]),
        ("trace compare: missing", ["trace", "compare", g, str(d / "nope.parquet")]),
        ("trace fit --folds 1", ["trace", "fit", g, "-o", str(d / "f1.json"), "--folds", "1"]),
        ("trace fit --folds 999", ["trace", "fit", g, "-o", str(d / "f2.json"), "--folds", "999"]),
        ("profile show: unknown", ["profile", "show", "nope"]),
        ("profile show: not JSON", ["profile", "show", str(d / "file")]),
        ("validate: missing", ["validate", str(d / "nope")]),
        ("validate: a file", ["validate", str(d / "file")]),
        ("run --resume: missing", ["run", "--real", "--resume", "-o", str(d / "nope")]),
        ("run without --real", ["run", "-o", str(d / "r0")]),
        ("run without --model", ["run", "--real", "-o", str(d / "r1")]),
        ("run --lengths bogus", ["run", "--real", "-o", str(d / "r2"), "--model", str(d / "dir"), "--lengths", "x"]),
        ("calibrate fit: missing", ["calibrate", "fit", str(d / "nope"), "-o", str(d / "p.json")]),
        ("calibrate fit --max-mape 0", ["calibrate", "fit", str(d / "dir"),
                                        "-o", str(d / "q.json"), "--max-mape", "0"]),
        ("sweep: missing grid", ["sweep", str(d / "nope.yaml"), "--out", str(d / "sw.parquet")]),
        ("sweep: grid not YAML", ["sweep", str(d / "text.parquet"), "--out", str(d / "sw.parquet")]),
        ("plan --gpus 64..8", ["plan", "--target-epoch-hours", "3", "--gpus", "64..8"]),
        ("plan --target-epoch-hours -1", ["plan", "--target-epoch-hours", "-1"]),
        ("plan --policies nope", ["plan", "--target-epoch-hours", "3", "--policies", "nope"]),
        ("compare --policies ,,", ["compare", "--trace", g, "--policies", ",,"]),
        ("compare --workers -1", ["compare", "--workers", "-1"]),
        ("compare on 1 GPU at TP 4", ["compare", "--trace", g, "--gpus", "1", "--max-steps", "1"]),
        ("an unknown command", ["nope"]),
    ]  # fmt: skip
    grids = {
        "a list": "- 1\n- 2\n", "no grid": "fixed: {gpus: 4}\n", "unknown field": "grid: {nope: [1]}\n",
        "bad value": "grid: {gpus: [a]}\n", "negative GPUs": "grid: {gpus: [-4]}\n", "empty": "",
        "broken YAML": "grid: [\n", "unknown policy": "grid: {policy: [nope]}\n",
        "missing trace": f"fixed: {{trace: {d / 'nope.parquet'}}}\ngrid: {{gpus: [4]}}\n",
    }  # fmt: skip
    for k, (name, text) in enumerate(grids.items()):
        (d / f"grid{k}.yaml").write_text(text)
        out.append((f"sweep: grid {name}", ["sweep", str(d / f"grid{k}.yaml"), "--out", str(d / f"grid{k}.parquet")]))
    return out


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="rlsim-bad-") as tmp:
        return sweep(Path(tmp))


def sweep(d: Path) -> int:
    todo = cases(d)
    env = dict(os.environ, COLUMNS="200")
    failed = 0
    for label, args in todo:
        try:
            p = subprocess.run([sys.executable, "-m", "rlsim.cli", *args], capture_output=True, text=True,
                               timeout=180, env=env, cwd=REPO)  # fmt: skip
        except subprocess.TimeoutExpired:
            print(f"TIMEOUT  {label}")
            failed += 1
            continue
        err = p.stderr.strip().splitlines()
        one_line = p.returncode == 2 and bool(err) and err[-1].startswith("error:")
        if not one_line or "Traceback" in p.stderr + p.stdout:
            failed += 1
            print(f"NOT ONE LINE  {label}: exit {p.returncode}, {(err or [''])[-1][:160]!r}")
    print(f"{len(todo)} bad inputs: {len(todo) - failed} answered with one error line and exit 2, {failed} not")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
