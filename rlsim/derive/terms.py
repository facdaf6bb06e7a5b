"""Framework terms fitted to published runs, laid over a derived profile (`--terms FILE|NAME`).

A derived profile states only what physics and the cited sources give. A framework's terms are
what a published end-to-end run pins down and physics does not, each in a unit that scales like
what it stands for, so that one fit serves an 8B and a 671B model alike:

- `layer_iteration_s`, seconds per decoder layer per engine iteration (added to `t_w_s` as
  `num_layers x` it): an iteration's time beyond the roofline is the gaps between its kernels
  (launch, synchronisation, the all-reduces' setup), a fixed number of them per layer;
- `expert_token_layer_s`, seconds per routed token-expert pair per MoE layer (added to `gamma_s`
  and `prefill_s_per_token` as `moe_layers x experts_per_token x` it): beyond the roofline of the
  expert weights it reads, vLLM's fused-MoE layer does a fixed piece of work for every (token,
  expert) pair it routes (the top-k selection, sorting the pairs into expert blocks padded to
  the kernel's block size, gathering each pair's activations and combining its weighted output),
  so it grows with the tokens and the experts each token uses, and a dense model pays none. The
  shipped fit leaves it out: cross-validated inside NeMo RL's fit half with the stand-ins at
  their published means, the three other terms score 0.0407 and the four 0.0483
  (`published_runs/term_sets.json`), so it is left to users' files;
- `refit_per_tensor_s`, seconds per weight tensor of a refit (it replaces the derived
  resharding collective): each tensor is gathered, converted and loaded by the engine one by one;
- `megatron_dense_mfu`: the Megatron trainer's MFU on a dense model, the one training term (MFU
  per backend); a mixture-of-experts model trains at it times its published efficiency against a
  dense model (`rlsim.derive.moe_training`, Megatron-Bridge's own pre-training throughput: 0.15
  for Qwen3-30B-A3B), as the derived default does.

The shipped `nemo-rl` file fits three of them (`fitted_terms`: per layer per iteration, per refit
tensor, Megatron's dense MFU): the set with the lowest two-fold cross-validated loss inside the fit
half among the derived profile, the four terms and each set of three
(`doctables/published_runs.py --term-sets`; docs/accuracy.md gives the table).

One more term is available to a user's file, fitted by nobody shipped: `net_hop_s`, seconds per
network hop of an all-reduce that leaves the scale-up domain (added to `t_w_s` as `2 x num_layers
x 2 log2(k) x` it for a TP group over k domains; an instance inside one domain pays none). The
derivation charges each hop NCCL's wire latency (5 us, `rlsim.derive.derive`); what a collective
across nodes costs beyond it (the proxy thread that drives the NIC, the GPU waiting on its flags)
is paid per hop whatever the bytes, twice per tree level. As the second shipped term it
cross-validated no better than the per-pair term inside NeMo RL's fit half (0.0532 against
0.0529, `doctables/published_runs.py --units hop,expert`, before the stand-ins reached their
published means), so it is not shipped.

Five older terms stay available to a user's file, fitted by nobody shipped: `megatron_mfu` (the
Megatron MFU of every model, dense or MoE, as the shipped fit used it until the dense MFU above
replaced it), `iteration_overhead_s` (seconds per iteration, whatever the model),
`sequence_iteration_s` (seconds per running sequence per iteration, whatever the model),
`sequence_layer_iteration_s` (seconds per running sequence per decoder layer per iteration, added to
`alpha_s` as `num_layers x` it; the shipped fit used these two in turn until the expert term above
replaced them) and `prefill_request_s` (seconds per request an iteration prefills). A terms file
holds the fitted values with their provenance (which rows, which objective); `nemo-rl` is the
shipped one, fitted on the fit half of NeMo RL's published step times
(`doctables/published_runs.py`, whose other half is its test).
Two more are what `rlsim calibrate run` fits on a user's own logged run (`rlsim.calibration.run`),
each from the phases that identify it: `train_mfu`, the trainer's MFU in the update (forward and
backward, `timing_s/update_actor`), whatever the backend, and `forward_mfu`, its MFU in the
forward-only passes (old log-probs and the reference's, `timing_s/old_log_prob` and `/ref`),
apart from the update's. Over a measured training block (`rlsim calibrate train`, whose `mfu` is
1: the rate as measured) both are efficiencies relative to the measurement.
A term a file leaves out keeps the derived value. No other framework's terms are shipped: a
veRL, slime or ROLL run simulates with the derived values and that framework's own settings
(docs/accuracy.md), never with NeMo RL's unless `--terms nemo-rl` is given.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from rlsim.derive.derive import domains
from rlsim.derive.moe_training import moe_training_efficiency
from rlsim.errors import RlsimError
from rlsim.files import read_json_object

SHIPPED = ("nemo-rl",)
# the terms that are a time per unit (layer, sequence, pair, hop): never negative
PER_UNIT_TERMS = ("layer_iteration_s", "sequence_layer_iteration_s", "sequence_iteration_s", "expert_token_layer_s",
                  "net_hop_s")  # fmt: skip
# a profile's fields that follow the run's engine settings, not the derivation: left out of its digest, so
# terms calibrated at one memory fraction are not warned about at another
RUN_FIELDS = ("kv_capacity_tokens", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "block_size",
              "async_scheduling")  # fmt: skip
# the terms whose None keeps the derived value (a file may write them as null)
NULLABLE = ("refit_per_tensor_s", "megatron_dense_mfu", "megatron_mfu", "train_mfu", "forward_mfu")


@dataclass(frozen=True, slots=True)
class Terms:
    """Fitted framework terms; `None` keeps the derived value."""

    layer_iteration_s: float = 0.0
    sequence_layer_iteration_s: float = 0.0
    expert_token_layer_s: float = 0.0
    net_hop_s: float = 0.0
    refit_per_tensor_s: float | None = None
    megatron_dense_mfu: float | None = None
    megatron_mfu: float | None = None
    iteration_overhead_s: float = 0.0
    sequence_iteration_s: float = 0.0
    prefill_request_s: float = 0.0
    train_mfu: float | None = None
    forward_mfu: float | None = None

    def __post_init__(self) -> None:
        for name in PER_UNIT_TERMS:
            if getattr(self, name) < 0:
                raise RlsimError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.iteration_overhead_s < 0:
            raise RlsimError(f"iteration_overhead_s must be >= 0, got {self.iteration_overhead_s}")
        if self.prefill_request_s < 0:
            raise RlsimError(f"prefill_request_s must be >= 0, got {self.prefill_request_s}")
        if self.refit_per_tensor_s is not None and self.refit_per_tensor_s < 0:
            raise RlsimError(f"refit_per_tensor_s must be >= 0, got {self.refit_per_tensor_s}")
        for name in ("megatron_dense_mfu", "megatron_mfu", "train_mfu", "forward_mfu"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 1:
                raise RlsimError(f"{name} must be in (0, 1], got {value}")
        if self.megatron_dense_mfu is not None and self.megatron_mfu is not None:
            raise RlsimError("give megatron_dense_mfu or megatron_mfu, not both")
        if self.train_mfu is not None and (self.megatron_dense_mfu is not None or self.megatron_mfu is not None):
            raise RlsimError("give train_mfu (any trainer) or a Megatron MFU, not both")

    def apply(self, raw: dict[str, Any], provenance: str = "") -> dict[str, Any]:
        """A copy of the profile dict `raw` with these terms laid over it."""
        raw = json.loads(json.dumps(raw))
        layers = float(raw.get("model_facts", {}).get("num_layers", 0))
        for name in ("layer_iteration_s", "sequence_layer_iteration_s"):
            if getattr(self, name) and not layers:
                raise RlsimError(f"{name} needs a profile with model facts (its number of layers)")
        raw["t_w_s"] = float(f"{raw['t_w_s'] + self.iteration_overhead_s + layers * self.layer_iteration_s:.9g}")
        if self.net_hop_s:
            raw["t_w_s"] = float(f"{raw['t_w_s'] + self._net_hops(raw, layers) * self.net_hop_s:.9g}")
        if self.sequence_iteration_s or self.sequence_layer_iteration_s:
            alpha = raw["alpha_s"] + self.sequence_iteration_s + self.sequence_layer_iteration_s * layers
            raw["alpha_s"] = float(f"{alpha:.9g}")
        if self.expert_token_layer_s:
            facts = raw.get("model_facts", {})
            if not layers:
                raise RlsimError("expert_token_layer_s needs a profile with model facts (its MoE layers)")
            pairs = float(facts.get("moe_layers", 0)) * float(facts.get("experts_per_token", 0))  # 0: dense
            for key in ("gamma_s", "prefill_s_per_token"):
                raw[key] = float(f"{raw[key] + pairs * self.expert_token_layer_s:.9g}")
        if self.prefill_request_s:
            raw["prefill_request_s"] = float(f"{raw.get('prefill_request_s', 0.0) + self.prefill_request_s:.9g}")
        if self.refit_per_tensor_s is not None:
            raw["gpu_facts"]["weight_sync_per_tensor_s"] = self.refit_per_tensor_s
        if self.train_mfu is not None:  # the update's MFU, whatever the trainer (a run's own, calibrated)
            raw["train"]["mfu"] = self.train_mfu
        if self.forward_mfu is not None:  # the forward-only passes' (old log-probs, reference)
            raw["train"]["forward_mfu"] = self.forward_mfu
        if raw["train"].get("backend") == "megatron":
            if self.megatron_mfu is not None:
                raw["train"]["mfu"] = self.megatron_mfu
            elif self.megatron_dense_mfu is not None:
                eff, _ = moe_training_efficiency(raw.get("model_facts", {}))
                raw["train"]["mfu"] = float(f"{self.megatron_dense_mfu * eff:.6g}")
        if provenance:
            raw.setdefault("provenance", {})["fitted_terms"] = provenance
        return raw

    @staticmethod
    def _net_hops(raw: dict[str, Any], layers: float) -> float:
        """Network hops of one iteration's all-reduces: two all-reduces a layer, each twice per
        tree level over the k scale-up domains its TP group spans (`rlsim.derive.derive.domains`;
        none inside one domain)."""
        domain = raw.get("gpu_facts", {}).get("scale_up_domain")
        if not layers or not domain:
            raise RlsimError("net_hop_s needs a profile with model facts and the GPU's scale-up domain")
        k, _ = domains(int(raw.get("tensor_parallel_size", 1)), int(domain))
        return 2 * layers * 2 * math.log2(k)


def load_terms(name_or_path: str) -> tuple[Terms, str]:
    """The terms of a shipped name (`nemo-rl`) or a JSON file, and a line of provenance."""
    if name_or_path not in SHIPPED and not Path(name_or_path).is_file():
        raise RlsimError(f"unknown terms {name_or_path!r}: give a JSON file or one of {', '.join(SHIPPED)}")
    raw = terms_record(name_or_path)
    where = f"rlsim/derive/terms_{name_or_path}.json" if name_or_path in SHIPPED else name_or_path
    values = raw.get("terms")
    if not isinstance(values, dict):
        raise RlsimError(f"{where} has no 'terms' object")
    known = {f.name for f in fields(Terms)}
    if not values:  # (it would run as the derived profile, labelled fitted)
        raise RlsimError(f"{where}: its 'terms' object names no term; give at least one of {', '.join(sorted(known))}")
    unknown = sorted(set(values) - known)
    if unknown:
        raise RlsimError(f"{where}: unknown term {unknown[0]!r}; known: {', '.join(sorted(known))}")
    for key, value in values.items():  # (None keeps the derived value of a term that has one)
        if value is None and key in NULLABLE:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise RlsimError(f"{where}: '{key}' must be a number >= 0, got {value!r}")
    try:
        terms = Terms(**values)
    except TypeError as exc:
        raise RlsimError(f"{where}: {exc}") from None
    return terms, f"{where}: {raw.get('fitted_on', 'provenance not stated')}"


def derivation_digest(raw: dict[str, Any]) -> str:
    """A digest of a profile as derived or measured, before terms (its name and provenance left
    out): a calibrated terms file records it, and a later rlsim that derives the profile otherwise
    says so (`derivation_warning`)."""
    body = {k: v for k, v in raw.items() if k not in ("provenance", "name", *RUN_FIELDS)}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def terms_record(name_or_path: str) -> dict[str, Any]:
    """The whole terms file (a shipped name or a path): what it rests on besides its terms."""
    if name_or_path in SHIPPED:
        text = (resources.files("rlsim.derive") / f"terms_{name_or_path}.json").read_text(encoding="utf-8")
        return json.loads(text)
    return read_json_object(Path(name_or_path))


def derivation_warning(record: dict[str, Any], raw: dict[str, Any], where: str) -> str | None:
    """One sentence where a calibrated terms file was fitted over another derivation of this profile."""
    recorded = (record.get("derivation") or {}).get(str(raw.get("name", "")))
    if recorded is None or recorded == derivation_digest(raw):
        return None
    version = record.get("rlsim_version", "?")
    return (f"warning: {where} was calibrated (rlsim {version}) over a derivation of {raw.get('name')} that this "
            "rlsim derives otherwise: its terms may no longer fit; calibrate again")  # fmt: skip


def calibrated_provenance(record: dict[str, Any], where: str) -> dict[str, Any] | None:
    """What a calibrated terms file's prediction rests on, for the profile's provenance (the bands' basis)."""
    cal = record.get("calibration")
    if record.get("basis") != "calibrated" or not isinstance(cal, dict):
        return None
    return {"terms_file": where, "steps": cal.get("steps"), "runs": len(cal.get("runs") or []),
            "step_residual_pct": cal.get("step_residual_pct")}  # fmt: skip
