"""Terminal output helpers shared by the commands."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from rich.console import Console


def shown_profile(profile: str) -> str:
    """A profile as the output names it: one derived into rlsim's cache by its name (its folder there is
    a digest that says nothing to a reader), any other as it was given."""
    from rlsim.paths import cache_dir

    try:
        Path(profile).resolve().relative_to(cache_dir().resolve())
    except (ValueError, OSError):
        return profile
    return Path(profile).stem


def console(file: TextIO | None = None) -> Console:
    """A rich console (on `file`, default standard output); when output is piped, wide enough
    that tables are not truncated."""
    c = Console(file=file)
    return c if c.is_terminal else Console(file=file, width=140)


@contextmanager
def engine_log(path: Path) -> Iterator[TextIO | None]:
    """Send everything written to file descriptors 1 and 2 while the block runs (vLLM's logging,
    Python warnings, C++ and child-process messages) to `path`, appended; yield a stream on the
    terminal for the command's own output. Where standard output is not a file descriptor (a
    test's captured output) nothing is redirected and None is yielded."""
    try:
        out_fd, err_fd = sys.stdout.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield None
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(out_fd), os.dup(err_fd)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    term = os.fdopen(os.dup(saved_out), "w", buffering=1)
    try:
        os.dup2(log_fd, out_fd)
        os.dup2(log_fd, err_fd)
        yield term
    finally:
        for stream in (sys.stdout, sys.stderr, term):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.dup2(saved_out, out_fd)
        os.dup2(saved_err, err_fd)
        for fd in (saved_out, saved_err, log_fd):
            os.close(fd)
        term.close()
