"""What one decode iteration costs on a GPU, term by term, and the closed form it folds into.

A vLLM iteration over B running sequences holding C tokens of KV context, computing N_dec decode
(or draft-verification) tokens and N_pre prefill tokens, on a tensor-parallel group of TP GPUs:

- linear layers, per layer: max(weight-read line `t0/L + g/L x N_dec`, compute-bound `p/L x N_dec`)
  + `p/L x N_pre` (a decode batch is bound by reading the weights until its tokens' FLOPs take
  longer: the compute knee; prefill chunks are compute-bound);
- attention, per layer: the KV of every running sequence read once, `C x kv_bytes_per_layer / TP`
  over `attn_bw_fraction x HBM bandwidth`;
- tensor-parallel all-reduce, two per layer (after attention and after the MLP) when TP > 1:
  `latency + tokens x hidden x dtype_bytes x 2 (TP - 1) / TP / link bandwidth` each (ring);
- once per iteration: the LM head's weight read, the framework and sampler time;
- per running sequence: scheduling, input preparation and sampling (`per_seq_s`).

`reference_iteration_s` adds these up layer by layer; `closed_form` folds them into the profile's
five coefficients, `t = t_w + alpha B + beta C + gamma N_dec + prefill N_pre`, plus the knee
(`Profile.compute_excess_s` with `linear_t0_s`), which is exactly what the simulator charges.
`calibrate.derive_profiles` fills `Terms` from measurements and cites each one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Gpu:
    """What the iteration model needs of a GPU (vendor datasheet figures)."""

    name: str
    hbm_bytes_per_s: float
    bf16_flops_per_s: float
    link_bytes_per_s: float  # NVLink, what the tensor-parallel all-reduce crosses
    memory_bytes: float


H100 = Gpu("H100-SXM-80GB", 3.35e12, 989e12, 900e9, 80e9)
H800 = Gpu("H800-SXM-80GB", 3.35e12, 989e12, 400e9, 80e9)  # an H100 with NVLink cut to 400 GB/s
H200 = Gpu("H200-SXM-141GB", 4.8e12, 989e12, 900e9, 141e9)


@dataclass(frozen=True, slots=True)
class Terms:
    """The per-iteration terms of one model at one TP degree on one GPU (seconds unless named)."""

    num_layers: int
    hidden_size: int
    dtype_bytes: int
    kv_bytes_per_token: float  # whole model, all layers, K and V
    tensor_parallel_size: int
    linear_t0_s: float  # linear layers' weight-read time at zero tokens (all layers, one rank)
    linear_s_per_token: float  # their slope below the knee
    linear_prefill_s_per_token: float  # their compute-bound slope
    lm_head_s: float
    framework_s: float
    per_seq_s: float
    attn_bw_fraction: float
    hbm_bytes_per_s: float
    allreduce_latency_s: float
    link_bytes_per_s: float

    @property
    def allreduce_calls(self) -> int:
        return 2 * self.num_layers if self.tensor_parallel_size > 1 else 0

    @property
    def allreduce_s_per_token(self) -> float:
        """All-reduce time per computed token over all calls of an iteration (ring algorithm)."""
        tp = self.tensor_parallel_size
        if tp == 1:
            return 0.0
        per_call = self.hidden_size * self.dtype_bytes * 2 * (tp - 1) / tp / self.link_bytes_per_s
        return self.allreduce_calls * per_call


def reference_iteration_s(terms: Terms, batch: int, context: int, decode_tokens: int, prefill_tokens: int = 0) -> float:
    """One iteration summed layer by layer, the reference the closed form must reproduce."""
    L, tp = terms.num_layers, terms.tensor_parallel_size
    kv_layer = terms.kv_bytes_per_token / L / tp
    tokens = decode_tokens + prefill_tokens
    total = terms.lm_head_s + terms.framework_s + terms.per_seq_s * batch
    for _ in range(L):
        weight_bound = terms.linear_t0_s / L + terms.linear_s_per_token / L * decode_tokens
        compute_bound = terms.linear_prefill_s_per_token / L * decode_tokens
        total += max(weight_bound, compute_bound) + terms.linear_prefill_s_per_token / L * prefill_tokens
        total += context * kv_layer / (terms.attn_bw_fraction * terms.hbm_bytes_per_s)
        if tp > 1:
            per_call = terms.allreduce_s_per_token / terms.allreduce_calls
            total += 2 * (terms.allreduce_latency_s + per_call * tokens)
    return total


def closed_form(terms: Terms) -> dict[str, float]:
    """The profile's coefficients, and `linear_t0_s` for the knee."""
    ar_latency = terms.allreduce_calls * terms.allreduce_latency_s
    return {
        "t_w_s": terms.linear_t0_s + terms.lm_head_s + terms.framework_s + ar_latency,
        "alpha_s": terms.per_seq_s,
        "beta_s": terms.kv_bytes_per_token
        / terms.tensor_parallel_size
        / (terms.attn_bw_fraction * terms.hbm_bytes_per_s),
        "gamma_s": terms.linear_s_per_token + terms.allreduce_s_per_token,
        "prefill_s_per_token": terms.linear_prefill_s_per_token + terms.allreduce_s_per_token,
        "linear_t0_s": terms.linear_t0_s,
    }

