"""The data rlsim ships that code writes, and the one command that writes it.

    python -m rlsim.package_data [profiles] [core] [bands] [terms] [--check]

Run in a checkout of rlsim (it writes the checkout's files, which a commit then carries); `pip
install` never rebuilds them. With no name it writes profiles, core and bands (the terms' fit
simulates NeMo RL's rows up to 240 times: name it to run it); `--check` writes nothing and exits 1
naming each part whose committed files are not what it builds now (with no name it checks every
part; CI runs it).

- `profiles` (`profiles.py`): the shipped GPU profiles, `rlsim/profiles/*.json`, each what
  `rlsim profile derive` writes for its setup (and the published slime fit).
- `core` (`core.py`): the compiled core's shipped machine code, `rlsim/sim/compiled/shipped/`,
  dated by the core's digest; `--check` compares the digest, and a build runs the workload that
  compiles it (about 2 minutes on 2 cores).
- `bands` (`bands.py`): the error bands, `rlsim/bands.json`, read from the accuracy tables of
  README.md and docs/ (which `tests/test_readme_tables.py` holds equal to the scripts in
  `doctables/`) and the published recipes under `published_runs/`.
- `terms` (`terms.py`): NeMo RL's fitted terms, `rlsim/derive/terms_nemo-rl.json`, fitted on the
  fit half of `published_runs/rows.csv` (`nemo_rl.py`: the rows, a row's simulation, the fit);
  `--check` compares the digest of the fit's inputs.

`markers.py` reads and writes the tables between their markers in README.md and docs/, for the
table scripts (`doctables/`), the benchmarks (`benchmarks/`) and `bands`.
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
