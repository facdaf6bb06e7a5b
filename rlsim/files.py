"""Writing a file so that a failure never leaves half of it, and says in one sentence why.

Every single file rlsim writes (plots, JSON, Parquet, profiles) goes to a hidden temporary name in
the target's folder, with the target's suffix so that writers that pick a format by suffix
(matplotlib, pandas) still do, and is renamed over the target only once it is whole. An `OSError`
on the way (no such folder, no permission, a full disk, `/proc`) becomes an `RlsimError` naming the
path, which the CLI prints as one line with exit code 2; the temporary file is removed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from rlsim.errors import RlsimError


def write_error(path: Path | str, exc: OSError) -> RlsimError:
    """The one sentence for a failed write of `path`."""
    why = exc.strerror or str(exc) or type(exc).__name__
    return RlsimError(f"cannot write {path}: {why}")


def atomic_save(path: Path | str, write: Callable[[Path], object]) -> Path:
    """Call `write(tmp)` on a temporary path beside `path`, then rename it over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        tmp.replace(path)
    except BaseException as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # no folder to clean: nothing was written
        if isinstance(exc, OSError):
            raise write_error(path, exc) from None
        raise
    return path


def atomic_write_bytes(path: Path | str, data: bytes) -> Path:
    return atomic_save(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: Path | str, text: str) -> Path:
    return atomic_save(path, lambda tmp: tmp.write_text(text))


def save_figure(fig, path: Path | str, **kwargs) -> Path:  # noqa: ANN001, ANN003 - a matplotlib Figure
    """`fig.savefig` through a temporary file (the format from `path`'s suffix)."""
    return atomic_save(path, lambda tmp: fig.savefig(tmp, format=Path(path).suffix.lstrip(".") or None, **kwargs))


def read_json_object(path: Path | str, what: str = "JSON") -> dict:
    """The JSON object in a file; a file that is not JSON, or holds no object, is one sentence."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RlsimError(f"{path} is not valid {what} ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise RlsimError(f"{path} must hold a JSON object")
    return raw
