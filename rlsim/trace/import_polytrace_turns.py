"""PolyTrace multi-turn workload logs (github.com/Zhou-jiecheng/PolyTrace, its Search-R1 fork of
veRL on SGLang): a folder of `multiturn_workload_step_{k}.jsonl`, one line per trajectory,

    {step, prompt_len, max_response_len, max_model_len, prompt_group_id, sample_id, finish_reason,
     turns: [{turn, prompt_tokens, cached_tokens, completion_tokens, finish_reason, engine_latency_s}],
     tool_calls: [{turn, tool_name, latency_s, append_len, ...}], validate}

read into a schema-2 trace (`rlsim.trace.turns`). What the log says and the trace keeps:

- each turn's output tokens (`completion_tokens`); a turn that ends in tool calls is a "tool" turn
  when another turn follows it; the last turn ends as the trajectory did ("stop" or "length").
  A last turn that asked for a tool the rollout then ended without answering (the response cap)
  ends the trajectory there: its tool call is dropped, and counted in the notes;
- a tool call's latency: the longest of its turn's calls (a turn's calls run concurrently, as
  veRL's agent loop gathers them);
- its appended tokens: the next turn's prompt minus this turn's prompt and output (the tool's
  answer and the chat template around it, as the engine saw them). A retokenised context can come
  out shorter than that sum (SGLang re-encodes the text); such a call appends 0 tokens, counted.

The log's per-turn prefix hits (`cached_tokens`, SGLang's token-granular radix cache) and engine
latencies are not part of a trace; `turn_log` reads them for the checks that hold a simulation
against the log. Prompts are new at every step (a prompt group is a prompt), all on their first
visit (epoch 0); validation lines are skipped; a partial last step is dropped.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from rlsim.errors import RlsimError
from rlsim.trace.format import Trace, TraceMeta
from rlsim.trace.rawlog import read_jsonl, step_of
from rlsim.trace.turns import TOOL

TURNS_GLOB = "multiturn_workload_step_*.jsonl"


def _records(src: Path) -> list[tuple[Path, int, dict]]:
    files = sorted(src.glob(TURNS_GLOB), key=step_of)
    if not files:
        raise RlsimError(f"{src} has no {TURNS_GLOB} files")
    out = []
    for path in files:
        for n, row in enumerate(read_jsonl(path), 1):
            if not row.get("validate"):
                out.append((path, n, row))
    return out


LARGEST = 2**40  # tokens, ids and steps beyond this are not a log's: an int64 column would overflow


def _field(row: dict, key: str, where: str, kind=int):  # noqa: ANN001, ANN202
    """`row[key]` as an int (a count or id, 0 .. LARGEST) or a float (a latency: finite, >= 0)."""
    if key not in row or row[key] is None:
        raise RlsimError(f"{where} lacks a numeric '{key}' field")
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RlsimError(f"{where}: '{key}' must be a number, got {value!r}")
    if kind is float:
        if not math.isfinite(value) or value < 0:
            raise RlsimError(f"{where}: '{key}' must be a number >= 0 (seconds), got {value!r}")
        return float(value)
    if not (math.isfinite(value) and value == int(value) and 0 <= value <= LARGEST):
        raise RlsimError(f"{where}: '{key}' must be an integer of at most {LARGEST:,}, got {value!r}")
    return int(value)


def _objects(rec: dict, key: str, where: str) -> list[dict]:
    """`rec[key]`: a list of JSON objects (absent or null: none)."""
    value = rec.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise RlsimError(f"{where}: '{key}' must be a list of objects, got {value!r:.60}")
    return value


def read_turns(src: Path, model: str | None = None) -> tuple[Trace, list[str]]:
    """A folder of PolyTrace multi-turn logs as a schema-2 trace, and the notes on what was inferred."""
    rows = []
    dropped_calls = short_appends = 0
    counts: dict[int, int] = {}
    caps: set[tuple[int, int]] = set()
    for path, n, rec in _records(src):
        where = f"{path}:{n}"
        turns = _objects(rec, "turns", where)
        if not turns:
            raise RlsimError(f"{where} has no 'turns' list")
        step = _field(rec, "step", where) if "step" in rec else step_of(path)
        caps.add((_field(rec, "max_response_len", where), _field(rec, "max_model_len", where)))
        outs = [_field(t, "completion_tokens", where) for t in turns]
        prompts = [_field(t, "prompt_tokens", where) for t in turns]
        end = str(rec.get("finish_reason", turns[-1].get("finish_reason")))
        if end not in ("stop", "length"):
            raise RlsimError(f"{where}: finish_reason {end!r} is neither 'stop' nor 'length'")
        if turns[-1].get("finish_reason") == "tool_calls":
            dropped_calls += 1
        calls = _objects(rec, "tool_calls", where)
        latency, append = [], []
        for k in range(len(turns) - 1):
            here = [c for c in calls if c.get("turn") == k]
            latency.append(max((_field(c, "latency_s", where, float) for c in here), default=0.0))
            grown = prompts[k + 1] - prompts[k] - outs[k]
            short_appends += grown < 0
            append.append(max(grown, 0))
        counts[step] = counts.get(step, 0) + 1
        rows.append({
            "step": step,
            "group": _field(rec, "prompt_group_id", where),
            "sample_idx": _field(rec, "sample_id", where),
            "num_prompt_tokens": _field(rec, "prompt_len", where),
            "num_output_tokens": int(sum(outs)),
            "finish_reason": end,
            "turn_output_tokens": outs,
            "turn_finish_reason": [TOOL] * (len(turns) - 1) + [end],
            "tool_latency_s": latency,
            "tool_append_tokens": append,
        })
    if len(caps) != 1:
        raise RlsimError(f"{src}: the log's trajectories disagree on max_response_len/max_model_len ({sorted(caps)})")
    (cap, model_len), = caps
    notes = []
    full = max(counts.values())
    partial = sorted(s for s, c in counts.items() if c < full)
    df = pd.DataFrame(rows)
    if partial:
        df = df[~df["step"].isin(partial)]
        notes.append(
            f"step(s) {', '.join(map(str, partial))} hold fewer trajectories than the others: dropped as partial"
        )
    df = df.sort_values(["step", "group", "sample_idx"], kind="stable").reset_index(drop=True)
    keys = df[["step", "group"]].drop_duplicates()
    ids = pd.Series(np.arange(len(keys)), index=pd.MultiIndex.from_frame(keys))
    df["prompt_id"] = ids.loc[pd.MultiIndex.from_frame(df[["step", "group"]])].to_numpy()
    df["epoch"] = 0
    df = df.drop(columns="group")
    samples = int(df.groupby("prompt_id").size().min())
    steps = sorted(int(s) for s in df["step"].unique())
    if dropped_calls:
        notes.append(f"{dropped_calls:,} trajectories end on a tool call nothing answered (the response cap): "
                     "their last turn ends the trajectory")
    if short_appends:
        notes.append(f"{short_appends:,} tool calls grow the context by less than nothing (the next prompt "
                     "was retokenised shorter): they append 0 tokens")
    if not model:
        notes.append("model unknown: the log does not name it; pass --model")
    notes.append(f"{len(steps)} steps of {len(df) // len(steps) // samples} prompts x {samples} samples, "
                 f"{int(df['turn_output_tokens'].map(len).sum()):,} turns; response cap {cap:,}, "
                 f"max_model_len {model_len:,}")
    meta = TraceMeta(
        model=model or "unknown",
        max_response_len=cap,
        samples_per_prompt=samples,
        source=f"real:polytrace-multiturn-{src.name}",
        source_params={"format": "polytrace_multiturn", "steps": steps,
                       "prompts_per_step": len(df) // len(steps) // samples},
        max_model_len=model_len,
    )
    return Trace(df, meta), notes


def turn_log(src: Path) -> pd.DataFrame:
    """The log's turns, one row each: step, trajectory, turn, prompt_tokens, cached_tokens,
    completion_tokens and engine_latency_s (the reference a simulation is held against)."""
    rows = []
    for j, (path, n, rec) in enumerate(_records(src)):
        where = f"{path}:{n}"
        step = _field(rec, "step", where) if "step" in rec else step_of(path)
        for t in _objects(rec, "turns", where):
            rows.append((step, j, _field(t, "turn", where) if "turn" in t else 0,
                         *(_field(t, k, f"{path}:{n}") for k in ("prompt_tokens", "cached_tokens",
                                                                 "completion_tokens")),
                         _field(t, "engine_latency_s", f"{path}:{n}", float)))
    return pd.DataFrame(rows, columns=["step", "trajectory", "turn", "prompt_tokens", "cached_tokens",
                                       "completion_tokens", "engine_latency_s"])
