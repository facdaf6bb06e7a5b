"""GRPO/DAPO's few numerical functions, in torch, with veRL's names and veRL's numbers.

- `compute_grpo_outcome_advantage`: each sample's summed reward, normalised within its prompt's
  group (mean, unbiased std; a group of one gets mean 0 and std 1), spread over its response
  tokens;
- `compute_policy_loss_vanilla`: the token-level clipped surrogate with DAPO's clip-higher
  (`clip_ratio_low` 0.2, `clip_ratio_high` 0.28) and the dual clip that caps the loss of a
  negative advantage at `clip_ratio_c` (3) times it; returns `(pg_loss, pg_clipfrac, ppo_kl,
  pg_clipfrac_lower)` as veRL does;
- `agg_loss` (`token-mean`, `seq-mean-token-sum`, `seq-mean-token-mean`), `masked_mean`,
  `logprobs_from_logits`, `entropy_from_logits`, `kl_penalty` ("low_var_kl", veRL's k3).

The numbers are veRL's: `tests/test_grpo.py` holds these functions to values computed by
`verl.trainer.ppo.core_algos` on fixed tensors (`tests/data/make_verl_golden.py`, which names
the veRL version in `tests/data/verl_golden.json`). veRL itself is not a dependency: installing
it with its dependencies downgrades `transformers` below what vLLM needs.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: rlsim imports no GPU package at module level
    import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")  # agg_loss's modes


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is non-zero (a NaN outside the mask does not count)."""
    import torch

    return (torch.where(mask.bool(), values, 0.0) * mask).sum(axis=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is non-zero (veRL's `verl.utils.torch_functional.masked_mean`)."""
    return masked_sum(values, mask, axis) / (mask.sum(axis=axis) + 1e-8)


def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: list | tuple,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both (batch, response length): the outcome reward of each sample
    normalised within the samples that share its `index` (its prompt)."""
    import torch

    scores = token_level_rewards.sum(dim=-1)
    groups: dict = defaultdict(list)
    with torch.no_grad():
        for i, key in enumerate(index):
            groups[key].append(scores[i])
        mean, std = {}, {}
        for key, vals in groups.items():
            if len(vals) == 1:
                mean[key], std[key] = torch.tensor(0.0), torch.tensor(1.0)
            else:
                t = torch.stack(vals)
                mean[key], std[key] = torch.mean(t), torch.std(t)
        out = scores.clone()
        for i, key in enumerate(index):
            centred = scores[i] - mean[key]
            out[i] = centred / (std[key] + epsilon) if norm_adv_by_std_in_grpo else centred
        out = out.unsqueeze(-1) * response_mask
    return out, out


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    batch_num_tokens: float | None = None,
    global_batch_size: float | None = None,
) -> torch.Tensor:
    """One scalar from a micro-batch's per-token losses. `token-mean` (DAPO) divides the masked
    sum by `batch_num_tokens`, the tokens of the whole mini-batch, so micro-batches' losses add
    up to the mini-batch's token mean (default: this micro-batch's tokens); the `seq-mean-*`
    modes divide by `global_batch_size` sequences likewise."""
    import torch

    if loss_agg_mode == "token-mean":
        return masked_sum(loss_mat, loss_mask) / (loss_mask.sum() if batch_num_tokens is None else batch_num_tokens)
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (torch.sum(loss_mask, dim=-1) + 1e-8)
    else:
        raise ValueError(f"loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES)}, got {loss_agg_mode!r}")
    seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()  # sequences with no token to train do not count
    return masked_sum(seq_losses, seq_mask) / (seq_mask.sum() if global_batch_size is None else global_batch_size)


def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = 3.0,
    batch_num_tokens: float | None = None,
    global_batch_size: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate with clip-higher and the dual clip for negative advantages;
    `batch_num_tokens`/`global_batch_size` as `agg_loss` takes them (veRL's `global_batch_info`)."""
    import torch

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = masked_mean(
        torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask
    )
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, batch_num_tokens, global_batch_size)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """veRL's "low_var_kl" (k3) per token, clamped to [-10, 10]."""
    import torch

    kl = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10.0, max=10.0)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[labels], per position."""
    import torch

    return torch.gather(torch.log_softmax(logits.float(), dim=-1), -1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """The entropy of softmax(logits), per position."""
    import torch

    logits = logits.float()
    pd = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)
