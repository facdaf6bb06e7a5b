"""Words for what the output counts: `counted(1, "step")` is "1 step", `counted(1024, "GPU")` is
"1,024 GPUs"."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` of `noun`, the noun singular for one (`plural`: where adding an s is wrong)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
