"""What the log readers share (`rlsim.trace.importers` and its three format modules): the raw
table a reader returns (`RawLog`), prompt identity from text (`PromptVisits`), and the .jsonl and
file-name helpers."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from rlsim.errors import RlsimError


@dataclass
class RawLog:
    """What a format reader found: one row per response plus facts about the log.

    `table` columns: step, prompt_id, epoch, sample_idx, num_prompt_tokens, num_output_tokens
    and, where the log has them, reward, reward_time_s, output_token_ids, prompt_text, and
    truncated (bool: the engine said the response hit its cap)."""

    table: pd.DataFrame
    source: str
    params: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    token_ids: str | None = None


class PromptVisits:
    """Prompt identity and visit index from a prompt's text, for logs that carry text but no ids:
    a new text is a new prompt; the same text at a later step is that prompt's next visit (epoch)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.visit: dict[int, int] = {}
        self.last_step: dict[int, int] = {}

    def __call__(self, text: str, step: int) -> tuple[int, int]:
        """(prompt_id, epoch) of `text` seen at `step` (steps must come in order)."""
        pid = self.ids.setdefault(text, len(self.ids))
        if self.last_step.get(pid) != step:
            self.visit[pid] = self.visit.get(pid, -1) + 1
            self.last_step[pid] = step
        return pid, self.visit[pid]


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a .jsonl file; a bad line is one sentence naming file and line."""
    rows = []
    try:
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise RlsimError(f"{path}:{n} is not valid JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise RlsimError(f"{path}:{n} is not a JSON object")
                rows.append(row)
    except UnicodeDecodeError:
        raise RlsimError(f"{path} is not UTF-8 text") from None
    return rows


def step_of(path: Path) -> int:
    """The step number in a log file's name (`packed_lengths_step_12.jsonl`, `12.jsonl`, `data_12.pt`)."""
    match = re.search(r"(\d+)$", path.stem)
    return int(match.group(1)) if match else 0
