"""The HistoSpec drafter (`rlsim.spec.drafter`) behind vLLM's `custom_class` speculative hook.

    speculative_config={"method": "custom_class",
                        "model": "rlsim.real.histospec_proposer.HistoSpecProposer",
                        "num_speculative_tokens": 16}

History comes from the JSON Lines file named by `RLSIM_HISTOSPEC_HISTORY` (one line per prompt:
`{"prompt_token_ids": [...], "responses": [[...], ...]}`), the previous visit's responses. A
request whose prompt has no history gets no drafts, as on a prompt's first visit. vLLM hands the
proposer each running row's tokens (prompt + output so far) without request ids, so the prompt is
recognised by matching the row's prefix against the history's prompts. The file may grow while the engine runs
(a real RL run publishes a prompt's responses when its next visit starts): new lines are read
when the file's size changes. The per-request draft
length adapts as in HistoSpec (2..16, double on full acceptance, halve otherwise); acceptance of
the previous draft is read from how many tokens the row gained.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from rlsim.spec.drafter import AdaptiveDraftLength, DrafterConfig, SuffixDrafter

HISTORY_ENV = "RLSIM_HISTOSPEC_HISTORY"
FINGERPRINT = 16  # leading tokens compared to tell a row's request from its successor


@dataclass(slots=True)
class _Row:
    """What the proposer remembers of one row of vLLM's input batch."""

    prompt: tuple[int, ...] | None  # history key, None when the prompt has no history
    seen: int  # tokens in the row at the last proposal
    drafted: int  # tokens drafted then
    length: AdaptiveDraftLength


class HistoSpecProposer:
    """A vLLM proposer: `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, ...)`."""

    def __init__(self, vllm_config) -> None:  # noqa: ANN001 - vLLM's VllmConfig
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.config = DrafterConfig(max_draft=max(2, min(16, self.k)), init_draft=2)
        self.path = os.environ.get(HISTORY_ENV)
        self.read_bytes = 0
        self.history: dict[tuple[int, ...], list[list[int]]] = {}
        self.drafters: dict[tuple[int, ...], SuffixDrafter] = {}
        self.prompt_lens: list[int] = []
        self.rows: dict[int, _Row] = {}
        self._refresh()

    def _refresh(self) -> None:
        """Read history lines appended since the last read (one stat call when nothing changed)."""
        if not self.path:
            return
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return
        if size <= self.read_bytes:
            return
        with open(self.path, "rb") as f:
            f.seek(self.read_bytes)
            chunk = f.read(size - self.read_bytes)
        end = chunk.rfind(b"\n") + 1  # a line still being written is read next time
        self.read_bytes += end
        changed = set()
        for line in chunk[:end].splitlines():
            if line.strip():
                row = json.loads(line)
                key = tuple(row["prompt_token_ids"])
                self.history.setdefault(key, []).extend(row["responses"])
                changed.add(key)
        for key in changed:
            self.drafters[key] = SuffixDrafter(self.history[key], self.config)
        self.prompt_lens = sorted({len(p) for p in self.history}, reverse=True)

    def load_model(self, *args, **kwargs) -> None:  # no weights
        pass

    def _prompt_of(self, row_tokens) -> tuple[int, ...] | None:  # noqa: ANN001
        for n in self.prompt_lens:
            if len(row_tokens) > n:
                key = tuple(int(t) for t in row_tokens[:n])
                if key in self.drafters:
                    return key
        return None

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):  # noqa: ANN001
        self._refresh()
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            if not len(sampled) or not self.drafters:
                drafts.append([])
                continue
            tokens = token_ids_cpu[i, :n]
            row = self.rows.get(i)
            if row is not None and self._same_request(row, tokens, n):
                if row.drafted:  # the row gained accepted + 1 tokens since the last draft
                    row.length.update(row.drafted, max(0, min(row.drafted, n - row.seen - 1)))
            else:
                row = _Row(self._prompt_of(tokens), n, 0, AdaptiveDraftLength(self.config))
                self.rows[i] = row
            row.seen, row.drafted = n, 0
            if row.prompt is None:
                drafts.append([])
                continue
            context = [int(t) for t in tokens[max(len(row.prompt), n - self.config.max_match) : n]]
            draft = self.drafters[row.prompt].propose(context, min(row.length.k, self.k))
            row.drafted = len(draft)
            drafts.append(draft)
        return drafts

    @staticmethod
    def _same_request(row: _Row, tokens, n: int) -> bool:  # noqa: ANN001
        """The row grew and still starts like its prompt: a cheap check on the first tokens,
        because it runs for every row at every step."""
        if row.prompt is None or n <= row.seen:
            return False
        head = min(FINGERPRINT, len(row.prompt))
        return [int(t) for t in tokens[:head]] == list(row.prompt[:head])
