"""veRL `trainer.rollout_data_dir` dumps: a folder of `{global_step}.jsonl`, one line per
response, as `RayPPOTrainer._dump_generations` writes them:

    {input: prompt text, output: response text, gts: ground truth, score: reward, step, ...}

(`gts` is absent in older veRL; extra reward fields may follow). Token counts come from a local
Hugging Face tokenizer (`--tokenizer DIR` holding `tokenizer.json`), so the real token ids are
kept too. Responses of a step with the same input text are one prompt's group; the same input
text in a later step is a later visit of the same prompt (epoch = visit index).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from rlsim.errors import RlsimError
from rlsim.trace.rawlog import PromptVisits, RawLog, read_jsonl, step_of


def _load_tokenizer(path: Path | None):  # noqa: ANN202 - a tokenizers.Tokenizer
    if path is None:
        raise RlsimError("veRL dumps hold text: give --tokenizer DIR (a local Hugging Face tokenizer)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise RlsimError("the verl importer needs the 'tokenizers' package: pip install tokenizers") from None
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.exists():
        raise RlsimError(f"no tokenizer.json at {path}")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own exception type
        raise RlsimError(f"{file} is not a Hugging Face tokenizer.json ({str(exc).splitlines()[0]})") from None


def _read_rows(src: Path) -> list[tuple[int, str, str, object]]:
    files = sorted((p for p in src.glob("*.jsonl") if p.stem.isdigit()), key=step_of)
    rows = []
    for path in files:
        for n, row in enumerate(read_jsonl(path), 1):
            if not isinstance(row.get("input"), str) or not isinstance(row.get("output"), str):
                raise RlsimError(
                    f"{path}:{n} is not a veRL rollout dump line: it lacks the text fields 'input' and 'output'"
                )
            rows.append((int(row.get("step", step_of(path))), row["input"], row["output"], row.get("score")))
    if not rows:
        raise RlsimError(f"{src}: no veRL dump lines found")
    return rows


def read_verl(src: Path, tokenizer: Path | None, max_response_len: int | None) -> RawLog:
    """Read a veRL rollout_data_dir (see module docstring). Responses longer than a given cap are
    cut to it (the text was decoded from at most that many tokens, up to tokenizer round trips)."""
    rows = _read_rows(src)  # the format is checked before a tokenizer is asked for
    tok = _load_tokenizer(tokenizer)
    visit_of = PromptVisits()
    sample_counter: dict[tuple[int, int], int] = {}
    records = []
    for step, text_in, text_out, score in sorted(rows, key=lambda r: r[0]):
        pid, epoch = visit_of(text_in, step)
        s = sample_counter.get((epoch, pid), 0)
        sample_counter[(epoch, pid)] = s + 1
        records.append((step, epoch, pid, s, text_in, text_out, score))
    inputs = tok.encode_batch([r[4] for r in records], add_special_tokens=False)
    outputs = tok.encode_batch([r[5] for r in records], add_special_tokens=False)
    limit = max_response_len or None
    out_ids = [np.asarray(o.ids[:limit], dtype=np.int32) for o in outputs]
    df = pd.DataFrame(
        {
            "step": [r[0] for r in records],
            "epoch": [r[1] for r in records],
            "prompt_id": [r[2] for r in records],
            "sample_idx": [r[3] for r in records],
            "num_prompt_tokens": [max(1, len(i.ids)) for i in inputs],
            "num_output_tokens": [len(o) for o in out_ids],
            "prompt_text": [r[4] for r in records],
            "output_token_ids": out_ids,
        }
    )
    if (df["num_output_tokens"] == 0).any():
        n_empty = int((df["num_output_tokens"] == 0).sum())
        raise RlsimError(f"{src}: {n_empty} responses tokenize to zero tokens")
    scores = [r[6] for r in records]
    notes = []
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in scores):
        df["reward"] = np.asarray(scores, dtype=np.float32)
        notes.append("rewards imported from the dumps' 'score' field")
    params = {"format": "verl", "tokenizer": str(tokenizer)}
    return RawLog(df, f"real:verl/{src.name}", params, notes, token_ids="real")
