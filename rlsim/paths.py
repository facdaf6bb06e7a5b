"""Where bundled data lives, in a source checkout and after a plain `pip install .`.

The repository keeps traces under `traces/`; the wheel installs the same files as the data
package `rlsim._bundled` (see pyproject.toml), so both layouts resolve here.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

DEFAULT_TRACE = "math17k.parquet"
MATH17K_PROMPTS = "sources/dapo_math_17k_prompts.parquet"


def bundled(name: str) -> Path:
    """Path of a bundled trace file such as `math17k.parquet`."""
    checkout = Path(__file__).resolve().parent.parent / "traces" / name
    if checkout.exists():
        return checkout
    return Path(str(resources.files("rlsim._bundled").joinpath(name)))


def default_trace() -> Path:
    """The default workload: DAPO-Math-17k prompts with lengths fitted to real verl logs."""
    return bundled(DEFAULT_TRACE)
