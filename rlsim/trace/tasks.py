"""Built-in verifiable tasks that a tiny model learns on a CPU: lengths that move as it learns, and tool use.

`tool-lookup` (multi-turn, `_lookup_trace`): the model may call a lookup tool by emitting a reserved
word, and is rewarded for calling it and for using its answer; an engine's agent loop runs the
turns (`AgentTask`), the tool appending the answer's tokens to the context.

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

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rlsim.errors import RlsimError
from rlsim.trace.format import Trace, TraceMeta

TASKS = ("stop-within", "tool-lookup")
STYLES = ("tiny", "text")
CALL_WORD = 1  # tool-lookup: the word t1 (token id 3 of the tiny model) is the reserved tool call
KEYS = (20, 100)  # tool-lookup: a prompt's key word t{K}, K in [20, 100)


def lookup(key: int) -> int:
    """tool-lookup's tool: the answer word for a key (a fixed table no model can guess)."""
    return 300 + (37 * int(key)) % 150


@dataclass(frozen=True)
class AgentTask:
    """A multi-turn task's rules for an engine's agent loop: the token id that ends a turn with a
    tool call, the most turns a trajectory takes, and the tool's answer (token ids) for a prompt."""

    call_id: int
    max_turns: int = 2

    @staticmethod
    def key_of(prompt_text: str) -> int:
        return int(prompt_text.split()[0][1:])

    def answer_ids(self, prompt_text: str) -> list[int]:
        """The tokens the tool appends: the key's answer word (tiny model: token id = word + 2)."""
        return [lookup(self.key_of(prompt_text)) + 2]


def tool_reward(turn_tokens: list[list[int]], answer: list[int]) -> float:
    """tool-lookup's reward: 0.5 for calling the tool (a first turn that ends in the call), 0.5
    more for using its answer (a later turn that emits the answer's tokens)."""
    called = len(turn_tokens) > 1
    used = called and any(a in t for t in turn_tokens[1:] for a in answer)
    return 0.5 * called + 0.5 * used


def agent_task(trace: Trace) -> AgentTask | None:
    """The agent loop a task trace asks for (tool-lookup), else None."""
    if trace.meta.source_params.get("task") == "tool-lookup":
        return AgentTask(call_id=CALL_WORD + 2, max_turns=int(trace.meta.source_params.get("max_turns", 2)))
    return None


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
    if task == "tool-lookup":
        if style != "tiny":
            raise RlsimError("tool-lookup is written in calibrate.tiny_model's words: use --style tiny")
        return _lookup_trace(rng, num_prompts, samples_per_prompt, epochs, max_response_len, seed)
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


def _lookup_trace(rng: np.random.Generator, num_prompts: int, samples: int, epochs: int, cap: int, seed: int) -> Trace:
    """tool-lookup: each prompt names a key (its word four times, then filler); the model may call
    the lookup tool (the word t1 ends its turn), which appends the key's answer word, and is
    rewarded for calling it and for using the answer (`tool_reward`). Turns are the model's own, so
    the trace is single-turn (`num_output_tokens` holds the cap); a real run records the turns."""
    keys = rng.integers(*KEYS, num_prompts)
    texts = [" ".join([f"t{k}"] * 4 + [f"t{w}" for w in rng.integers(20, 300, 6)]) for k in keys]
    rows = [
        (e, p, s, len(texts[p].split()), cap, "length", texts[p])
        for e in range(epochs) for p in range(num_prompts) for s in range(samples)
    ]  # fmt: skip
    table = pd.DataFrame(rows, columns=["epoch", "prompt_id", "sample_idx", "num_prompt_tokens", "num_output_tokens",
                                        "finish_reason", "prompt_text"])  # fmt: skip
    for col in ("epoch", "sample_idx", "num_prompt_tokens", "num_output_tokens"):
        table[col] = table[col].astype(np.int32)
    table["prompt_id"] = table["prompt_id"].astype(np.int64)
    meta = TraceMeta(
        model="any", max_response_len=cap, samples_per_prompt=samples, source="synthetic:task-tool-lookup",
        source_params={"task": "tool-lookup", "style": "tiny", "seed": seed, "num_prompts": num_prompts,
                       "max_turns": 2, "call_word": f"t{CALL_WORD}"},
    )  # fmt: skip
    return Trace(table, meta)
