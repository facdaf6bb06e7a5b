"""The command line: instant help, version, inspect/compare/synth, and the bundled trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow
import pyarrow.parquet as pq
from typer.testing import CliRunner

from rlsim import __version__
from rlsim.cli.app import app
from rlsim.paths import bundled, default_trace
from rlsim.trace.format import load

from .conftest import REPO

runner = CliRunner()


def test_help_imports_no_heavy_package() -> None:
    """Importing the CLI loads neither pandas, pyarrow, matplotlib, torch nor vllm."""
    code = (
        "import sys, rlsim.cli.app; heavy = {'pandas', 'pyarrow', 'matplotlib', 'torch', 'vllm', "
        "'scipy'} & set(sys.modules); print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_version_and_help() -> None:
    """--version prints the package version; --help lists the trace commands."""
    assert runner.invoke(app, ["--version"]).output.strip() == f"rlsim {__version__}"
    result = runner.invoke(app, ["trace", "--help"])
    assert result.exit_code == 0
    for cmd in ("synth", "inspect", "import", "compare"):
        assert cmd in result.output


def test_inspect_json_and_plot(tmp_path: Path, small_trace_path: Path) -> None:
    """inspect --json prints per-epoch statistics; --plot writes a PNG."""
    result = runner.invoke(app, ["trace", "inspect", str(small_trace_path), "--json"])
    stats = json.loads(result.output)
    assert [e["epoch"] for e in stats["epochs"]] == [0, 1]
    assert stats["epochs"][1]["cross_epoch_spearman"] is not None
    png = tmp_path / "cdf.png"
    result = runner.invoke(app, ["trace", "inspect", str(small_trace_path), "--plot", str(png)])
    assert result.exit_code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_reports_relative_differences(tmp_path: Path, small_trace_path: Path) -> None:
    """compare of a trace with itself shows zero difference everywhere."""
    result = runner.invoke(app, ["trace", "compare", str(small_trace_path), str(small_trace_path), "--json"])
    rows = json.loads(result.output)["rows"]
    assert {r["scope"] for r in rows} == {"all", "epoch 0", "epoch 1"}
    assert all(r["rel_diff"] in (0.0, None) for r in rows)


def test_synth_cli_writes_and_refuses_overwrite(tmp_path: Path) -> None:
    """synth writes a trace; writing over it needs --force."""
    out = tmp_path / "s.parquet"
    args = [
        "trace",
        "synth",
        "-o",
        str(out),
        "--num-prompts",
        "20",
        "--samples-per-prompt",
        "2",
        "--epochs",
        "1",
    ]
    assert runner.invoke(app, args).exit_code == 0
    before = out.read_bytes()
    again = runner.invoke(app, [*args, "--seed", "9"])
    assert again.exit_code == 2 and "--force" in again.stderr
    assert out.read_bytes() == before
    assert runner.invoke(app, [*args, "--seed", "9", "--force"]).exit_code == 0
    assert out.read_bytes() != before


def test_synth_rejects_bad_knobs(tmp_path: Path) -> None:
    """An impossible knob is one line and exit code 2."""
    result = runner.invoke(
        app,
        ["trace", "synth", "-o", str(tmp_path / "x.parquet"), "--num-prompts", "5", "--rho", "2"],
    )
    assert result.exit_code == 2 and result.stderr.strip() == "error: rho must be between 0 and 1, got 2.0"


def test_bundled_trace_is_the_documented_workload() -> None:
    """traces/math17k.parquet: all 17,917 DAPO-Math-17k prompts x 20 samples x 2 epochs
    (20 = 1.25 x R0 for RollPacker's response speculation at R0 = 16)."""
    path = default_trace()
    assert path.stat().st_size < 20 * 2**20
    trace = load(path)
    assert trace.num_prompts == 17917 and trace.epochs == [0, 1]
    assert trace.meta.samples_per_prompt == 20 and trace.meta.max_response_len == 20480
    assert len(trace.visit(0)) == 358_340
    assert trace.table.prompt_id.min() == 0 and trace.table.prompt_id.max() == 17916
    assert 150 < trace.table.num_prompt_tokens.mean() < 175  # verl logs: about 161


def test_bundled_trace_regenerates_byte_for_byte(tmp_path: Path) -> None:
    """The documented command rebuilds math17k.parquet (same bytes under the same pyarrow)."""
    out = tmp_path / "math17k.parquet"
    args = [
        "trace",
        "synth",
        "--prompts",
        str(bundled("sources/dapo_math_17k_prompts.parquet")),
        "--samples-per-prompt",
        "20",
        "--epochs",
        "2",
        "--seed",
        "0",
        "-o",
        str(out),
    ]
    assert runner.invoke(app, args).exit_code == 0
    committed = default_trace()
    written_by = pq.ParquetFile(committed).metadata.created_by
    if written_by.endswith(pyarrow.__version__):
        assert out.read_bytes() == committed.read_bytes()
    a, b = load(out), load(committed)
    assert a.meta == b.meta
    assert (a.table.num_output_tokens.to_numpy() == b.table.num_output_tokens.to_numpy()).all()


def test_readme_names_the_regeneration_command() -> None:
    """The README documents the command the test above runs."""
    readme = (REPO / "traces" / "README.md").read_text()
    assert "rlsim trace synth --prompts traces/sources/dapo_math_17k_prompts.parquet" in readme


def test_engine_log_keeps_engine_output_off_the_terminal(tmp_path: Path) -> None:
    """What engines write to file descriptors 1 and 2 (Python prints, C-level writes, child
    processes) lands in the log; the command's own lines reach the terminal; both fds are restored."""
    log = tmp_path / "vllm.log"
    code = (
        "import os, subprocess, sys\n"
        "from pathlib import Path\n"
        "from rlsim.cli.ui import engine_log\n"
        f"with engine_log(Path({str(log)!r})) as term:\n"
        "    print('engine print'); print('engine warning', file=sys.stderr)\n"
        "    os.write(2, b'c-level write\\n')\n"
        "    subprocess.run([sys.executable, '-c', 'print(\"child process\")'], check=True)\n"
        "    term.write('our progress line\\n')\n"
        "print('after the block')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["our progress line", "after the block"]
    assert proc.stderr == ""
    text = log.read_text()
    for line in ("engine print", "engine warning", "c-level write", "child process"):
        assert line in text, text
