"""Where bundled data lives, in a source checkout and after a plain `pip install .`.

The repository keeps traces under `traces/`; the wheel installs the same files as the data
package `rlsim._bundled` (see pyproject.toml), so both layouts resolve here.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from rlsim.errors import RlsimError

DEFAULT_TRACE = "math17k.parquet"
MATH17K_PROMPTS = "sources/dapo_math_17k_prompts.parquet"


def cache_dir() -> Path:
    """rlsim's cache: $RLSIM_CACHE_DIR, else ~/.cache/rlsim (derived profiles under `profiles/`)."""
    return Path(os.environ.get("RLSIM_CACHE_DIR") or Path.home() / ".cache" / "rlsim")


def bundled(name: str) -> Path:
    """Path of a bundled trace file such as `math17k.parquet`."""
    checkout = Path(__file__).resolve().parent.parent / "traces" / name
    if checkout.exists():
        return checkout
    return Path(str(resources.files("rlsim._bundled").joinpath(name)))


def default_trace() -> Path:
    """The default workload: DAPO-Math-17k prompts with lengths fitted to real verl logs."""
    return bundled(DEFAULT_TRACE)


def stored_path(path: Path, directory: Path) -> str:
    """`path` as a run directory records it: relative to that directory (POSIX separators), so that
    the directory still names its files once it is moved, copied to another machine or committed."""
    return Path(os.path.relpath(Path(path).resolve(), Path(directory).resolve())).as_posix()


def opened_path(stored: str, directory: Path) -> Path:
    """A path a run directory recorded, to open: a relative one is relative to that directory (an
    absolute one, as older runs recorded, is taken as it is)."""
    p = Path(stored)
    return p if p.is_absolute() else Path(directory) / p


def check_output_file(path: Path, what: str) -> None:
    """Refuse, before any work, an output file that cannot be written: its parent missing, a file
    or not writable, or the path itself a directory. One sentence naming the option."""
    path = Path(path)
    if path.is_dir():
        raise RlsimError(f"{what} {path} is a directory; give a file path")
    if not path.parent.exists():
        _check_creatable(path, what)  # says which ancestor is a file, if one is
        raise RlsimError(f"{what} {path}: directory {path.parent} does not exist")
    if not path.parent.is_dir():
        raise RlsimError(f"{what} {path}: {path.parent} is a file, not a directory")
    if not os.access(path.parent, os.W_OK):
        raise RlsimError(f"{what} {path}: directory {path.parent} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise RlsimError(f"{what} {path} is not writable")


def check_plot_file(path: Path, what: str = "--plot") -> None:
    """`check_output_file`, and a suffix naming a format matplotlib writes (png, pdf, svg, ...): the
    format is known before any work, so a plot is never refused after minutes of it."""
    check_output_file(path, what)
    fmt = Path(path).suffix.lstrip(".").lower()
    if not fmt:
        raise RlsimError(f"{what} {path} has no suffix: name the format, e.g. {Path(path).name}.png")
    from matplotlib.backend_bases import FigureCanvasBase

    known = FigureCanvasBase.get_supported_filetypes()
    if fmt not in known:
        raise RlsimError(f"{what} {path}: matplotlib cannot write '{fmt}'; use one of {', '.join(sorted(known))}")


def check_output_dir(path: Path, what: str) -> None:
    """Refuse an output directory that cannot be created or written (a file in its place, or a
    nearest existing ancestor that is a file or not writable)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RlsimError(f"{what} {path} is a file; give a directory path")
    if path.is_dir():
        if not os.access(path, os.W_OK):
            raise RlsimError(f"{what} {path} is not writable")
        return
    _check_creatable(path, what)


def _check_creatable(path: Path, what: str) -> None:
    """`path`'s nearest existing ancestor must be a writable directory for `mkdir -p` to work."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise RlsimError(f"{what} {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK):
        raise RlsimError(f"{what} {path}: {parent} is not writable")
