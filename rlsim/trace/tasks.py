"""A built-in verifiable task that a tiny model learns on a CPU, and whose lengths move as it learns.

`stop-within`: every prompt states a target length T (4 to 16 tokens) and the reward is
`-|L - T| / max_response_len` for a response of L tokens. A random model rarely emits its end
token, so its responses run to the cap; GRPO raises the end token's probability where a sample
stopped nearer T than its group, and the mean response length falls step by step: what RL
length dynamics look like, in minutes, where math prompts would take a real model and GPUs.

Prompts are text: for the tiny model of `calibrate.tiny_model` the target's own word (`t{T}`)
repeated, then seeded filler words (its WordLevel vocabulary has no English); `style="text"`
writes an English instruction for a real model's tokenizer. The trace is an ordinary rlsim
trace (`prompt_text`, `target_len`; `num_output_tokens` holds the cap, as a free run ignores it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlsim.errors import RlsimError
from rlsim.trace.format import Trace, TraceMeta

TASKS = ("stop-within",)
STYLES = ("tiny", "text")


def length_reward(num_tokens: int, target: int, cap: int) -> float:
    """`stop-within`'s reward: 0 at the target length, -1 a whole cap away."""
    return -abs(int(num_tokens) - int(target)) / max(1, int(cap))


def task_trace(
    task: str = "stop-within",
    num_prompts: int = 16,
    samples_per_prompt: int = 8,
    epochs: int = 8,
    max_response_len: int = 48,
    style: str = "tiny",
    seed: int = 0,
) -> Trace:
    """The task's trace: every prompt visited `epochs` times, `samples_per_prompt` samples each."""
    if task not in TASKS:
        raise RlsimError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")
    if style not in STYLES:
        raise RlsimError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
    if min(num_prompts, samples_per_prompt, epochs) <= 0 or max_response_len < 17:
        raise RlsimError("prompts, samples and epochs must be positive and max_response_len at least 17")
    rng = np.random.default_rng(seed)
    targets = rng.integers(4, 17, num_prompts)
    texts = []
    for t in targets:
        if style == "tiny":  # calibrate.tiny_model's words: token id i is "t{i - 2}"
            filler = " ".join(f"t{w}" for w in rng.integers(20, 500, 6))
            texts.append(" ".join([f"t{t}"] * 4) + " " + filler)
        else:
            texts.append(f"Reply with exactly {t} words, then stop.")
    rows = [
        (e, p, s, len(texts[p].split()), max_response_len, "length", texts[p], int(targets[p]))
        for e in range(epochs) for p in range(num_prompts) for s in range(samples_per_prompt)
    ]  # fmt: skip
    table = pd.DataFrame(rows, columns=["epoch", "prompt_id", "sample_idx", "num_prompt_tokens", "num_output_tokens",
                                        "finish_reason", "prompt_text", "target_len"])  # fmt: skip
    for col in ("epoch", "sample_idx", "num_prompt_tokens", "num_output_tokens", "target_len"):
        table[col] = table[col].astype(np.int32)
    table["prompt_id"] = table["prompt_id"].astype(np.int64)
    meta = TraceMeta(
        model="any",
        max_response_len=max_response_len,
        samples_per_prompt=samples_per_prompt,
        source=f"synthetic:task-{task}",
        source_params={"task": task, "style": style, "seed": seed, "num_prompts": num_prompts},
    )
    return Trace(table, meta)
