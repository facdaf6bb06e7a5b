"""A model's architecture from its Hugging Face `config.json`, as the bytes and FLOPs that cost it.

`load_model(name_or_path)` takes a name from the shipped table (`models.json`: Qwen2.5, Qwen3
dense and MoE, Llama-3.1, DeepSeek-V3/R1 and their distills; `rlsim profile list --models`), a
`config.json`, or a model directory holding one. It reads:

- dense GQA (Llama, Qwen2/2.5/3): hidden size, layers, attention and KV heads, head dim (given or
  hidden / heads), the gated MLP's intermediate size, vocabulary, tied embeddings;
- mixture of experts (Qwen3-MoE's `num_experts`, DeepSeek's `n_routed_experts`, Mixtral's
  `num_local_experts`): routed experts, experts per token, the expert's intermediate size (Mixtral's
  is its `intermediate_size`), shared experts, which layers are dense
  (DeepSeek's `first_k_dense_replace`, Qwen's `mlp_only_layers` and `decoder_sparse_step`);
- multi-head latent attention (DeepSeek-V2/V3's `kv_lora_rank`): the query and KV low-rank
  projections, and a latent KV of `kv_lora_rank + qk_rope_head_dim` values per token per layer.

DeepSeek-V3's multi-token-prediction layer (`num_nextn_predict_layers`) is left out: vLLM loads it
only as a speculative-decoding drafter, which a derived profile does not model. A config missing a
field this needs is refused in one sentence naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rlsim.errors import RlsimError
from rlsim.files import read_json_object

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}


def shipped_models() -> dict[str, dict[str, Any]]:
    """The shipped table: name -> config fields (with `source`, the Hugging Face repository)."""
    raw = json.loads((resources.files("rlsim.derive") / "models.json").read_text(encoding="utf-8"))
    return {k: v for k, v in raw.items() if not k.startswith("_")}


@dataclass(frozen=True, slots=True)
class Model:
    """Parameter counts (per layer where they differ by layer) and attention shape."""

    name: str
    source: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # GQA; for MLA the query/key head dim (nope + rope)
    vocab_size: int
    attn_params: float  # one layer's attention projections
    dense_mlp_params: float  # one dense layer's MLP (0 if every layer is MoE)
    num_dense_layers: int
    moe_layers: int
    num_experts: int
    experts_per_token: int
    expert_params: float  # one routed expert of one layer
    shared_expert_params: float  # per MoE layer, always computed
    router_params: float  # per MoE layer
    embed_params: float  # input embeddings plus the LM head unless tied
    lm_head_params: float
    kv_lora_rank: int = 0  # MLA's latent KV width (0: GQA)
    qk_rope_head_dim: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_params(self) -> float:
        per_moe = self.num_experts * self.expert_params + self.shared_expert_params + self.router_params
        layers = self.num_layers * self.attn_params + self.num_dense_layers * self.dense_mlp_params
        return layers + self.moe_layers * per_moe + self.embed_params

    @property
    def num_active_params(self) -> float:
        """Weights one token computes with (its routed experts only)."""
        per_moe = self.experts_per_token * self.expert_params + self.shared_expert_params + self.router_params
        layers = self.num_layers * self.attn_params + self.num_dense_layers * self.dense_mlp_params
        return layers + self.moe_layers * per_moe + self.embed_params

    def kv_values_per_token(self) -> int:
        """KV values one token holds over all layers: MLA's latent and rope key, or GQA's K and V."""
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def facts(self, dtype: str, kv_dtype: str) -> dict[str, Any]:
        """The profile's `model_facts` (`rlsim.model_facts`)."""
        wb, kb = DTYPE_BYTES[dtype], DTYPE_BYTES[kv_dtype]
        out: dict[str, Any] = {
            "num_params": self.num_params, "num_active_params": self.num_active_params,
            "num_non_embedding_params": self.num_params - self.embed_params, "num_layers": self.num_layers,
            "hidden_size": self.hidden_size, "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim,
            "dtype_bytes": wb, "kv_dtype_bytes": kb, "kv_bytes_per_token": self.kv_values_per_token() * kb,
            "num_tensors": self.num_layers * (9 if not self.is_moe else 9 + 3 * self.num_experts) + 3,
        }  # fmt: skip
        if self.is_mla:
            out |= {"kv_lora_rank": self.kv_lora_rank, "qk_rope_head_dim": self.qk_rope_head_dim}
        if self.is_moe:
            out |= {
                "moe_layers": self.moe_layers, "num_experts": self.num_experts,
                "experts_per_token": self.experts_per_token, "expert_params": self.expert_params,
                "shared_expert_params": self.shared_expert_params,
            }  # fmt: skip
        return out


@dataclass(frozen=True, slots=True)
class ConfigField:
    """One `config.json` field rlsim reads: its kind of value, when it is needed, what it is. The
    loader checks every field present against this list, and docs/formats.md is written from it."""

    name: str
    kind: str  # "positive integer", "integer >= 0", "true or false", "list of integers >= 0", "text"
    needed: str  # when the derivation needs it: "always", or the architecture that needs it
    meaning: str


CONFIG_FIELDS = (
    ConfigField("hidden_size", "positive integer", "always", "the model's width"),
    ConfigField("num_hidden_layers", "positive integer", "always", "decoder layers"),
    ConfigField("num_attention_heads", "positive integer", "always", "query heads"),
    ConfigField("vocab_size", "positive integer", "always", "vocabulary: the embedding and the LM head"),
    ConfigField("intermediate_size", "positive integer", "a dense layer",
                "the gated MLP's intermediate size (every layer of a dense model, the dense layers of an MoE)"),
    ConfigField("num_key_value_heads", "positive integer", "", "KV heads (GQA), dividing the query heads; "
                "left out: as many as the query heads"),
    ConfigField("head_dim", "positive integer", "", "one head's width; left out: hidden_size / heads"),
    ConfigField("tie_word_embeddings", "true or false", "", "the LM head shares the embedding's weights"),
    ConfigField("num_experts", "positive integer", "", "routed experts per MoE layer (Qwen-MoE); leave it "
                "out for a dense model"),
    ConfigField("n_routed_experts", "positive integer", "", "routed experts per MoE layer (DeepSeek)"),
    ConfigField("num_local_experts", "positive integer", "", "routed experts per MoE layer (Mixtral), each of "
                "intermediate_size unless moe_intermediate_size is given"),
    ConfigField("num_experts_per_tok", "positive integer", "MoE", "experts each token is routed to, at most the "
                "routed experts"),
    ConfigField("moe_intermediate_size", "positive integer", "MoE", "one expert's intermediate size (left out "
                "beside num_local_experts: intermediate_size)"),
    ConfigField("n_shared_experts", "integer >= 0", "", "shared experts every token passes (DeepSeek)"),
    ConfigField("shared_expert_intermediate_size", "integer >= 0", "", "the shared expert's intermediate size "
                "(Qwen-MoE)"),
    ConfigField("first_k_dense_replace", "integer >= 0", "", "DeepSeek: the first k layers are dense"),
    ConfigField("moe_layer_freq", "positive integer", "", "DeepSeek: every n-th layer past those is MoE"),
    ConfigField("decoder_sparse_step", "positive integer", "", "Qwen-MoE: every n-th layer is MoE"),
    ConfigField("mlp_only_layers", "list of integers >= 0", "", "Qwen-MoE: layers kept dense"),
    ConfigField("kv_lora_rank", "integer >= 0", "", "multi-head latent attention (DeepSeek-V2/V3): the latent KV's "
                "rank; 0 or left out: no MLA"),
    ConfigField("q_lora_rank", "integer >= 0", "", "MLA: the query's low rank (0 or left out: a full query)"),
    ConfigField("qk_nope_head_dim", "positive integer", "MLA", "MLA: a head's width without rotary embedding"),
    ConfigField("qk_rope_head_dim", "positive integer", "MLA", "MLA: a head's rotary width (also cached)"),
    ConfigField("v_head_dim", "positive integer", "MLA", "MLA: a value head's width"),
    ConfigField("source", "text", "", "where the config comes from (provenance)"),
)  # fmt: skip
_FIELDS = {f.name: f for f in CONFIG_FIELDS}
EXPERT_COUNT_FIELDS = ("num_experts", "n_routed_experts", "num_local_experts")
LARGEST = 2**40  # no real model's dimension comes near: larger is a typo, and would overflow the FLOP counts


def _bad(value: Any, kind: str) -> bool:  # noqa: ANN401 - a JSON value
    if kind == "text":
        return not isinstance(value, str)
    if kind == "true or false":
        return not isinstance(value, bool)
    if kind == "list of integers >= 0":
        return not isinstance(value, list) or any(_bad(v, "integer >= 0") for v in value)
    if isinstance(value, bool) or not isinstance(value, int) or value > LARGEST:
        return True
    return value <= 0 if kind == "positive integer" else value < 0


def check_config(cfg: dict[str, Any], where: str) -> None:
    """Every field of `CONFIG_FIELDS` the config holds (a null one counts as left out) has its kind."""
    for key, value in cfg.items():
        f = _FIELDS.get(key)
        if f is not None and value is not None and _bad(value, f.kind):
            bound = f" of at most {LARGEST:,}" if "integer" in f.kind and f.kind != "list of integers >= 0" else ""
            hint = "; leave it out for a dense model" if key in EXPERT_COUNT_FIELDS else ""
            raise RlsimError(f"{where}: '{key}' must be a {f.kind}{bound}, got {value!r}{hint}")


def _need(cfg: dict[str, Any], key: str, where: str) -> Any:  # noqa: ANN401 - a JSON value
    if key not in cfg or cfg[key] is None:
        raise RlsimError(f"{where} lacks '{key}', which rlsim needs to cost the model")
    return cfg[key]  # (its kind was checked by check_config)


def model_from_config(cfg: dict[str, Any], name: str, where: str) -> Model:
    """The `Model` a config describes (see the module docstring)."""
    check_config(cfg, where)
    h = _need(cfg, "hidden_size", where)
    layers = _need(cfg, "num_hidden_layers", where)
    heads = _need(cfg, "num_attention_heads", where)
    vocab = _need(cfg, "vocab_size", where)
    kv_heads = cfg.get("num_key_value_heads") or heads
    if "kv_lora_rank" in cfg and cfg["kv_lora_rank"]:  # MLA (DeepSeek-V2/V3)
        kv_lora = _need(cfg, "kv_lora_rank", where)
        nope, rope = _need(cfg, "qk_nope_head_dim", where), _need(cfg, "qk_rope_head_dim", where)
        v_dim = _need(cfg, "v_head_dim", where)
        q_lora = cfg.get("q_lora_rank") or 0
        q = h * q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope)
        attn = q + h * (kv_lora + rope) + kv_lora * heads * (nope + v_dim) + heads * v_dim * h
        head_dim = nope + rope
    else:
        head_dim = cfg.get("head_dim") or h // heads
        if head_dim == 0:
            raise RlsimError(f"{where}: hidden_size {h} is less than num_attention_heads {heads}: give 'head_dim'")
        attn = h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h
        kv_lora, rope = 0, 0
    experts = cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0
    if experts:
        k = _need(cfg, "num_experts_per_tok", where)
        if k > experts:
            raise RlsimError(f"{where}: 'num_experts_per_tok' ({k}) is more than the model's {experts} routed experts")
        mixtral = cfg.get("moe_intermediate_size") is None and bool(cfg.get("num_local_experts"))
        expert_inter = _need(cfg, "intermediate_size" if mixtral else "moe_intermediate_size", where)
        if "first_k_dense_replace" in cfg:  # DeepSeek: the first k layers dense, then every moe_layer_freq-th
            first, freq = int(cfg["first_k_dense_replace"] or 0), int(cfg.get("moe_layer_freq") or 1)
            moe = sum(1 for i in range(layers) if i >= first and i % freq == 0)
        else:  # Qwen-MoE: every decoder_sparse_step-th layer, except mlp_only_layers
            step, dense_only = int(cfg.get("decoder_sparse_step") or 1), set(cfg.get("mlp_only_layers") or [])
            moe = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        shared = int(cfg.get("n_shared_experts") or 0) * 3 * h * expert_inter
        shared += 3 * h * int(cfg.get("shared_expert_intermediate_size") or 0)
        dense_mlp = 3 * h * _need(cfg, "intermediate_size", where) if layers > moe else 0
        expert, router = 3 * h * expert_inter, h * experts
    else:
        k, moe, shared, router, expert = 0, 0, 0, 0, 0
        dense_mlp = 3 * h * _need(cfg, "intermediate_size", where)
    if heads % kv_heads:
        raise RlsimError(f"{where}: {heads} attention heads are not a multiple of {kv_heads} KV heads")
    tied = bool(cfg.get("tie_word_embeddings", False))
    return Model(
        name=name, source=str(cfg.get("source", where)), num_layers=layers, hidden_size=h, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=vocab, attn_params=float(attn),
        dense_mlp_params=float(dense_mlp), num_dense_layers=layers - moe, moe_layers=moe, num_experts=int(experts),
        experts_per_token=int(k), expert_params=float(expert), shared_expert_params=float(shared),
        router_params=float(router), embed_params=float(vocab * h * (1 if tied else 2)),
        lm_head_params=float(vocab * h), kv_lora_rank=int(kv_lora), qk_rope_head_dim=int(rope),
    )  # fmt: skip


def flops_per_token(model: Model, seq_len: int) -> float:
    """FLOPs of one update per trained token of a `seq_len`-token sequence, as rlsim counts them
    (`rlsim.step_costs.forward_flops`, three forwards)."""
    return 3 * (2 * model.num_active_params + 2 * model.num_layers * model.hidden_size * seq_len)


def load_model(name_or_path: str) -> Model:
    """A shipped model by name, or a `config.json` (the file or its model directory)."""
    table = shipped_models()
    if name_or_path.lower() in table:
        key = name_or_path.lower()
        return model_from_config(table[key], key, f"shipped model {key}")
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise RlsimError(
            f"unknown model {name_or_path!r}: give a config.json, a model directory, or one of {', '.join(table)}"
        )
    cfg = read_json_object(path, "JSON config")
    cfg = cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg  # multimodal wrappers
    name = path.parent.name if path.name == "config.json" else path.stem
    return model_from_config(cfg, name.lower(), str(path))
