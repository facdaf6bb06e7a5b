"""Write tests/data/verl_golden.json: veRL's own GRPO/DAPO numbers on fixed tensors.

    pip install --no-deps verl==0.9.1 omegaconf antlr4-python3-runtime tensordict codetiming orjson
    python tests/data/make_verl_golden.py

veRL with its dependencies downgrades `transformers` below what vLLM needs, so it is installed
without them (plus the few its `core_algos` imports) only to run this script; the JSON it writes
holds the inputs, veRL's outputs and the veRL version, and `tests/test_grpo.py` holds
`rlsim.real.grpo` to them without veRL installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch


def inputs() -> dict:
    g = torch.Generator().manual_seed(0)
    bsz, length, vocab = 6, 9, 11
    mask = torch.ones(bsz, length)
    for i, n in enumerate((9, 7, 4, 9, 1, 6)):  # ragged responses
        mask[i, n:] = 0
    old = -torch.rand(bsz, length, generator=g) * 3
    new = old + (torch.rand(bsz, length, generator=g) - 0.3) * 3  # ratios 0.4 to 8: both clips and the dual clip
    adv = torch.randn(bsz, length, generator=g) * mask
    return {
        "response_mask": mask,
        "old_log_prob": old,
        "log_prob": new,
        "advantages": adv,
        "ref_log_prob": old + torch.randn(bsz, length, generator=g) * 0.3,
        "rewards": torch.tensor([1.0, 0.0, 1.0, 0.5, 0.0, 2.0]),
        "index": ["a", "a", "a", "b", "b", "c"],  # groups of 3, 2 and 1
        "logits": torch.randn(bsz, length, vocab, generator=g) * 2,
        "labels": torch.randint(0, vocab, (bsz, length), generator=g),
    }


def main() -> None:
    import verl
    import verl.utils.torch_functional as verl_F
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos

    x = inputs()
    out: dict = {"verl_version": verl.__version__, "torch_version": torch.__version__}
    rewards = torch.zeros_like(x["response_mask"])
    last = x["response_mask"].sum(-1).long() - 1
    rewards[torch.arange(len(last)), last] = x["rewards"]  # veRL puts the outcome on the last token
    for norm in (True, False):
        adv, _ = core_algos.compute_grpo_outcome_advantage(
            rewards, x["response_mask"], np.array(x["index"], dtype=object), norm_adv_by_std_in_grpo=norm
        )
        out[f"grpo_advantages_norm_{norm}"] = adv.tolist()
    loss_fn = core_algos.get_policy_loss_fn("vanilla")
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        for info in ({}, {"batch_num_tokens": 100, "global_batch_size": 10}):
            cfg = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                                    "clip_ratio_c": 3.0, "global_batch_info": info})  # fmt: skip
            loss, metrics = loss_fn(x["old_log_prob"], x["log_prob"], x["advantages"], x["response_mask"], mode, cfg)
            key = f"policy_loss_{mode}_{'global' if info else 'local'}"
            out[key] = {"pg_loss": float(loss), **{k.split("/")[1]: float(v) for k, v in metrics.items()}}
    out["kl_low_var_kl"] = core_algos.kl_penalty(x["log_prob"], x["ref_log_prob"], "low_var_kl").tolist()
    out["entropy"] = verl_F.entropy_from_logits(x["logits"]).tolist()
    out["logprobs"] = verl_F.logprobs_from_logits(x["logits"], x["labels"]).tolist()
    out["masked_mean"] = float(verl_F.masked_mean(x["advantages"], x["response_mask"]))
    data = {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in x.items()}
    path = Path(__file__).with_name("verl_golden.json")
    path.write_text(json.dumps({"inputs": data, "verl": out}) + "\n")
    print(f"wrote {path} (veRL {verl.__version__})")


if __name__ == "__main__":
    main()
