"""Fuzz `rlsim.trace.format.load`: mutated columns, dtypes, values, metadata and bytes of a small valid
trace either load as a trace that keeps the schema or raise `TraceError`, nothing else.

The default run draws 300 derandomized cases; the long run draws fresh random ones:
`RLSIM_FUZZ_EXAMPLES=10000 python -m pytest tests/test_trace_fuzz.py`."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rlsim.trace.format import FINISH_REASONS, META_KEY, TraceError, load, save, validate_table
from rlsim.trace.synth import SynthConfig, synthesize

LONG = int(os.environ.get("RLSIM_FUZZ_EXAMPLES", "0"))
SETTINGS = settings(
    max_examples=LONG or 300, deadline=None, derandomize=not LONG, suppress_health_check=list(HealthCheck)
)

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)  # fmt: skip
ARROW_TYPES = [pa.int8(), pa.int32(), pa.int64(), pa.uint64(), pa.float32(), pa.float64(), pa.string(), pa.bool_()]


@pytest.fixture(scope="module")
def valid() -> tuple[bytes, pa.Table]:
    trace = synthesize(SynthConfig(num_prompts=6, samples_per_prompt=2, epochs=2, seed=1, max_response_len=512))
    with tempfile.TemporaryDirectory() as d:
        path = save(trace, Path(d) / "t.parquet")
        return path.read_bytes(), pq.read_table(path)


def _check(path: Path) -> None:
    """Either a TraceError, or a trace whose rows and metadata keep the schema."""
    try:
        trace = load(path)
    except TraceError:
        event("refused with TraceError")
        return
    event("loaded, schema held")
    df, meta = trace.table, trace.meta
    validate_table(df, meta, str(path))
    assert isinstance(meta.max_response_len, int) and 0 < meta.max_response_len < 2**63
    assert isinstance(meta.source, str) and isinstance(meta.model, str)
    assert (df["num_output_tokens"] > 0).all() and (df["num_output_tokens"] <= meta.max_response_len).all()
    assert ((df["sample_idx"] >= 0) & (df["sample_idx"] < meta.samples_per_prompt)).all()
    assert df["finish_reason"].astype(str).isin(FINISH_REASONS).all()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for every case: each overwrites the same file, so a long run leaves no litter."""
    return tmp_path_factory.mktemp("fuzz")


def _write(d: Path, table: pa.Table, meta: dict | bytes | None = None) -> Path:
    if meta is not None:
        blob = meta if isinstance(meta, bytes) else json.dumps(meta, default=str).encode()
        table = table.replace_schema_metadata({META_KEY: blob})
    path = d / "t.parquet"
    pq.write_table(table, path)
    return path


@SETTINGS
@given(data=st.data())
def test_mutated_traces_load_or_raise_trace_error(
    valid: tuple[bytes, pa.Table], workdir: Path, data: st.DataObject
) -> None:
    blob, table = valid
    kind = data.draw(st.sampled_from(["bytes", "meta", "drop", "cast", "value", "meta_bytes"]))
    meta = json.loads(table.schema.metadata[META_KEY])
    if kind == "bytes":
        raw = bytearray(blob)
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
        path = workdir / "t.parquet"
        path.write_bytes(bytes(raw))
    elif kind == "meta":
        key = data.draw(st.sampled_from([*meta, "extra"]))
        if data.draw(st.booleans()) and key in meta:
            del meta[key]
        else:
            meta[key] = data.draw(VALUES)
        path = _write(workdir, table, meta)
    elif kind == "meta_bytes":
        path = _write(workdir, table, data.draw(st.binary(max_size=40)))
    elif kind == "drop":
        path = _write(workdir, table.drop_columns([data.draw(st.sampled_from(table.column_names))]))
    elif kind == "cast":
        name = data.draw(st.sampled_from(table.column_names))
        typ = data.draw(st.sampled_from(ARROW_TYPES))
        try:
            col = table[name].cast(typ, safe=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            event("mutation not representable: nothing loaded")
            return
        path = _write(workdir, table.set_column(table.column_names.index(name), name, col))
    else:
        name = data.draw(st.sampled_from([c for c in table.column_names if c != "output_token_ids"]))
        values = table[name].to_pylist()
        i = data.draw(st.integers(0, len(values) - 1))
        values[i] = data.draw(VALUES)
        try:
            col = pa.array(values, type=table.schema.field(name).type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            event("mutation not representable: nothing loaded")
            return
        path = _write(workdir, table.set_column(table.column_names.index(name), name, col))
    _check(path)
