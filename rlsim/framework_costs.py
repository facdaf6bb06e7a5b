"""What training frameworks do around the FLOPs, each costed from first principles.

`rlsim.step_costs` prices a training pass as FLOPs at an MFU plus its layout's traffic; these
are the framework settings laid over that (`TrainCost`'s framework fields, on the command line
`--trainer megatron(recompute=full,optimizer_offload_fraction=1,...)`). Each formula is in
docs/accuracy.md ("What frameworks do, costed") with its sources; every constant comes from the
profile's facts (the model's parameters, the GPU's datasheet in `gpus.json`), none is fitted.

- **Activation recompute** (Megatron's `recompute_granularity`, veRL's
  `enable_gradient_checkpointing`): `full` re-runs the forward of the covered layers inside the
  backward pass, so the update costs `3 + c` forwards, c the share of layers covered
  (`recompute_layers`, 0 = all, as NeMo RL's `activation_checkpointing` sets: full, uniform,
  every layer); `selective` (Megatron's selective recompute: the core attention only) re-runs
  the attention products, `2 L d T^2` per sequence, of the covered layers. The backend's MFU
  figure counts model FLOPs only, so recompute is time on top of it.
- **Pipeline bubble** with v virtual stages per rank (Megatron's interleaved 1F1B schedule,
  Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", section 2.2.2: the bubble shrinks by v): `(m + (pp - 1) / v) / m` for m
  micro-batches.
- **Micro-batches**: with dynamic batch size (veRL's `use_dynamic_bsz`) samples are packed in
  order into micro-batches of at most `max_token_len` tokens per GPU (`ppo_max_token_len_per_gpu`;
  the old-log-prob and reference passes at `log_prob_max_token_len`); without it, each
  micro-batch is `micro_batch_size` samples. Padding is removed in either case (veRL's
  `use_remove_padding`), so how well the budget is filled costs no FLOPs; the micro-batches'
  count m sets the pipeline's bubble.
- **Offload**, bytes over the GPU's host link (`gpus.json` `host_link_bytes_per_s`, one
  direction; GB200's NVLink-C2C is several times PCIe), per rank:
  - `param_offload`: the rank's parameter shard (bf16, 2 bytes a parameter) loaded before each
    pass of the actor (old log-prob, update) and offloaded after it;
  - `grad_offload`: the rank's fp32 gradients (4 bytes) offloaded after backward and loaded for
    the optimizer step;
  - `optimizer_offload_fraction` f (Megatron's `optimizer_cpu_offload`, its hybrid CPU
    optimizer): f of the rank's optimizer shard steps on the host: its fp32 gradients go down (4
    bytes), the updated bf16 parameters come back (2 bytes), and CPU Adam reads parameter,
    gradient and both moments (16 bytes, fp32) and writes parameter and moments (12 bytes): 28
    bytes a parameter at the rank's share of the host's memory bandwidth (`gpus.json`
    `host_memory_bytes_per_s`, the node's DRAM bandwidth over its GPUs), memory-bound as Adam is.
    veRL's FSDP backend instead moves f of the two fp32 moments (8 bytes) to the GPU for the step
    and back, and its offloaded parameters are fp32 (4 bytes);
  - `ref_offload`: the reference model's shard loaded before its pass.
  The rank's shard: dense weights over TP x PP, routed experts over EP x PP; the optimizer's
  over the data-parallel ranks too (Megatron's distributed optimizer, FSDP).
- **The optimizer step** (AdamW, `optimizer_steps` times an update: a step's samples over the
  global batch of one optimizer step, NeMo RL's `train_global_batch_size`, veRL's
  `train_batch_size / ppo_mini_batch_size x ppo_epochs`; each step with its gradient and
  optimizer offload traffic): the rank's optimizer shard's fp32 parameters,
  gradients and two moments read and its parameters and moments written, 28 bytes a parameter
  (the same count as the CPU step above), at the GPU's HBM bandwidth, its memory roofline: the
  step is memory-bound, a few flops a byte. What Megatron's CPU optimizer steps (f) is not on the
  GPU; veRL's FSDP offload brings the moments back, so its whole shard steps there.
- **MoE grouped GEMM with few tokens per expert**: an expert's GEMMs cannot run faster than
  reading its weights. Per micro-batch and MoE layer a rank reads its local experts' weights
  once a pass (forward; backward reads them for the input gradient and writes their weight
  gradient: 3 passes an update), at HBM bandwidth; where that floor exceeds the FLOP time of the
  tokens that reach them, the pass pays the difference.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from rlsim import model_facts
from rlsim.errors import RlsimError

BF16_BYTES, FP32_BYTES = 2, 4
ADAM_BYTES_PER_PARAM = 16 + 12  # Adam, on the host or the GPU: read param, grad, m, v (fp32); write param, m, v
RECOMPUTE_KINDS = ("none", "selective", "full")


@dataclass(frozen=True, slots=True)
class FrameworkSettings:
    """What a training framework does around the FLOPs (the module docstring): one object that a
    `--trainer` carries and a profile's `train` block records (flat, only what differs from these
    defaults, which do nothing)."""

    recompute: str = "none"  # none, selective or full activation recompute
    recompute_layers: int = 0  # layers it covers (0: all)
    vpp: int = 1  # virtual pipeline stages per rank
    micro_batch_size: int = 0  # samples a micro-batch without dynamic batch size
    max_token_len: int = 0  # dynamic batch size: tokens a micro-batch a GPU (0: veRL's 16,384, packed)
    log_prob_max_token_len: int = 0  # the same for the forward-only passes (0: max_token_len)
    param_offload: bool = False
    grad_offload: bool = False
    optimizer_offload_fraction: float = 0.0
    ref_offload: bool = False
    optimizer_steps: int = 1  # AdamW steps an update makes (samples / NeMo RL's train_global_batch_size)

    def __post_init__(self) -> None:
        if self.recompute not in RECOMPUTE_KINDS:
            kinds = ", ".join(RECOMPUTE_KINDS)
            raise RlsimError(f"recompute must be one of {kinds}, got {self.recompute!r}")
        if not 0 <= self.optimizer_offload_fraction <= 1:
            raise RlsimError(f"optimizer_offload_fraction must be in [0, 1], got {self.optimizer_offload_fraction}")
        for name in ("recompute_layers", "micro_batch_size", "max_token_len", "log_prob_max_token_len"):
            if getattr(self, name) < 0:
                raise RlsimError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.vpp < 1:
            raise RlsimError(f"vpp (virtual pipeline stages per rank) must be >= 1, got {self.vpp}")
        if self.optimizer_steps < 1:
            raise RlsimError(f"optimizer_steps (AdamW steps an update) must be >= 1, got {self.optimizer_steps}")

    def stated(self) -> dict[str, Any]:
        """The settings that differ from the defaults (what a profile records)."""
        default = FrameworkSettings()
        return {k: v for k, v in asdict(self).items() if v != getattr(default, k)}

    @property
    def offloads(self) -> bool:
        return bool(self.param_offload or self.grad_offload or self.optimizer_offload_fraction or self.ref_offload)

    @classmethod
    def from_values(cls, raw: dict[str, Any], text: bool = False) -> FrameworkSettings:
        """The settings among `raw`'s keys, each checked against its default's type (`text`: values
        written as text, as `--trainer` gives them); other keys are left to the caller."""
        out: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in raw:
                out[f.name] = _typed(f.name, raw[f.name], f.default, text)
        return cls(**out)


def _typed(name: str, value: Any, like: Any, text: bool) -> Any:  # noqa: ANN401 - the setting's own type
    """`value` as the type of the default `like`, or one sentence."""
    if isinstance(like, bool):
        if text:
            if str(value).lower() not in ("true", "false", "1", "0"):
                raise RlsimError(f"{name} must be true or false, got {value!r}")
            return str(value).lower() in ("true", "1")
        if not isinstance(value, bool):
            raise RlsimError(f"{name} must be true or false")
        return value
    if isinstance(like, str):
        if not isinstance(value, str):
            raise RlsimError(f"{name} must be text")
        return value
    if text:
        try:
            return float(value) if isinstance(like, float) else int(value)
        except ValueError:
            raise RlsimError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RlsimError(f"{name} must be a finite number")
    return type(like)(value)


@dataclass(frozen=True, slots=True)
class Shards:
    """Parameters one training rank holds: its weights and its optimizer shard."""

    weights: float
    optimizer: float


def shards(facts: dict, tp: int, pp: int, ep: int, dp: int) -> Shards:
    """The rank's parameter shard (dense over TP x PP, routed experts over EP x PP) and its
    optimizer shard (that, over the data-parallel ranks)."""
    routed = model_facts.routed_params(facts)
    weights = (float(facts["num_params"]) - routed) / (tp * pp) + routed / (ep * pp)
    return Shards(weights, weights / max(1, dp))


def recompute_forwards(kind: str, covered: float, attention_share: float) -> float:
    """Extra forwards an update runs for recompute, as a share of one forward: `full` the
    covered layers' whole forward, `selective` their attention products (`attention_share` of
    the forward's FLOPs), `none` nothing."""
    if kind == "full":
        return covered
    if kind == "selective":
        return covered * attention_share
    return 0.0


def bubble_factor(micro: int, pp: int, vpp: int = 1) -> float:
    """Time over bubble-free time of a pipeline of pp stages, vpp virtual stages each, m micro-batches."""
    m = max(1, micro)
    return (m + (pp - 1) / max(1, vpp)) / m


def micro_batches(lengths, budget: int) -> list[list[int]]:  # noqa: ANN001 - a sequence of ints
    """Sample indices packed in order into micro-batches of at most `budget` tokens (a longer
    sample alone): how `rlsim.real.trainer.Trainer` splits a batch (veRL's `ppo_max_token_len_per_gpu`)."""
    out: list[list[int]] = []
    cur: list[int] = []
    tokens = 0
    for i, n in enumerate(lengths):
        if cur and tokens + n > budget:
            out.append(cur)
            cur, tokens = [], 0
        cur.append(i)
        tokens += n
    if cur:
        out.append(cur)
    return out


def micro_batch_count(lengths: np.ndarray, budget: int, samples: int) -> int:
    """Micro-batches of one rank's samples: packed in order to `budget` tokens where `budget` > 0
    (dynamic batch size, `micro_batches`), else `samples` a micro-batch."""
    if len(lengths) == 0:
        return 1
    if budget > 0:
        return len(micro_batches(lengths, budget))
    return math.ceil(len(lengths) / max(1, samples))


def offload_s(shard: Shards, host_link: float, host_memory: float, param: bool, grad: bool, optimizer: float,
              fsdp: bool = False) -> dict:  # fmt: skip
    """Seconds one update spends on offload, by what moves (the module docstring): `params` per
    pass of the actor, `grads` and `optimizer` once an update. `fsdp`: veRL's FSDP offload, whose
    parameters are fp32 and whose optimizer offload moves the two fp32 moments to the GPU for the
    step and back (no CPU step)."""
    out = {"params": 0.0, "grads": 0.0, "optimizer": 0.0}
    if param:
        out["params"] = 2 * shard.weights * (FP32_BYTES if fsdp else BF16_BYTES) / host_link
    if grad:
        out["grads"] = 2 * shard.weights * FP32_BYTES / host_link
    if optimizer > 0 and fsdp:
        out["optimizer"] = 2 * optimizer * shard.optimizer * 2 * FP32_BYTES / host_link
    elif optimizer > 0:
        moved = optimizer * shard.optimizer
        link = moved * (FP32_BYTES + BF16_BYTES) / host_link
        out["optimizer"] = link + moved * ADAM_BYTES_PER_PARAM / host_memory
    return out


def optimizer_step_s(shard: Shards, hbm: float, offloaded: float = 0.0, fsdp: bool = False) -> float:
    """Seconds of one AdamW step on the GPU (the module docstring): the share of the rank's
    optimizer shard that steps there, 28 bytes a parameter at HBM bandwidth."""
    on_gpu = shard.optimizer * (1.0 if fsdp else 1.0 - offloaded)
    return on_gpu * ADAM_BYTES_PER_PARAM / hbm


def expert_floor_s(facts: dict, tokens_per_micro: float, micro: int, ep: int, pp: int, hbm: float, flop_rate: float,
                   dtype_bytes: float = BF16_BYTES) -> float:  # fmt: skip
    """Seconds one forward pass of a rank loses to expert GEMMs that are bound by reading their
    weights: per micro-batch and local MoE layer, the local experts' weight bytes at HBM
    bandwidth beyond the FLOP time of the tokens that reach them."""
    if not model_facts.is_moe(facts):
        return 0.0
    experts = facts["num_experts"] / ep
    read = experts * facts["expert_params"] * dtype_bytes / hbm
    # a rank computes, for its local experts, as many expert-token products as its own tokens route
    compute = 2 * tokens_per_micro * facts["experts_per_token"] * facts["expert_params"] / flop_rate
    layers = facts["moe_layers"] / pp
    return micro * layers * max(0.0, read - compute)
