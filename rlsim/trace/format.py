"""The trace format: what the model *would* generate for prompt p on its e-th visit.

One Parquet row per sampled response. Policies decide when, where and whether a response is
generated; the trace only says how long it is (and, optionally, its tokens and reward). Column
names follow vLLM (`num_prompt_tokens`, `num_output_tokens`, `finish_reason`).

Trace-level facts live in the Parquet schema metadata under the key ``rlsim.trace`` as JSON
(`TraceMeta`). `load` validates a file and raises `TraceError` with one sentence naming the
first problem found; `save` writes zstd-compressed Parquet deterministically (same table, same
bytes for a given pyarrow version).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rlsim.errors import TraceError
from rlsim.files import atomic_save
from rlsim.trace import turns

SCHEMA_VERSION = 2  # 2: a sample may have turns (multi-turn, tool-calling rollouts); 1 migrates unchanged
META_KEY = b"rlsim.trace"
FINISH_REASONS = ("stop", "length")

# Column -> (arrow type written by `save`, kind accepted by `load`).
REQUIRED_COLUMNS: dict[str, tuple[pa.DataType, str]] = {
    "epoch": (pa.int32(), "integer"),
    "prompt_id": (pa.int64(), "integer"),
    "sample_idx": (pa.int32(), "integer"),
    "num_prompt_tokens": (pa.int32(), "integer"),
    "num_output_tokens": (pa.int32(), "integer"),
    "finish_reason": (pa.string(), "string"),
}
OPTIONAL_COLUMNS: dict[str, tuple[pa.DataType, str]] = {
    "step": (pa.int32(), "integer"),  # training step of a real log (the dataloader then follows the log's order)
    "reward": (pa.float32(), "float"),
    "reward_time_s": (pa.float32(), "float"),  # seconds to score the sample (else the run's reward latency)
    "output_token_ids": (pa.list_(pa.int32()), "list<integer>"),
    "prompt_text": (pa.string(), "string"),
    "target_len": (pa.int32(), "integer"),  # a built-in task's stated length (rlsim.trace.tasks), scored by length
    # schema 2, multi-turn (rlsim.trace.turns): per turn, its output tokens and how it ended ("tool", then
    # "stop"/"length" last); per tool call (one after each "tool" turn), its seconds and the tokens it appends
    "turn_output_tokens": (pa.list_(pa.int32()), "list<integer>"),
    "turn_finish_reason": (pa.list_(pa.string()), "list<string>"),
    "tool_latency_s": (pa.list_(pa.float32()), "list<float>"),
    "tool_append_tokens": (pa.list_(pa.int32()), "list<integer>"),
}
KEY_COLUMNS = ["epoch", "prompt_id", "sample_idx"]


@dataclass(frozen=True)
class TraceMeta:
    """Trace-level facts stored in the Parquet schema metadata."""

    model: str
    max_response_len: int
    samples_per_prompt: int
    source: str  # "synthetic:<preset>" or "real:<run id>"
    source_params: dict[str, Any] = field(default_factory=dict)
    output_token_ids: str | None = None  # None, "synthetic" or "real"
    schema_version: int = SCHEMA_VERSION
    max_model_len: int | None = None  # the context cap a multi-turn trajectory's prompt, turns and tool tokens fit

    def __post_init__(self) -> None:
        for name in ("max_response_len", "samples_per_prompt"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TraceError(f"{name} must be an integer, got {value!r}")
            if value >= 2**63:
                raise TraceError(f"{name} must fit in 64 bits, got {value}")
        version = self.schema_version
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
            raise TraceError(
                f"schema_version {version!r}: this rlsim reads trace schema 1 to {SCHEMA_VERSION} "
                "(a newer rlsim wrote it?)"
            )
        for name in ("model", "source"):
            if not isinstance(getattr(self, name), str):
                raise TraceError(f"{name} must be a string, got {getattr(self, name)!r}")
        if not isinstance(self.source_params, dict):
            raise TraceError(f"source_params must be an object, got {self.source_params!r}")
        if self.max_response_len <= 0:
            raise TraceError(f"max_response_len must be positive, got {self.max_response_len}")
        if self.samples_per_prompt <= 0:
            raise TraceError(f"samples_per_prompt must be positive, got {self.samples_per_prompt}")
        if self.max_model_len is not None and (
            isinstance(self.max_model_len, bool) or not isinstance(self.max_model_len, int) or self.max_model_len <= 0
        ):
            raise TraceError(f"max_model_len must be a positive integer, got {self.max_model_len!r}")
        if not (self.source.startswith("synthetic:") or self.source.startswith("real:")):
            raise TraceError(f"source must start with 'synthetic:' or 'real:', got {self.source!r}")

    def to_json(self) -> str:
        raw = asdict(self)
        if raw["max_model_len"] is None:  # single-turn traces keep the metadata (and bytes) they had
            del raw["max_model_len"]
        return json.dumps(raw, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> TraceMeta:
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict):
                raise TypeError("not a JSON object")
            known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
            meta = cls(**known)
            if meta.schema_version < SCHEMA_VERSION:  # 1 -> 2: single-turn rows are schema-2 rows as they are
                meta = dataclasses.replace(meta, schema_version=SCHEMA_VERSION)
            return meta
        except TraceError as exc:
            raise TraceError(f"{where}: metadata invalid: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise TraceError(f"{where}: metadata is not valid rlsim trace metadata ({exc})") from None


@dataclass(frozen=True)
class Trace:
    """A validated trace: the per-response table plus its metadata."""

    table: pd.DataFrame
    meta: TraceMeta

    @property
    def epochs(self) -> list[int]:
        return sorted(int(e) for e in self.table["epoch"].unique())

    @property
    def num_prompts(self) -> int:
        return int(self.table["prompt_id"].nunique())

    def visit(self, epoch: int) -> pd.DataFrame:
        """All responses of one epoch (visit index), sorted by prompt and sample."""
        return self.table[self.table["epoch"] == epoch]


def _kind_ok(kind: str, dtype: pa.DataType) -> bool:
    if kind == "integer":
        return pa.types.is_integer(dtype)
    if kind == "float":
        return pa.types.is_floating(dtype) or pa.types.is_integer(dtype)
    if kind == "string":
        if pa.types.is_dictionary(dtype):
            dtype = dtype.value_type
        return pa.types.is_string(dtype) or pa.types.is_large_string(dtype)
    if kind.startswith("list<"):
        return (pa.types.is_list(dtype) or pa.types.is_large_list(dtype)) and _kind_ok(kind[5:-1], dtype.value_type)
    raise AssertionError(kind)


def _read_table(path: Path, columns: list[str] | None) -> tuple[pa.Table, TraceMeta]:
    where = str(path)
    if not path.exists():
        raise TraceError(f"{where}: no such file")
    if path.is_dir():
        raise TraceError(f"{where} is a directory, not a Parquet trace file")
    try:
        schema = pq.ParquetFile(path).schema_arrow
    except (pa.ArrowException, OSError, ValueError) as exc:  # ValueError: a footer that is not UTF-8
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise TraceError(f"{where} is not a Parquet file ({first})") from None
    raw_meta = (schema.metadata or {}).get(META_KEY)
    if raw_meta is None:
        raise TraceError(
            f"{where} has no rlsim trace metadata; write traces with rlsim.trace.format.save "
            "or convert real logs with `rlsim trace import`"
        )
    try:
        text = raw_meta.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"{where}: its rlsim metadata is not UTF-8 text") from None
    meta = TraceMeta.from_json(text, where)
    for name in REQUIRED_COLUMNS:
        if name not in schema.names:
            raise TraceError(f"{where} is missing required column '{name}'")
    for name, (_, kind) in {**REQUIRED_COLUMNS, **OPTIONAL_COLUMNS}.items():
        if name in schema.names and not _kind_ok(kind, schema.field(name).type):
            raise TraceError(f"{where}: column '{name}' has type {schema.field(name).type}, expected {kind}")
    wanted = None
    if columns is not None:
        turn_cols = [c for c in turns.TURN_COLUMNS if c in schema.names]  # a trajectory is its turns: always read
        wanted = list(dict.fromkeys([*REQUIRED_COLUMNS, *columns, *turn_cols]))
        missing = [c for c in wanted if c not in schema.names]
        if missing:
            raise TraceError(f"{where} is missing requested column '{missing[0]}'")
    read_dict = [c for c in ("prompt_text", "finish_reason") if c in schema.names]
    try:
        table = pq.read_table(path, columns=wanted, read_dictionary=read_dict)
        table.validate(full=True)  # strings that are not UTF-8, offsets past the data
    except (pa.ArrowException, OSError, ValueError) as exc:  # corrupt pages, codec errors
        raise TraceError(f"{where}: its data cannot be read ({str(exc).splitlines()[0]})") from None
    if table.num_rows == 0:
        raise TraceError(f"{where} is empty: it has no rows")
    return table, meta


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def validate_table(df: pd.DataFrame, meta: TraceMeta, where: str = "trace") -> None:
    """Raise `TraceError` naming the first inconsistency between rows and metadata."""
    if len(df) == 0:
        raise TraceError(f"{where} is empty: it has no rows")
    for name in REQUIRED_COLUMNS:
        if name not in df.columns:
            raise TraceError(f"{where} is missing required column '{name}'")
        if df[name].isna().any():
            row = _first_bad(df[name].isna().to_numpy())
            raise TraceError(f"{where}: column '{name}' has a missing value (row {row})")
    for name in ("num_prompt_tokens", "num_output_tokens"):
        bad = df[name].to_numpy() <= 0
        if bad.any():
            raise TraceError(
                f"{where}: {name} must be positive, but {int(bad.sum())} rows are <= 0 (first at row {_first_bad(bad)})"
            )
    for name in ("epoch", "prompt_id", "sample_idx"):
        bad = df[name].to_numpy() < 0
        if bad.any():
            raise TraceError(f"{where}: {name} must be >= 0 (row {_first_bad(bad)})")
    bad = df["sample_idx"].to_numpy() >= meta.samples_per_prompt
    if bad.any():
        row = _first_bad(bad)
        raise TraceError(
            f"{where}: sample_idx must be below samples_per_prompt={meta.samples_per_prompt}, "
            f"got {int(df['sample_idx'].iloc[row])} (row {row})"
        )
    if meta.max_model_len is None and turns.has_turns(df):  # else its turns would grow without a context cap
        raise TraceError(
            f"{where} holds multi-turn trajectories but no max_model_len in its metadata: the context cap their "
            "prompt, turns and tool answers fit in (the log's, or the engine's max_model_len)"
        )
    longest = turns.longest_turn(df)  # a multi-turn trajectory's cap is per turn (its max_new_tokens)
    over = longest > meta.max_response_len
    if over.any():
        row = _first_bad(over)
        raise TraceError(
            f"{where}: {int(over.sum())} {'turns' if turns.has_turns(df) else 'responses'} are longer than "
            f"max_response_len={meta.max_response_len} (first at row {row}: {int(longest[row])} tokens)"
        )
    reasons = df["finish_reason"].astype(str)
    bad = ~reasons.isin(FINISH_REASONS).to_numpy()
    if bad.any():
        raise TraceError(
            f"{where}: finish_reason must be 'stop' or 'length', got "
            f"{reasons.iloc[_first_bad(bad)]!r} (row {_first_bad(bad)})"
        )
    dup = df.duplicated(KEY_COLUMNS).to_numpy()
    if dup.any():
        row = df.iloc[_first_bad(dup)]
        raise TraceError(
            f"{where} has {int(dup.sum())} duplicate rows for (epoch, prompt_id, sample_idx), "
            f"first ({int(row.epoch)}, {int(row.prompt_id)}, {int(row.sample_idx)})"
        )
    counts = df.groupby(["epoch", "prompt_id"], sort=False).size()
    per_epoch = counts.groupby(level="epoch").agg(["min", "max"])
    uneven = per_epoch[per_epoch["min"] != per_epoch["max"]]
    if len(uneven):
        e = int(uneven.index[0])
        raise TraceError(
            f"{where}: samples per prompt are not constant within epoch {e} "
            f"(between {int(uneven['min'].iloc[0])} and {int(uneven['max'].iloc[0])})"
        )
    fewest = int(per_epoch["min"].min())
    if fewest != meta.samples_per_prompt:
        raise TraceError(
            f"{where}: metadata says samples_per_prompt={meta.samples_per_prompt} but the rows hold {fewest} per prompt"
        )
    turns.validate(df, meta, where)


def _validate_token_ids(table: pa.Table, where: str) -> None:
    if "output_token_ids" not in table.column_names:
        return
    lens = pc.list_value_length(table["output_token_ids"]).to_numpy(zero_copy_only=False)
    want = table["num_output_tokens"].to_numpy()
    bad = lens != want
    if bad.any():
        raise TraceError(
            f"{where}: output_token_ids length differs from num_output_tokens in "
            f"{int(bad.sum())} rows (first at row {_first_bad(bad)})"
        )


def load(path: str | Path, columns: list[str] | None = None) -> Trace:
    """Read and validate a trace. `columns` limits optional columns read (required ones always)."""
    path = Path(path)
    table, meta = _read_table(path, columns)
    _validate_token_ids(table, str(path))
    try:
        df = table.to_pandas()
    except (pa.ArrowException, ValueError) as exc:  # data that validates but does not convert
        raise TraceError(f"{path}: its data cannot be read ({str(exc).splitlines()[0]})") from None
    validate_table(df, meta, str(path))
    return Trace(df, meta)


def to_arrow(trace: Trace) -> pa.Table:
    """The trace as an Arrow table with canonical column order, types and metadata."""
    df = trace.table
    extra = [c for c in df.columns if c not in REQUIRED_COLUMNS and c not in OPTIONAL_COLUMNS]
    if extra:
        raise TraceError(f"trace has unknown column '{extra[0]}'")
    arrays, fields = [], []
    for name, (typ, _) in {**REQUIRED_COLUMNS, **OPTIONAL_COLUMNS}.items():
        if name not in df.columns:
            continue
        col = df[name]
        if isinstance(col.dtype, pd.CategoricalDtype):
            col = col.astype(object)
        try:
            arrays.append(pa.array(col, type=typ, from_pandas=True))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
            raise TraceError(f"column '{name}' cannot be stored as {typ}: {exc}") from None
        fields.append(pa.field(name, typ))
    # written at the lowest version that holds it: a single-turn trace stays schema 1, byte for byte
    meta = dataclasses.replace(trace.meta, schema_version=SCHEMA_VERSION if turns.has_turns(df) else 1)
    schema = pa.schema(fields, metadata={META_KEY: meta.to_json().encode()})
    return pa.Table.from_arrays(arrays, schema=schema)


def save(trace: Trace, path: str | Path) -> Path:
    """Validate, sort by (epoch, prompt_id, sample_idx) and write zstd Parquet."""
    path = Path(path)
    validate_table(trace.table, trace.meta, str(path))
    df = trace.table.sort_values(KEY_COLUMNS, kind="stable").reset_index(drop=True)
    table = to_arrow(Trace(df, trace.meta))
    _validate_token_ids(table, str(path))
    options = dict(
        compression="zstd", compression_level=9, use_dictionary=True, dictionary_pagesize_limit=64 << 20,
        row_group_size=1 << 20, write_statistics=True,
    )
    return atomic_save(path, lambda tmp: pq.write_table(table, tmp, **options))
