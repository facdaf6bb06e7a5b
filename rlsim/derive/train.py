"""The trainer a derived profile assumes: its backend's published MFU, and its layout.

`rlsim.step_costs` prices training as FLOPs (forward `2 N T + 2 L d T^2` per sequence, the
update three forwards) at an MFU of the training GPUs' dense bf16 peak, plus what the layout adds
(tensor- and expert-parallel traffic, the pipeline's bubble). The MFU defaults to a published
figure for the backend, re-read under that same FLOP count so that the figure and rlsim's count
agree:

- `fsdp2` (veRL's FSDP backend, PyTorch FSDP2): TorchTitan's 1D FSDP run of Llama 3.1 8B on 8
  H100s, without torch.compile or Float8, at sequence length 8,192: 5,762 tokens/s per GPU
  (github.com/pytorch/torchtitan, docs/performance.md, Table 1; the page states 33-39% MFU under
  its own count). Under rlsim's count that is 31.8% of 989 TFLOP/s.
- `megatron` (veRL's and NeMo RL's Megatron-Core backend): "up to 47% Model FLOP Utilization
  (MFU) on H100 clusters" (github.com/NVIDIA/Megatron-LM, README), the top of its published range
  (reached by its largest models), so an upper bound for the 7-32B dense models RL teams train.
  A mixture-of-experts model trains at that times its published efficiency against a dense model
  (`rlsim.derive.moe_training`: Megatron-Bridge's pre-training throughput, 0.15 for Qwen3-30B-A3B).

These are defaults, not fits: a published-runs fit may replace them only through a fitted
profile file that records its provenance. veRL's FSDP backend shards data-parallel only (with
Ulysses sequence parallelism, `--train-cp`); tensor, pipeline and expert parallelism need the
Megatron backend. On the command line a trainer is `--trainer megatron(tp=2,pp=4,mfu=0.4)`
(`Trainer.parse`), with what the framework does around the FLOPs among its settings
(`megatron(tp=4,recompute=full,optimizer_offload_fraction=1,param_offload=true)`: activation
recompute, virtual pipeline stages, micro-batches and dynamic batch size, offload;
`rlsim.framework_costs`). The update's AdamW step is costed there too (each GPU's optimizer shard
at HBM bandwidth); a derived profile states no other fixed cost per update (`fixed_s` 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from rlsim.derive.gpus import GpuSpec
from rlsim.derive.models import Model, flops_per_token, load_model
from rlsim.derive.moe_training import moe_training_efficiency
from rlsim.errors import RlsimError
from rlsim.framework_costs import FrameworkSettings

H100_BF16_FLOPS_PER_S = 989e12  # the published runs' GPU (gpus.json, h100)
TORCHTITAN_TOKENS_PER_S_PER_GPU, TORCHTITAN_SEQ_LEN = 5762, 8192  # Llama 3.1 8B, 1D FSDP, eager
MEGATRON_MFU = 0.47
TRAIN_FIXED_S = 0.0  # nothing beyond what is costed (the optimizer step: rlsim.framework_costs)
BACKENDS = ("fsdp2", "megatron")
FRAMEWORK_NAMES = {f.name for f in fields(FrameworkSettings)}


def published_mfu(backend: str) -> float:
    """The backend's default MFU (the module docstring)."""
    if backend == "fsdp2":
        llama = load_model("llama-3.1-8b")
        achieved = TORCHTITAN_TOKENS_PER_S_PER_GPU * flops_per_token(llama, TORCHTITAN_SEQ_LEN)
        return round(achieved / H100_BF16_FLOPS_PER_S, 4)
    if backend == "megatron":
        return MEGATRON_MFU
    raise RlsimError(f"unknown trainer backend {backend!r}; choose one of {', '.join(BACKENDS)}")


@dataclass(frozen=True, slots=True)
class Trainer:
    """A trainer backend, its MFU (None: the backend's published figure) and its layout."""

    backend: str = "fsdp2"
    mfu: float | None = None
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    framework: FrameworkSettings = FrameworkSettings()  # what it does around the FLOPs (rlsim.framework_costs)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise RlsimError(f"unknown trainer backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.mfu is not None and not 0 < self.mfu <= 1:
            raise RlsimError(f"--trainer: mfu must be in (0, 1], got {self.mfu}")
        for name in ("tp", "pp", "ep", "cp"):
            if getattr(self, name) < 1:
                raise RlsimError(f"--trainer: {name} must be at least 1, got {getattr(self, name)}")
        if self.framework.vpp > 1 and self.pp == 1:
            vpp = self.framework.vpp
            raise RlsimError(f"--trainer: vpp (virtual pipeline stages per rank) needs pp > 1, got vpp {vpp}")
        if self.backend == "fsdp2" and max(self.tp, self.pp, self.ep) > 1:
            raise RlsimError(
                "--trainer: veRL's FSDP backend shards data-parallel only (Ulysses sequence parallelism is cp): "
                "tp, pp and ep need megatron, e.g. megatron(tp=2)"
            )

    @classmethod
    def parse(cls, text: str) -> Trainer:
        """`fsdp2`, `megatron(tp=2,pp=4)`, `megatron(ep=8,mfu=0.4)`: a backend and its settings."""
        m = re.fullmatch(r"\s*([a-z0-9_]+)\s*(?:\((.*)\))?\s*", text or "")
        if m is None:
            raise RlsimError(f"--trainer {text!r}: write a backend and its settings, e.g. megatron(tp=2,pp=4)")
        known = ({f.name for f in fields(cls)} - {"backend", "framework"}) | FRAMEWORK_NAMES
        kwargs: dict[str, Any] = {}
        for item in filter(None, (x.strip() for x in (m.group(2) or "").split(","))):
            key, _, value = item.partition("=")
            key = key.strip()
            if key not in known:
                raise RlsimError(f"--trainer: unknown setting {key!r}; known: {', '.join(sorted(known))}")
            kwargs[key] = value.strip()
        framework = {k: kwargs.pop(k) for k in list(kwargs) if k in FRAMEWORK_NAMES}
        layout: dict[str, Any] = {}
        for key, value in kwargs.items():
            try:
                layout[key] = float(value) if key == "mfu" else int(value)
            except ValueError:
                raise RlsimError(f"--trainer: {key} must be a number, got {value!r}") from None
        try:
            settings = FrameworkSettings.from_values(framework, text=True)
        except RlsimError as exc:
            raise RlsimError(f"--trainer: {exc}") from None
        return cls(m.group(1), **layout, framework=settings)

    def text(self) -> str:
        """The `--trainer` text that parses back to this trainer (`parse`)."""
        items = [f"{k}={getattr(self, k)}" for k in ("tp", "pp", "ep", "cp") if getattr(self, k) != 1]
        items += [f"mfu={self.mfu}"] if self.mfu is not None else []
        items += [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in self.framework.stated().items()]
        return self.backend + (f"({','.join(items)})" if items else "")

    def check(self, model: Model) -> None:
        if self.ep > 1 and not model.is_moe:
            raise RlsimError(f"--trainer: ep={self.ep}, but {model.name} is a dense model and has no experts to split")
        if self.ep > 1 and model.num_experts % self.ep:
            raise RlsimError(f"--trainer: ep={self.ep} does not divide {model.name}'s {model.num_experts} experts")
        if model.num_heads % self.tp:
            raise RlsimError(f"--trainer: tp={self.tp} does not divide {model.name}'s {model.num_heads} heads")
        if self.pp > model.num_layers:
            raise RlsimError(f"--trainer: pp={self.pp} exceeds {model.name}'s {model.num_layers} layers")

    def default_mfu(self, model: Model) -> tuple[float, str]:
        """The MFU when none is given, and where it comes from: the backend's published figure, for
        Megatron times an MoE model's published efficiency against a dense one."""
        mfu = published_mfu(self.backend)
        if self.backend == "fsdp2":
            return mfu, "TorchTitan's FSDP Llama 3.1 8B on H100, 5,762 tokens/s per GPU at 8K, under rlsim's FLOP count"
        source = "Megatron-LM's published 'up to 47% MFU on H100'"
        eff, where = moe_training_efficiency(model.facts("bf16", "bf16"))
        if eff == 1.0:
            return mfu, source
        return mfu * eff, f"{source} x {eff:.3f}, the MoE model's published efficiency against a dense one ({where})"

    def block(self, model: Model, gpu: GpuSpec) -> dict[str, Any]:
        """The profile's `train` object."""
        self.check(model)
        return {
            "flops_per_token": 6 * model.num_active_params, "peak_flops_per_gpu": gpu.bf16_flops_per_s,
            "mfu": self.mfu or self.default_mfu(model)[0], "fixed_s": TRAIN_FIXED_S,
            "backend": self.backend, "tp": self.tp, "pp": self.pp, "ep": self.ep, "cp": self.cp,
            **self.framework.stated(),
        }  # fmt: skip

    def provenance(self, model: Model) -> str:
        mfu, source = (self.mfu, "given") if self.mfu else self.default_mfu(model)
        framework = ", ".join(f"{k}={v}" for k, v in self.framework.stated().items())
        return (
            f"{self.backend}: forward 2N T + 2 L d T^2 FLOPs, update 3 forwards, at {mfu:.1%} MFU of the GPU's dense "
            f"bf16 peak ({source}); layout TP {self.tp} PP {self.pp} EP {self.ep} CP {self.cp} "
            f"(rlsim.step_costs.layout_cost); the AdamW step at HBM bandwidth (rlsim.framework_costs)"
            + (f"; framework: {framework} (rlsim.framework_costs)" if framework else "")
        )
