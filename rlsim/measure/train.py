"""Measure the training phases of `rlsim run --real --train grpo` with its own trainer.

    rlsim calibrate train --model PATH_OR_ID --out DIR [--seq-len 128] [--batches 4,8,16,32] [--no-engine]

Runs `rlsim.real.trainer.Trainer` (the run's trainer: torch with one thread on a CPU, bf16 on a GPU)
on synthetic GRPO batches of `batch` samples of up to `seq_len` tokens (a quarter prompt, the
rest a response of random length, so micro-batches pad as a run's do), one warm-up, then the
median of `--repeats` per batch, and fits two lines in the tokens the trainer computes over
(prompt + response, each micro-batch padded to its longest sample: `padded_micro_batch_tokens`):

- `old_log_prob`: the forward pass without gradient, `forward_fixed_s + tokens * forward_s_per_token`
  (veRL's `timing_s/old_log_prob`, and `timing_s/ref` with a KL loss);
- `update_actor`: forward, backward and the AdamW step, `fixed_s + tokens * seconds_per_token`.

The weight update (`timing_s/update_weights`) is timed as the run does it: the weights written as
one safetensors file (in /dev/shm where there is one) and, when vLLM is installed, reloaded by a
vLLM engine of the model through its `reload_weights` path with the prefix cache reset; without
vLLM (or with `--no-engine`) only the write is timed and the record says so. Writes DIR/train.json,
which `rlsim calibrate fit` turns into the profile's `train` block (the update's FLOPs per token at
the achieved rate, and the forward's seconds per token) and `weight_sync_s`.
One device only: on a multi-GPU node the per-GPU rate is what the profile needs.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from rlsim.errors import RlsimError
from rlsim.real.trainer import Sample, Trainer, TrainerConfig, require_torch
from rlsim.real.vllm_engine import check_model, hardware, require_vllm
from rlsim.real.vllm_instance import InstanceConfig, VllmInstance
from rlsim.step_costs import padded_tokens


def synthetic_samples(batch: int, seq_len: int, vocab: int, seed: int) -> list:  # rlsim.real.trainer.Sample
    """`batch` GRPO samples in groups of two with random rewards: prompts of seq_len / 4
    tokens, responses of 1 to 3 seq_len / 4 tokens."""
    rng = np.random.default_rng(seed)
    prompt = max(1, seq_len // 4)
    out = []
    for i in range(batch):
        n = int(rng.integers(1, max(2, seq_len - prompt + 1)))
        out.append(Sample(
            group=i // 2, prompt_token_ids=tuple(int(t) for t in rng.integers(1, vocab, prompt)),
            response_token_ids=tuple(int(t) for t in rng.integers(1, vocab, n)), reward=float(rng.random()),
        ))  # fmt: skip
    return out


def measure(
    model: str, seq_len: int = 128, batches: tuple[int, ...] = (4, 8, 16, 32), repeats: int = 3, engine: bool = True
) -> dict:
    torch = require_torch()
    check_model(model)
    cuda = torch.cuda.is_available()
    # The engine first, as a run starts it: an in-process vLLM CPU engine binds the process's
    # OpenMP threads, which the trainer then uses too (see rlsim.real.trainer).
    inst = start_engine(model) if engine else None
    try:
        trainer = Trainer(model, TrainerConfig(lr=1e-6, device="cuda" if cuda else "cpu"))
        rec = _measure(trainer, seq_len, batches, repeats)
        rec["weight_sync_s"], rec["weight_sync_measured"] = weight_sync(trainer, inst, repeats)
    finally:
        if inst is not None:
            inst.close()
    return {"model": model, "hardware": hardware(), **rec, "torch_version": str(torch.__version__),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip


def start_engine(model: str):  # noqa: ANN201 - rlsim.real.vllm_instance.VllmInstance, or None without vLLM
    try:
        require_vllm()
    except RlsimError:
        return None

    return VllmInstance(InstanceConfig(model=model))


def _measure(trainer, seq_len: int, batches: tuple[int, ...], repeats: int) -> dict:  # noqa: ANN001
    params = sum(p.numel() for p in trainer.model.parameters())
    vocab = int(trainer.model.config.vocab_size)

    def phases(b: int, seed: int) -> tuple[int, float, float]:
        samples = synthetic_samples(b, seq_len, vocab, seed)
        m = trainer.update(samples)
        lengths = [len(s.prompt_token_ids) + len(s.response_token_ids) for s in samples]
        tokens = padded_tokens(lengths, trainer.cfg.ppo_max_token_len_per_gpu)  # what the trainer computes over
        return tokens, m["timing_s/old_log_prob"], m["timing_s/update_actor"]

    phases(batches[0], 10**6)  # warm-up
    rows = []
    for b in batches:
        runs = [phases(b, b) for _ in range(repeats)]  # the same batch each time
        rows.append(tuple(statistics.median(r[i] for r in runs) for i in range(3)))
    tokens = [r[0] for r in rows]
    fwd_slope, fwd_fixed = _fit(tokens, [r[1] for r in rows])
    slope, fixed = _fit(tokens, [r[2] for r in rows])
    flops = 6.0 * params
    return {
        "dtype": str(next(trainer.model.parameters()).dtype).replace("torch.", ""),
        "num_params": int(params),
        "seq_len": seq_len,
        "trainer": "rlsim.real.trainer.Trainer",
        "trainer_threads": trainer.threads,
        "points": [{"tokens": t, "old_log_prob_s": f, "update_actor_s": u} for t, f, u in rows],
        "seconds_per_token": slope,
        "fixed_s": fixed,
        "forward_s_per_token": fwd_slope,
        "forward_fixed_s": fwd_fixed,
        "padded_micro_batch_tokens": trainer.cfg.ppo_max_token_len_per_gpu,
        "flops_per_token": flops,
        "achieved_flops_per_device": flops / slope,
    }


def weight_sync(trainer, inst, repeats: int) -> tuple[float, str]:  # noqa: ANN001
    """Median seconds of the run's weight update (`RealRun._push_weights`): write, then reload in
    the vLLM engine `inst` when there is one; and what was timed."""
    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(prefix="rlsim-train-", dir=shm if shm.is_dir() else None))
    try:
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            trainer.save_weights(folder)
            if inst is not None:
                inst.update_weights(str(folder))
            times.append(time.perf_counter() - t0)
        how = "write + vLLM reload_weights" if inst is not None else "write only (no vLLM engine)"
        return statistics.median(times[1:]), how
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _fit(x: list[float], y: list[float]) -> tuple[float, float]:
    """(slope, intercept >= 0) of seconds on tokens; a noisy machine can time a bigger batch
    faster than a smaller one, and then the line goes through the origin (always positive)."""
    slope, intercept = _line(x, y)
    if slope <= 0 or intercept < 0:
        return sum(a * b for a, b in zip(x, y, strict=True)) / sum(a * a for a in x), 0.0
    return slope, intercept


def _line(x: list[float], y: list[float]) -> tuple[float, float]:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx == 0:
        return my / mx, 0.0
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sxx
    return slope, my - slope * mx
