"""Convert real rollout logs into rlsim traces (`rlsim trace import`), so real lengths replay.

Two formats:

- **polytrace**: PolyTrace's verl packed-length logs, a directory of
  `packed_lengths_step_{k}.jsonl`, one line per prompt:
  `{step, rank, dp_rank, tp_rank, local_index, input, output: [lengths], n_sampling, validate}`.
  The logs carry no prompt ids, so every prompt gets a fresh id (file order) and the trace has
  one epoch; validation lines are skipped. `finish_reason` is `length` where a response reached
  `max_response_len` (DAPO's 20,480 unless told otherwise).
- **verl**: veRL `trainer.rollout_data_dir` dumps, a directory of `{global_step}.jsonl`, one
  line per response: `{input, output, score, step, ...}` with decoded text. Token counts come
  from a local Hugging Face tokenizer (`--tokenizer DIR` holding `tokenizer.json`), so the real
  token ids are kept too. Responses of a step with the same input text are one prompt's group;
  the same input text in a later step is a later visit of the same prompt (epoch = visit index).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from rlsim.errors import RlsimError
from rlsim.trace import Trace, TraceMeta

POLYTRACE_GLOB = "packed_lengths_step_*.jsonl"


def detect_format(src: Path) -> str:
    """'polytrace' or 'verl' from the directory's file names."""
    if not src.is_dir():
        raise RlsimError(f"{src} is not a directory of logs")
    if any(src.glob(POLYTRACE_GLOB)):
        return "polytrace"
    if any(p.stem.isdigit() for p in src.glob("*.jsonl")):
        return "verl"
    raise RlsimError(f"{src} holds neither PolyTrace packed_lengths_step_*.jsonl nor veRL {{step}}.jsonl files")


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise RlsimError(f"{path}:{n} is not valid JSON ({exc.msg})") from None
    return rows


def _step_of(path: Path) -> int:
    match = re.search(r"(\d+)", path.stem)
    return int(match.group(1)) if match else 0


def import_polytrace(src: Path, max_response_len: int = 20480, model: str = "Qwen2.5-32B") -> Trace:
    """Read a PolyTrace packed-length log directory (see module docstring)."""
    files = sorted(src.glob(POLYTRACE_GLOB), key=_step_of)
    if not files:
        raise RlsimError(f"{src} has no {POLYTRACE_GLOB} files")
    records = []
    prompt_id = 0
    for path in files:
        for n, row in enumerate(_read_jsonl(path), 1):
            if row.get("validate"):
                continue
            try:
                prompt_tokens, outputs = int(row["input"]), [int(x) for x in row["output"]]
            except (KeyError, TypeError, ValueError):
                raise RlsimError(f"{path}:{n} lacks integer 'input' and 'output' fields") from None
            for s, length in enumerate(outputs):
                records.append((0, prompt_id, s, prompt_tokens, length))
            prompt_id += 1
    if not records:
        raise RlsimError(f"{src}: the logs hold no training responses")
    df = pd.DataFrame(
        records,
        columns=["epoch", "prompt_id", "sample_idx", "num_prompt_tokens", "num_output_tokens"],
    )
    df["finish_reason"] = np.where(df["num_output_tokens"] >= max_response_len, "length", "stop")
    samples = int(df.groupby("prompt_id").size().min())
    meta = TraceMeta(
        model=model,
        max_response_len=max_response_len,
        samples_per_prompt=samples,
        source=f"real:polytrace/{src.name}",
        source_params={"format": "polytrace", "files": [p.name for p in files]},
    )
    return Trace(df, meta)


def _load_tokenizer(path: Path | None):
    if path is None:
        raise RlsimError("veRL dumps hold text: give --tokenizer DIR (a local Hugging Face tokenizer)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise RlsimError("the verl importer needs the 'tokenizers' package: pip install tokenizers") from None
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.exists():
        raise RlsimError(f"no tokenizer.json at {path}")
    return Tokenizer.from_file(str(file))


def import_verl(src: Path, tokenizer: Path | None, max_response_len: int, model: str = "unknown") -> Trace:
    """Read a veRL rollout_data_dir (see module docstring)."""
    tok = _load_tokenizer(tokenizer)
    files = sorted((p for p in src.glob("*.jsonl") if p.stem.isdigit()), key=_step_of)
    rows = []
    for path in files:
        for n, row in enumerate(_read_jsonl(path), 1):
            if "input" not in row or "output" not in row:
                raise RlsimError(f"{path}:{n} lacks the 'input' and 'output' fields of a veRL dump")
            rows.append(
                (
                    int(row.get("step", _step_of(path))),
                    row["input"],
                    row["output"],
                    row.get("score"),
                )
            )
    if not rows:
        raise RlsimError(f"{src}: no veRL dump lines found")
    ids_of: dict[str, int] = {}
    visits: dict[int, int] = {}
    last_step: dict[int, int] = {}
    sample_counter: dict[tuple[int, int], int] = {}
    records = []
    for step, text_in, text_out, score in sorted(rows, key=lambda r: r[0]):
        pid = ids_of.setdefault(text_in, len(ids_of))
        if last_step.get(pid) != step:
            visits[pid] = visits.get(pid, -1) + 1
            last_step[pid] = step
        epoch = visits[pid]
        s = sample_counter.get((epoch, pid), 0)
        sample_counter[(epoch, pid)] = s + 1
        records.append((epoch, pid, s, text_in, text_out, score))
    inputs = tok.encode_batch([r[3] for r in records], add_special_tokens=False)
    outputs = tok.encode_batch([r[4] for r in records], add_special_tokens=False)
    out_ids = [np.asarray(o.ids[:max_response_len], dtype=np.int32) for o in outputs]
    df = pd.DataFrame(
        {
            "epoch": [r[0] for r in records],
            "prompt_id": [r[1] for r in records],
            "sample_idx": [r[2] for r in records],
            "num_prompt_tokens": [max(1, len(i.ids)) for i in inputs],
            "num_output_tokens": [len(o) for o in out_ids],
            "prompt_text": [r[3] for r in records],
            "output_token_ids": out_ids,
        }
    )
    if (df["num_output_tokens"] == 0).any():
        n_empty = int((df["num_output_tokens"] == 0).sum())
        raise RlsimError(f"{src}: {n_empty} responses tokenize to zero tokens")
    df["finish_reason"] = np.where(df["num_output_tokens"] >= max_response_len, "length", "stop")
    scores = [r[5] for r in records]
    if all(isinstance(x, (int, float)) for x in scores):
        df["reward"] = np.asarray(scores, dtype=np.float32)
    counts = df.groupby(["epoch", "prompt_id"]).size()
    meta = TraceMeta(
        model=model,
        max_response_len=max_response_len,
        samples_per_prompt=int(counts.min()),
        source=f"real:verl/{src.name}",
        source_params={
            "format": "verl",
            "steps": sorted({r[0] for r in rows}),
            "tokenizer": str(tokenizer),
        },
        output_token_ids="real",
    )
    return Trace(df, meta)
