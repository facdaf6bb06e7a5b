"""PolyTrace packed-length logs (github.com/Zhou-jiecheng/PolyTrace, written by its veRL and rLLM
forks): a folder of `packed_lengths_step_{k}.jsonl`, one line per prompt per data-parallel rank,

    {step, rank, dp_rank, tp_rank, local_index, input: prompt tokens, output: [response lengths],
     n_sampling, validate}

and, where the run timed its reward, `reward_timings_step_{k}.jsonl`, one line per rank:
`{step, rank, batch_size, reward_time_s, response_sum, response_mean, response_max, validate}`.

The logs carry no prompt ids, so every line is a new prompt (file order) on its first visit
(epoch 0), and its step is kept. Validation lines are skipped. A rank's reward time is for its
whole batch; every sample of that rank and step gets `reward_time_s = batch time / batch size`
(the batch scored one sample at a time; the batch times are kept in the metadata as logged).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from rlsim.errors import RlsimError
from rlsim.trace.rawlog import RawLog, read_jsonl, step_of

LENGTHS_GLOB = "packed_lengths_step_*.jsonl"
REWARD_GLOB = "reward_timings_step_*.jsonl"


def _reward_times(src: Path) -> tuple[dict[tuple[int, int], float], list[dict]]:
    """(step, rank) -> seconds per sample, and the logged batches."""
    per_sample, batches = {}, []
    for path in sorted(src.glob(REWARD_GLOB), key=step_of):
        for n, row in enumerate(read_jsonl(path), 1):
            if row.get("validate"):
                continue
            try:
                step, rank = int(row.get("step", step_of(path))), int(row.get("rank", 0))
                seconds, size = float(row["reward_time_s"]), int(row["batch_size"])
            except (KeyError, TypeError, ValueError):
                raise RlsimError(f"{path}:{n} lacks numeric 'reward_time_s' and 'batch_size' fields") from None
            if size <= 0 or not np.isfinite(seconds) or seconds < 0:
                raise RlsimError(f"{path}:{n}: reward_time_s must be >= 0 and batch_size positive")
            per_sample[(step, rank)] = seconds / size
            batches.append({"step": step, "rank": rank, "batch_size": size, "reward_time_s": round(seconds, 3)})
    return per_sample, batches


def read_polytrace(src: Path) -> RawLog:
    """Read one run folder of PolyTrace packed-length logs (see module docstring)."""
    files = sorted(src.glob(LENGTHS_GLOB), key=step_of)
    if not files:
        raise RlsimError(f"{src} has no {LENGTHS_GLOB} files")
    rows = []
    prompt_id = 0
    for path in files:
        for n, row in enumerate(read_jsonl(path), 1):
            if row.get("validate"):
                continue
            try:
                prompt_tokens, outputs = int(row["input"]), [int(x) for x in row["output"]]
                step, rank = int(row.get("step", step_of(path))), int(row.get("rank", 0))
            except (KeyError, TypeError, ValueError):
                raise RlsimError(f"{path}:{n} lacks integer 'input' and 'output' fields") from None
            if prompt_tokens <= 0 or not outputs or min(outputs) <= 0:
                raise RlsimError(f"{path}:{n}: prompt and response lengths must be positive")
            for s, length in enumerate(outputs):
                rows.append((step, rank, prompt_id, s, prompt_tokens, length))
            prompt_id += 1
    df = pd.DataFrame(
        rows, columns=["step", "rank", "prompt_id", "sample_idx", "num_prompt_tokens", "num_output_tokens"]
    )
    df.insert(2, "epoch", 0)
    params: dict = {"format": "polytrace", "files": [p.name for p in files]}
    notes = []
    per_sample, batches = _reward_times(src)
    if per_sample:
        keys = list(zip(df["step"], df["rank"], strict=True))
        missing = sum(k not in per_sample for k in keys)
        if missing:
            notes.append(f"warning: {missing:,} responses have no reward timing; they use the run's reward latency")
        else:
            df["reward_time_s"] = [per_sample[k] for k in keys]
        params["reward_timings"] = batches
        secs = [b["reward_time_s"] for b in batches]
        notes.append(
            f"reward timings: {len(batches)} batches of {batches[0]['batch_size']} samples, {min(secs):.0f}-"
            f"{max(secs):.0f} s each, kept as reward_time_s = batch time / batch size (scored one at a time)"
        )
    return RawLog(df.drop(columns="rank"), f"real:polytrace/{src.name}", params, notes)
