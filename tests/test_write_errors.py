"""Write errors: an OSError at write time is one sentence and exit code 2 in every command that
writes, and a single file is written whole or not at all (temporary file, then rename)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.errors import RlsimError
from rlsim.files import atomic_save, atomic_write_text

runner = CliRunner()
SMALL = ["--gpus", "4", "--profile", "h100-qwen2.5-7b-tp1", "--prompts-per-step", "8", "--samples-per-prompt", "4",
         "--epochs", "1"]  # fmt: skip
UNWRITABLE = Path("/proc/rlsim-cannot-write")  # procfs refuses new files, even to root


def _one_line_exit_2(args: list[str], path: Path) -> None:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (args, r.exit_code, r.output)
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path.parent) in lines[0], r.stderr


@pytest.mark.parametrize(
    "command",
    [
        lambda trace, p: ["trace", "inspect", str(trace), "--plot", str(p.with_suffix(".png"))],
        lambda trace, p: ["trace", "synth", "--num-prompts", "8", "--samples-per-prompt", "4", "--epochs", "1",
                          "--out", str(p.with_suffix(".parquet"))],  # fmt: skip
        lambda trace, p: ["simulate", "--trace", str(trace), *SMALL, "--out", str(p)],
        lambda trace, p: ["compare", "--trace", str(trace), *SMALL, "--policies", "sync",
                          "--plot", str(p.with_suffix(".png"))],  # fmt: skip
    ],
    ids=["trace-inspect-plot", "trace-synth", "simulate", "compare-plot"],
)
def test_a_failed_write_is_one_line_and_exit_2(command, small_trace_path: Path) -> None:  # noqa: ANN001
    _one_line_exit_2(command(small_trace_path, UNWRITABLE), UNWRITABLE)


def test_an_interrupted_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    """A writer that fails half-way leaves the target as it was and no temporary file beside it."""
    target = atomic_write_text(tmp_path / "profile.json", "old\n")

    def half(tmp: Path) -> None:
        tmp.write_text("half of the new")
        raise OSError(28, "No space left on device")

    with pytest.raises(RlsimError, match=r"cannot write .*profile.json: No space left on device"):
        atomic_save(target, half)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.json"]


def test_a_write_keeps_the_suffix_the_writer_picks_its_format_by(tmp_path: Path) -> None:
    """The temporary name ends in the target's suffix, so matplotlib and pandas pick the format."""
    seen = []
    atomic_save(tmp_path / "cdf.png", lambda tmp: (seen.append(tmp.suffix), tmp.write_bytes(b"x")))
    assert seen == [".png"] and (tmp_path / "cdf.png").read_bytes() == b"x"
