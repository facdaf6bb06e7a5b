"""GPU datasheet facts: the shipped table (`gpus.json`, every number with its source) or a user's file.

`load_gpu(name_or_path)` takes a table name (`h100`, `h100-pcie`, `h200`, `h800`, `h20`,
`a100-40gb`, `a100`, `l40s`, `b200`, `gb200`, `mi300x`) or a JSON file holding one object with
the same fields; an unknown name or a missing field is one sentence.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from rlsim.errors import RlsimError
from rlsim.files import read_json_object


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """What the derivation needs of a GPU (see `gpus.json` for each field's meaning)."""

    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    bf16_flops_per_s: float
    fp8_flops_per_s: float | None
    scale_up_bytes_per_s: float
    scale_up_domain: int
    scale_out_bytes_per_s: float
    host_link_bytes_per_s: float | None = None
    host_memory_bytes_per_s: float | None = None
    source: str = ""

    def peak_flops(self, dtype: str) -> float:
        if dtype == "fp8":
            if not self.fp8_flops_per_s:
                raise RlsimError(f"{self.name} has no FP8 tensor cores: use --dtype bf16")
            return self.fp8_flops_per_s
        return self.bf16_flops_per_s


def shipped_gpus() -> dict[str, dict[str, Any]]:
    raw = json.loads((resources.files("rlsim.derive") / "gpus.json").read_text(encoding="utf-8"))
    return {k: v for k, v in raw.items() if not k.startswith("_")}


@dataclass(frozen=True, slots=True)
class GpuField:
    """One field of a GPU's facts: its kind of value, whether it must be given, what it is (the loader
    checks a file against this list, and docs/formats.md is written from it)."""

    name: str
    kind: str  # "text", "positive number", "positive integer"
    required: bool
    meaning: str


GPU_FIELDS = (
    GpuField("name", "text", True, "the part's name, as profiles name their hardware"),
    GpuField("memory_bytes", "positive number", True, "HBM capacity, bytes (80e9 for an 80 GB part)"),
    GpuField("hbm_bytes_per_s", "positive number", True, "HBM bandwidth, bytes per second"),
    GpuField("bf16_flops_per_s", "positive number", True, "dense BF16 tensor-core peak, FLOP/s (without 2:4 "
             "sparsity)"),
    GpuField("fp8_flops_per_s", "positive number", False, "dense FP8 peak, FLOP/s; null or left out where the "
             "part has no FP8 (--dtype fp8 is then refused)"),
    GpuField("scale_up_bytes_per_s", "positive number", True, "the GPU-to-GPU link a tensor-parallel group "
             "crosses (NVLink, Infinity Fabric, or PCIe where there is none): total bytes per second per GPU"),
    GpuField("scale_up_domain", "positive integer", True, "how many GPUs that link joins (a TP group fits in one)"),
    GpuField("scale_out_bytes_per_s", "positive number", True, "the inter-node network per GPU, bytes per second "
             "(one 400 Gb/s NIC per GPU: 50e9)"),
    GpuField("host_link_bytes_per_s", "positive number", False, "the link to the host CPU, one direction, bytes "
             "per second (PCIe Gen5 x16: 64e9; NVLink-C2C on Grace systems): what offload and sleep cross; left out: "
             "PCIe Gen5's"),
    GpuField("host_memory_bytes_per_s", "positive number", False, "the host's DRAM bandwidth over the GPUs that "
             "share it, bytes per second: what a CPU optimizer step is bound by; left out: DGX H100's 76.8e9"),
    GpuField("source", "text", False, "where the figures come from (the datasheet)"),
)  # fmt: skip
assert [f.name for f in GPU_FIELDS] == [f.name for f in fields(GpuSpec)]


def gpu_from_dict(raw: dict[str, Any], where: str) -> GpuSpec:
    values = {}
    for f in GPU_FIELDS:
        value = raw.get(f.name)
        if value is None:
            if f.required:
                raise RlsimError(f"{where} lacks the GPU field '{f.name}'")
            values[f.name] = "" if f.kind == "text" else None
            continue
        if f.kind == "text":
            ok = isinstance(value, str)
        else:
            ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0
            ok = ok and (f.kind != "positive integer" or value == int(value))
        if not ok:
            raise RlsimError(f"{where}: GPU field '{f.name}' must be a {f.kind}, got {value!r}")
        values[f.name] = int(value) if f.kind == "positive integer" else value
    return GpuSpec(**values)


def load_gpu(name_or_path: str) -> GpuSpec:
    """A GPU of the shipped table by name, or a JSON file of the same fields."""
    table = shipped_gpus()
    if name_or_path.lower() in table:
        return gpu_from_dict(table[name_or_path.lower()], f"GPU {name_or_path}")
    path = Path(name_or_path)
    if not path.is_file():
        raise RlsimError(f"unknown GPU {name_or_path!r}: give a JSON file of its facts or one of {', '.join(table)}")
    return gpu_from_dict(read_json_object(path), str(path))
