"""The trace format: round trip, metadata, and one clear error per kind of bad file."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.errors import TraceError
from rlsim.trace.format import META_KEY, Trace, TraceMeta, load, save


def test_round_trip_keeps_rows_types_and_metadata(tmp_path: Path, small_trace: Trace) -> None:
    """A saved trace loads back with the same rows and metadata."""
    path = save(small_trace, tmp_path / "t.parquet")
    back = load(path)
    assert back.meta == small_trace.meta
    cols = ["epoch", "prompt_id", "sample_idx", "num_prompt_tokens", "num_output_tokens"]
    pd.testing.assert_frame_equal(
        back.table[cols].reset_index(drop=True),
        small_trace.table[cols].reset_index(drop=True),
        check_dtype=False,
    )
    assert list(back.table["finish_reason"].astype(str)) == list(small_trace.table["finish_reason"])
    schema = pq.ParquetFile(path).schema_arrow
    assert schema.field("num_output_tokens").type == pa.int32()
    assert json.loads(schema.metadata[META_KEY])["schema_version"] == 1  # single-turn: written as schema 1
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "ZSTD"


def test_optional_columns_round_trip(tmp_path: Path, small_trace: Trace) -> None:
    """reward, prompt_text and output_token_ids survive a round trip."""
    df = small_trace.table.copy()
    df["reward"] = 1.0
    df["prompt_text"] = "p" + df["prompt_id"].astype(str)
    df["output_token_ids"] = [list(range(n)) for n in df["num_output_tokens"]]
    path = save(Trace(df, small_trace.meta), tmp_path / "t.parquet")
    back = load(path)
    assert back.table["reward"].eq(1.0).all()
    assert list(back.table["output_token_ids"].iloc[0]) == list(range(df["num_output_tokens"].iloc[0]))
    assert str(back.table["prompt_text"].iloc[0]) == "p" + str(df["prompt_id"].iloc[0])


def _write(tmp_path: Path, df: pd.DataFrame, meta: TraceMeta | None, name: str = "bad.parquet") -> Path:
    table = pa.Table.from_pandas(df, preserve_index=False)
    if meta is not None:
        table = table.replace_schema_metadata({META_KEY: meta.to_json().encode()})
    path = tmp_path / name
    pq.write_table(table, path)
    return path


def _bad_cases(tmp_path: Path, trace: Trace) -> dict[str, tuple[Path, str]]:
    df, meta = trace.table.copy(), trace.meta
    cases = {}
    cases["missing column"] = (
        _write(tmp_path, df.drop(columns="num_output_tokens"), meta, "a.parquet"),
        "missing required column 'num_output_tokens'",
    )
    mistyped = df.copy()
    mistyped["num_output_tokens"] = mistyped["num_output_tokens"].astype(str)
    cases["mistyped"] = (
        _write(tmp_path, mistyped, meta, "b.parquet"),
        "column 'num_output_tokens' has type",
    )
    zero = df.copy()
    zero.loc[3, "num_output_tokens"] = 0
    cases["zero length"] = (
        _write(tmp_path, zero, meta, "c.parquet"),
        "num_output_tokens must be positive",
    )
    neg = df.copy()
    neg.loc[5, "num_prompt_tokens"] = -4
    cases["negative"] = (
        _write(tmp_path, neg, meta, "d.parquet"),
        "num_prompt_tokens must be positive",
    )
    over = df.copy()
    over.loc[2, "num_output_tokens"] = meta.max_response_len + 1
    cases["over max"] = (
        _write(tmp_path, over, meta, "e.parquet"),
        "longer than max_response_len=20480",
    )
    uneven = df.drop(index=[0])
    cases["uneven"] = (
        _write(tmp_path, uneven, meta, "f.parquet"),
        "samples per prompt are not constant within epoch 0",
    )
    dup = pd.concat([df, df.iloc[[10]]])
    cases["duplicate"] = (_write(tmp_path, dup, meta, "g.parquet"), "duplicate rows")
    cases["empty"] = (_write(tmp_path, df.iloc[:0], meta, "h.parquet"), "is empty")
    text = tmp_path / "i.parquet"
    text.write_text("epoch,prompt_id\n0,1\n")
    cases["not parquet"] = (text, "is not a Parquet file")
    cases["no metadata"] = (_write(tmp_path, df, None, "j.parquet"), "has no rlsim trace metadata")
    reason = df.copy()
    reason["finish_reason"] = "abort"
    cases["finish_reason"] = (_write(tmp_path, reason, meta, "k.parquet"), "finish_reason must be")
    cases["missing file"] = (tmp_path / "nope.parquet", "no such file")
    return cases


CASES = [
    "missing column",
    "mistyped",
    "zero length",
    "negative",
    "over max",
    "uneven",
    "duplicate",
    "empty",
    "not parquet",
    "no metadata",
    "finish_reason",
    "missing file",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_file_raises_trace_error(tmp_path: Path, small_trace: Trace, case: str) -> None:
    """Each kind of bad file raises TraceError whose message names the problem."""
    path, expected = _bad_cases(tmp_path, small_trace)[case]
    with pytest.raises(TraceError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load(path)


@pytest.mark.parametrize("case", CASES)
def test_bad_file_gives_one_line_and_exit_2(tmp_path: Path, small_trace: Trace, case: str) -> None:
    """Through the CLI, each bad file is one line on stderr and exit code 2, no traceback."""
    path, expected = _bad_cases(tmp_path, small_trace)[case]
    result = CliRunner().invoke(app, ["trace", "inspect", str(path)])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and expected.split("(")[0] in err
    assert "Traceback" not in result.output


def test_token_ids_must_match_lengths(tmp_path: Path, small_trace: Trace) -> None:
    """output_token_ids whose length differs from num_output_tokens is rejected."""
    df = small_trace.table.copy()
    df["output_token_ids"] = [[1, 2, 3]] * len(df)
    with pytest.raises(TraceError, match="output_token_ids length differs"):
        save(Trace(df, small_trace.meta), tmp_path / "t.parquet")


def test_metadata_samples_per_prompt_must_match_rows(tmp_path: Path, small_trace: Trace) -> None:
    """Metadata claiming more samples per prompt than the rows hold is rejected."""
    meta = TraceMeta(**{**small_trace.meta.__dict__, "samples_per_prompt": 8})
    with pytest.raises(TraceError, match="samples_per_prompt=8 but the rows hold 4"):
        save(Trace(small_trace.table, meta), tmp_path / "t.parquet")


def test_save_does_not_clobber_on_error(tmp_path: Path, small_trace: Trace) -> None:
    """A failed save leaves an existing file untouched."""
    path = save(small_trace, tmp_path / "t.parquet")
    before = path.read_bytes()
    df = small_trace.table.copy()
    df.loc[0, "num_output_tokens"] = -1
    with pytest.raises(TraceError):
        save(Trace(df, small_trace.meta), path)
    assert path.read_bytes() == before
