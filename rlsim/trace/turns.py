"""Multi-turn samples (trace schema 2): a trajectory of turns with tool calls between them.

A sample with turns is generated as a sequence of requests: turn k's prompt is the trajectory's
context so far (the prompt, every earlier turn's output and every earlier tool call's appended
tokens); a turn ending in "tool" hands the trajectory to a CPU tool worker for the call's latency,
and the next turn starts when it answers. Its columns, one list per sample:

- `turn_output_tokens`: output tokens of each turn (they sum to `num_output_tokens`: a
  trajectory's length is the tokens generated over all its turns); the trace's
  `max_response_len` caps each turn (an engine's `max_new_tokens` per turn), and its
  `max_model_len` the whole context;
- `turn_finish_reason`: "tool" for every turn but the last, which ends "stop" or "length" (the
  sample's `finish_reason`);
- `tool_latency_s`, `tool_append_tokens`: one per tool call (one after each "tool" turn).

`validate` names the first bad trajectory in one sentence; `TurnTable` is the driver's look-up.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlsim.errors import TraceError

TOOL = "tool"
TURN_COLUMNS = ("turn_output_tokens", "turn_finish_reason", "tool_latency_s", "tool_append_tokens")


def _lists(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, flattened values) of a column of lists (arrays, lists or None)."""
    items = [() if v is None else v for v in col.to_numpy(object)]
    lens = np.fromiter((len(v) for v in items), np.int64, len(items))
    flat = np.concatenate([np.asarray(v) for v in items]) if lens.sum() else np.zeros(0)
    return lens, flat


def has_turns(df: pd.DataFrame) -> bool:
    return "turn_output_tokens" in df.columns


def longest_turn(df: pd.DataFrame) -> np.ndarray:
    """Each row's longest turn (its response, for a single-turn row): what max_response_len caps."""
    total = df["num_output_tokens"].to_numpy(np.int64)
    if not has_turns(df) or df["turn_output_tokens"].isna().any():
        return total
    n, flat = _lists(df["turn_output_tokens"])
    if not len(flat) or (n == 0).any():
        return total
    return np.maximum.reduceat(flat.astype(np.int64), np.r_[0, np.cumsum(n)[:-1]])


def validate(df: pd.DataFrame, meta, where: str) -> None:  # noqa: ANN001 - a TraceMeta
    """Raise `TraceError` naming the first inconsistent trajectory (its row)."""
    present = [c for c in TURN_COLUMNS if c in df.columns]
    if not present:
        return
    if len(present) < len(TURN_COLUMNS):
        missing = next(c for c in TURN_COLUMNS if c not in df.columns)
        raise TraceError(f"{where} has multi-turn column '{present[0]}' but not '{missing}'")
    for c in TURN_COLUMNS:
        if df[c].isna().any():
            raise TraceError(f"{where}: column '{c}' has a missing value (row {int(np.flatnonzero(df[c].isna())[0])})")
    n_out, out = _lists(df["turn_output_tokens"])
    n_why, why = _lists(df["turn_finish_reason"])
    n_lat, lat = _lists(df["tool_latency_s"])
    n_add, add = _lists(df["tool_append_tokens"])

    def fail(mask: np.ndarray, text: str) -> None:
        if mask.any():
            row = int(np.flatnonzero(mask)[0])
            raise TraceError(f"{where}: row {row} (prompt {int(df['prompt_id'].iloc[row])}, sample "
                             f"{int(df['sample_idx'].iloc[row])}): {text}")

    fail(n_out == 0, "a multi-turn sample needs at least one turn")
    fail(n_why != n_out, "turn_finish_reason and turn_output_tokens have different turn counts")
    row_of_turn = np.repeat(np.arange(len(df)), n_out)
    fail(np.bincount(row_of_turn[out <= 0], minlength=len(df)) > 0, "every turn generates at least one token")
    why = why.astype(str)
    last = np.cumsum(n_out) - 1
    is_last = np.zeros(len(why), bool)
    is_last[last] = True
    known = np.isin(why, (TOOL, "stop", "length"))
    fail(np.bincount(row_of_turn[~known], minlength=len(df)) > 0, "a turn ends 'tool', 'stop' or 'length'")
    early_stop = (why != TOOL) & ~is_last
    fail(np.bincount(row_of_turn[early_stop], minlength=len(df)) > 0,
         "a turn follows a turn that ended with 'stop' or 'length' (only a tool call lets a trajectory go on)")
    fail(why[last] == TOOL, "its last turn ends in a tool call that no turn answers")
    fail(why[last] != df["finish_reason"].astype(str).to_numpy(), "finish_reason differs from its last turn's")
    sums = np.bincount(row_of_turn, weights=out, minlength=len(df)).astype(np.int64)
    fail(sums != df["num_output_tokens"].to_numpy(np.int64), "num_output_tokens is not the sum of its turns' tokens")
    fail((n_lat != n_out - 1) | (n_add != n_out - 1),
         "it needs one tool_latency_s and one tool_append_tokens per tool call")
    row_of_call = np.repeat(np.arange(len(df)), n_lat)
    bad = ~np.isfinite(lat.astype(float)) | (lat < 0)
    fail(np.bincount(row_of_call[bad], minlength=len(df)) > 0, "a tool latency is negative or not a number")
    fail(np.bincount(row_of_call[add < 0], minlength=len(df)) > 0, "a tool call appends a negative number of tokens")
    if meta.max_model_len is not None:
        appended = np.bincount(row_of_call, weights=add, minlength=len(df)).astype(np.int64)
        total = df["num_prompt_tokens"].to_numpy(np.int64) + sums + appended
        fail(total > meta.max_model_len,
             f"its prompt, turns and appended tool tokens exceed max_model_len={meta.max_model_len}")


class TurnTable:
    """The driver's look-up of a trace row's turns: flat arrays and each row's first turn."""

    def __init__(self, df: pd.DataFrame) -> None:
        n_out, self.out = _lists(df["turn_output_tokens"])
        self.out = self.out.astype(np.int64)
        _, lat = _lists(df["tool_latency_s"])
        n_add, add = _lists(df["tool_append_tokens"])
        self.num_turns = n_out
        self.first = np.r_[0, np.cumsum(n_out)[:-1]]
        self.first_call = np.r_[0, np.cumsum(n_add)[:-1]]
        self.latency = lat.astype(float)
        self.append = add.astype(np.int64)

    def turns(self, row: int) -> tuple[list[int], list[float], list[int]]:
        """(output tokens per turn, tool latencies, appended tokens) of one trace row."""
        a, n = int(self.first[row]), int(self.num_turns[row])
        c = int(self.first_call[row])
        return (self.out[a : a + n].tolist(), self.latency[c : c + n - 1].tolist(), self.append[c : c + n - 1].tolist())
