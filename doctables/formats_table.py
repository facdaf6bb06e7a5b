"""The reference tables of docs/formats.md, from the very field lists the loaders check a file
against (`rlsim.derive.models.CONFIG_FIELDS`, `rlsim.derive.gpus.GPU_FIELDS`), so the page cannot
drift from what is accepted.

    python -m doctables.formats_table [--markdown | --readme]
"""

from __future__ import annotations

import sys

from rlsim.derive.gpus import GPU_FIELDS
from rlsim.derive.models import CONFIG_FIELDS, LARGEST
from rlsim.package_data.markers import emit


def model_table() -> str:
    lines = ["| field | value | needed | what it is |", "|---|---|---|---|"]
    for f in CONFIG_FIELDS:
        kind = f.kind + (f" (at most 2^{LARGEST.bit_length() - 1})" if "integer" in f.kind else "")
        lines.append(f"| `{f.name}` | {kind} | {f.needed or 'no'} | {f.meaning} |")
    return "\n".join(lines)


def gpu_table() -> str:
    lines = ["| field | value | needed | what it is |", "|---|---|---|---|"]
    for f in GPU_FIELDS:
        lines.append(f"| `{f.name}` | {f.kind} | {'always' if f.required else 'no'} | {f.meaning} |")
    return "\n".join(lines)


def main() -> None:
    for name, body in (("model_config_fields", model_table()), ("gpu_fields", gpu_table())):
        emit(name, body, sys.argv)
        if "--markdown" not in sys.argv and "--readme" not in sys.argv:
            print(body + "\n")


if __name__ == "__main__":
    main()
