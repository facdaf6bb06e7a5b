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


def gpu_from_dict(raw: dict[str, Any], where: str) -> GpuSpec:
    for f in fields(GpuSpec):
        if f.name not in raw and f.name not in ("source", "fp8_flops_per_s"):
            raise RlsimError(f"{where} lacks the GPU field '{f.name}'")
    values = {f.name: raw.get(f.name) for f in fields(GpuSpec) if f.name in raw}
    for key, value in values.items():
        if key in ("name", "source") or (key == "fp8_flops_per_s" and value is None):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise RlsimError(f"{where}: GPU field '{key}' must be a positive number, got {value!r}")
    values["scale_up_domain"] = int(values["scale_up_domain"])
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
