"""The data rlsim ships that code writes, and the one command that writes it.

    python -m rlsim.package_data [profiles] [core] [--check]

Run in a checkout of rlsim (it writes the checkout's files, which a commit then carries); `pip
install` never rebuilds them. With no name it writes every part it has; `--check` writes nothing
and exits 1 naming each part whose committed files are not what it builds now (CI runs it).

- `profiles` (`profiles.py`): the shipped GPU profiles, `rlsim/profiles/*.json`, each what
  `rlsim profile derive` writes for its setup (and the published slime fit).
- `core` (`core.py`): the compiled core's shipped machine code, `rlsim/sim/compiled/shipped/`,
  dated by the core's digest; `--check` compares the digest, and a build runs the workload that
  compiles it (about 2 minutes on 2 cores).

Two more files are package data written from the accuracy tables and the published runs, by the
benchmarks that measure those, whose inputs (NeMo RL's rows and recipes, the tables' scripts) live
in `benchmarks/`: `rlsim/bands.json` (`python benchmarks/error_bands.py --readme`; CI holds it
equal to its build, `tests/test_bands.py`) and `rlsim/derive/terms_nemo-rl.json` (`python
benchmarks/published_runs.py --fit`, about 30 minutes of simulation, not rebuilt by CI).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from rlsim.errors import RlsimError

ROOT = Path(__file__).resolve().parents[2]


def checkout() -> Path:
    """The checkout this package lies in, or one sentence where it is an installed copy."""
    if not (ROOT / "pyproject.toml").is_file() or not (ROOT / ".git").exists():
        raise RlsimError(
            f"rlsim.package_data writes a checkout's files, and {ROOT} is not a checkout of rlsim: run it in one"
        )
    return ROOT


def fresh_clone(dest: Path) -> Path:
    """The checkout's tracked files (as they are in the work tree) in `dest`: no `__pycache__`, no
    compiled cache."""
    root = checkout()
    files = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        if (root / name).is_file():
            shutil.copy2(root / name, dest / name)
    return dest
