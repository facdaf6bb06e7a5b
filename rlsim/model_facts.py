"""What a profile's `model_facts` say about bytes: weights, the weights one iteration reads, KV.

Dense and mixture-of-experts models, with grouped-query (GQA) or multi-head latent attention
(MLA, DeepSeek-V2/V3), share one set of facts (`rlsim.derive.models` writes them):

- `num_params` (all weights), `num_active_params` (those one token uses; the same for a dense
  model), `num_layers`, `hidden_size`, `dtype_bytes` (of the weights), `num_tensors`;
- attention: `num_kv_heads` and `head_dim` (GQA), or `kv_lora_rank` and `qk_rope_head_dim` (MLA);
  `kv_bytes_per_token` when stated (K and V of one token over all layers, at `kv_dtype_bytes`),
  else GQA's `2 x layers x KV heads x head dim x dtype bytes`;
- experts (MoE only): `moe_layers`, `num_experts`, `experts_per_token`, `expert_params` (one
  routed expert of one layer), `shared_expert_params` (per MoE layer, always read).

Tensor parallelism splits the weights over its ranks, and GQA's KV by heads (replicated once the
ranks outnumber the KV heads), while MLA's latent KV is held in full by every rank, as vLLM does
(`kv_shards`).
"""

from __future__ import annotations

import math
from typing import Any


def kv_bytes_per_token(facts: dict[str, Any]) -> float:
    """K and V of one token over all layers (the whole model, before tensor parallelism)."""
    if "kv_bytes_per_token" in facts:
        return float(facts["kv_bytes_per_token"])
    return 2.0 * facts["num_layers"] * facts["num_kv_heads"] * facts["head_dim"] * facts["dtype_bytes"]


def kv_shards(facts: dict[str, Any], tensor_parallel_size: int) -> int:
    """Over how many ranks of a TP group one token's KV is split (each rank holds 1/shards)."""
    if "kv_lora_rank" in facts:  # MLA: the latent is not split by heads
        return 1
    # GQA: split by heads; past as many ranks as KV heads, vLLM replicates each head over
    # tp / kv_heads ranks, so a rank still holds one head's share
    return min(tensor_parallel_size, int(facts.get("num_kv_heads", tensor_parallel_size)))


def experts_hit(num_experts: int, experts_per_token: int, tokens: float) -> float:
    """Expected distinct experts of one layer that `tokens` tokens route to, each choosing
    `experts_per_token` of `num_experts` uniformly: E x (1 - (1 - k/E)^N)."""
    if tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** tokens)


def is_moe(facts: dict[str, Any]) -> bool:
    return bool(facts.get("num_experts"))


def routed_params(facts: dict[str, Any]) -> float:
    """All routed experts' weights (zero for a dense model)."""
    if not is_moe(facts):
        return 0.0
    return float(facts["moe_layers"]) * facts["num_experts"] * facts["expert_params"]


def weights_read_params(facts: dict[str, Any], tokens: float) -> float:
    """Weights one forward pass over `tokens` tokens reads: every dense weight and shared
    expert, and of the routed experts only those the tokens hit."""
    if not is_moe(facts):
        return float(facts["num_params"])
    hit = experts_hit(int(facts["num_experts"]), int(facts["experts_per_token"]), tokens)
    return float(facts["num_params"]) - routed_params(facts) + facts["moe_layers"] * hit * facts["expert_params"]


def active_params(facts: dict[str, Any]) -> float:
    """Weights one token computes with (what its FLOPs scale with)."""
    return float(facts.get("num_active_params", facts["num_params"]))


def tokens_to_touch_every_expert(facts: dict[str, Any], share: float = 0.99) -> int:
    """Tokens after which `share` of a layer's experts are hit, on average."""
    e, k = int(facts["num_experts"]), int(facts["experts_per_token"])
    return math.ceil(math.log(1.0 - share) / math.log(1.0 - k / e))
