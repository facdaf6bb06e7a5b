"""The memory roofline of a decode iteration, to hold a GPU profile against physics.

A decode iteration reads every weight once and every running sequence's KV cache once. Per
tensor-parallel rank (each rank reads its shard, all ranks in parallel):

    bytes = weight_bytes / TP + batch x context x kv_bytes_per_token / TP
    time >= bytes / HBM bandwidth

with `weight_bytes = num_params x dtype_bytes` and `kv_bytes_per_token = 2 (K and V) x layers x
kv_heads x head_dim x dtype_bytes`, from the profile's `model_facts`, and the bandwidth from its
`gpu_facts.hbm_bytes_per_s` (H100/H800 SXM 3.35 TB/s, H200 4.8 TB/s). A profile whose iteration
is faster than this bound is impossible; real engines reach about 50-70% of it (the slime fit of
DeepSeek-R1-Distill-Llama-8B on an H200-class GPU: 49-67%). The roofline fraction reported here
is `bound / profile time`: 1.0 would be a GPU doing nothing but streaming memory.

Loading a GPU profile (one that states the facts the bound needs) checks its grid: a feasible cell
above 100% of the bound is refused in one sentence, one above 85% warns (`ProfileWarning`), a
sign of a wrong constant. CPU profiles state no HBM bandwidth (the tiny model fits in cache) and
are exempt.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlsim import model_facts
from rlsim.errors import RlsimError

if TYPE_CHECKING:  # the profile's loader runs the check below
    from rlsim.profile import Profile

WARN_FRACTION, REFUSE_FRACTION = 0.85, 1.0
BATCHES = (32, 64, 128, 256)
CONTEXTS = (1024, 4096, 8192, 16384)




def has_roofline(profile: Profile) -> bool:
    """Whether the profile states what the bound needs (GPU profiles do; CPU ones need not)."""
    facts = profile.model_facts
    kv = "kv_bytes_per_token" in facts or all(k in facts for k in ("num_kv_heads", "head_dim"))
    need = ("num_params", "num_layers", "dtype_bytes")
    return kv and all(k in facts for k in need) and "hbm_bytes_per_s" in profile.gpu_facts


def roofline_s(profile: Profile, batch: int, context: int) -> float:
    """Lower bound on one decode iteration of `batch` sequences of `context` tokens each: one
    rank reads its share of the weights the batch uses (of an MoE model's routed experts, those its
    tokens hit) and of the batch's KV. With p pipeline stages, an iteration is p micro-batches of
    batch / p through every stage: each stage reads its weights once a micro-batch (a rank: the
    weights over TP in all) and its layers' share of the KV. With data-parallel attention (every
    rank of the group at this batch), a GPU reads its rank's own weights over TP and its share
    over DP x TP of the routed experts the group's tokens hit."""
    facts, tp, pp = profile.model_facts, profile.tensor_parallel_size, profile.pipeline_parallel_size
    micro = max(batch / pp, min(batch, 1))  # with pipeline stages, each reads its weights once a micro-batch
    dp = profile.data_parallel_size
    if dp > 1:
        own = float(facts["num_params"]) - model_facts.routed_params(facts)
        hit = model_facts.weights_read_params(facts, dp * batch) - own
        weights = (own / tp + hit / (dp * tp)) * facts["dtype_bytes"]
    else:
        weights = model_facts.weights_read_params(facts, micro) * facts["dtype_bytes"] / tp
    kv = batch * context * model_facts.kv_bytes_per_token(facts) / model_facts.kv_shards(facts, tp) / pp
    return (weights + kv) / profile.gpu_facts["hbm_bytes_per_s"]


@dataclass(frozen=True, slots=True)
class Cell:
    """One (batch, context) point of a profile's decode grid."""

    batch: int
    context: int
    iteration_s: float
    tokens_per_s: float
    roofline_s: float
    roofline_fraction: float
    kv_fits: bool  # batch x context within the KV capacity and batch within max_num_seqs


def cell(profile: Profile, batch: int, context: int) -> Cell:
    """The profile's steady decode iteration at (batch, context) against the roofline (with
    data-parallel attention, a lockstep iteration of the group with every rank at this batch)."""
    t = profile.iteration_s(batch, batch * context, batch) + profile.compute_excess_s(batch) + profile.dp_group_s(batch)
    bound = roofline_s(profile, batch, context)
    fits = batch * context <= profile.kv_capacity_tokens and batch <= profile.engine.max_num_seqs
    return Cell(batch, context, t, batch / t, bound, bound / t if t > 0 else math.inf, fits)


def grid(profile: Profile, batches=BATCHES, contexts=CONTEXTS) -> list[Cell]:  # noqa: ANN001
    """Cells over batch x context (docs/calibrate.md's grid by default)."""
    return [cell(profile, b, c) for b in batches for c in contexts]


class ProfileWarning(UserWarning):
    """A profile that loads but looks wrong (a cell close to the memory roofline)."""


def _fraction(x: float) -> str:
    return f"{x:.0%}" if x < 100 else f"{x:.2g} times"


def check_roofline(profile: Profile, where: str) -> None:
    """Refuse a GPU profile faster than physics on a feasible cell; warn close to it."""
    if not has_roofline(profile):
        return
    cells = [c for c in grid(profile) if c.kv_fits]
    if not cells:
        return
    worst = max(cells, key=lambda c: c.roofline_fraction)
    at = f"batch {worst.batch}, context {worst.context:,}"
    if worst.roofline_fraction > REFUSE_FRACTION:
        raise RlsimError(
            f"{where}: at {at} the profile decodes in {worst.iteration_s * 1e3:.3g} ms, below the memory "
            f"roofline of {worst.roofline_s * 1e3:.3g} ms ({_fraction(worst.roofline_fraction)} of the bound): "
            "a constant is wrong"
        )
    if worst.roofline_fraction > WARN_FRACTION:
        warnings.warn(
            f"{where}: at {at} the profile reaches {worst.roofline_fraction:.0%} of the memory roofline "
            f"(real engines reach about 50-70%): check its constants",
            ProfileWarning,
            stacklevel=3,
        )
