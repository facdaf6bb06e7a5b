"""An output claimed before any work starts, so that two commands never write one output.

A command that writes a run directory or a file (`simulate -o`, `run --real -o`, `sweep --out`,
`compare --plot`, `plan --emit`) claims it first: an exclusive, non-blocking `flock` on a claim
file beside it, `.NAME.claim`, which holds the claimer's pid. A second command finds the lock held
and is refused in one sentence naming that pid. The lock belongs to the process: one killed
outright (SIGKILL) releases it with its file descriptors, and the next command takes its claim
file over; a command that ends, or is stopped by SIGTERM or Ctrl-C, removes it.

The claim file sits beside the output rather than inside it: a simulated run directory is written
whole into a temporary sibling and swapped in (`rlsim.report.write_run_dir`), which would carry a
claim inside the old folder away; and a file output has no inside.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlsim.errors import RlsimError


def claim_path(path: Path) -> Path:
    """The claim file of an output."""
    path = Path(path)
    return path.parent / f".{path.name}.claim"


@contextmanager
def claimed(path: Path, what: str) -> Iterator[Path]:
    """Hold the claim on output `path` (given with option `what`) while the block runs; refuse, in one
    sentence naming the holder's pid, an output another command holds. Creates `path`'s parent."""
    lock = claim_path(path)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RlsimError(f"{what} {path}: cannot create {lock.parent} ({exc.strerror})") from None
    fd = _lock(lock, path, what)
    try:
        yield Path(path)
    finally:
        try:
            if _same_file(lock, fd):
                lock.unlink()
        finally:
            os.close(fd)  # (the lock goes with the descriptor)


def _lock(lock: Path, path: Path, what: str) -> int:
    """The descriptor of `lock`, flock-ed by this process, holding its pid."""
    for _ in range(100):  # (a claim file replaced between its open and its lock: open the new one)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RlsimError(f"{what} {path}: cannot claim it ({lock}: {exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RlsimError(
                f"{what} {path} is claimed by another rlsim command (pid {holder}); wait for it to end or choose "
                f"another {what}"
            ) from None
        if not _same_file(lock, fd):  # its holder removed it as we opened it: claim the file now there
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd
    raise RlsimError(f"{what} {path}: its claim file {lock} keeps changing; is another command looping on it?")


def _same_file(lock: Path, fd: int) -> bool:
    try:
        return os.stat(lock).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
