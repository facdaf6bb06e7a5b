"""README and docs tables written by the scripts that produce them, never by hand.

A table in README.md or in a page of docs/ sits between two markers naming it (a table the README
shows is also on its page of docs/, the same between both pairs of markers):

    <!-- table: scheduler_parity -->
    | ... |
    <!-- end table: scheduler_parity -->

A script run with `--markdown` prints each of its tables between the same markers; with
`--readme` it also writes each between its markers, in whichever of those files holds them. The
scripts that compute a table from the code and committed data alone live in `doctables/`
(`python -m doctables.NAME`); `tests/test_readme_tables.py` re-runs those that finish in a minute
or two and holds each table equal to their output, so the prose around a table can quote it but
the table itself cannot drift from the code. The benchmarks that measure (`benchmarks/`: timings,
real engines) write their tables with the machine and its load (`machine_note`). The error bands
(`rlsim.package_data.bands`) are read from these tables.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

from rlsim.hostload import LoadMeter, describe
from rlsim.package_data import ROOT as REPO

README = REPO / "README.md"


def documents() -> list[Path]:
    """The files that hold tables: the README and every page of docs/."""
    return [README, *sorted((REPO / "docs").glob("*.md"))]


def holders(name: str) -> list[Path]:
    """The files whose markers name the table."""
    found = [path for path in documents() if f"<!-- table: {name} -->" in path.read_text()]
    if not found:
        raise KeyError(f"neither README.md nor docs/ has a table named {name!r} (markers <!-- table: {name} -->)")
    return found


def _pattern(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- table: {re.escape(name)} -->\n)(.*?)(<!-- end table: {re.escape(name)} -->)", re.S)


def read_table(name: str, readme: Path | None = None) -> str:
    """The text between the table's markers (without them), in `readme` or wherever they are."""
    readme = readme or holders(name)[0]
    m = _pattern(name).search(readme.read_text())
    if m is None:
        raise KeyError(f"{readme.name} has no table named {name!r} (markers <!-- table: {name} -->)")
    return m.group(2)


def write_table(name: str, body: str, readme: Path | None = None) -> None:
    """Replace the text between the table's markers with `body` (in `readme`, or in every file
    that holds them)."""
    body = body.rstrip("\n") + "\n"
    for path in [readme] if readme else holders(name):
        text = path.read_text()
        read_table(name, path)  # the markers must be there
        path.write_text(_pattern(name).sub(lambda m: m.group(1) + body + m.group(3), text, count=1))


def emit(name: str, body: str, argv: list[str]) -> None:
    """Print the table between its markers (`--markdown`) and write it into its file (`--readme`)."""
    body = body.rstrip("\n")
    if "--markdown" in argv or "--readme" in argv:
        print(f"<!-- table: {name} -->\n{body}\n<!-- end table: {name} -->")
    if "--readme" in argv:
        write_table(name, body)


def tables_in(text: str) -> dict[str, str]:
    """The tables a script printed with `--markdown`, by name (their text between the markers)."""
    found = re.findall(r"<!-- table: (\S+) -->\n(.*?)<!-- end table: \1 -->", text, re.S)
    return {name: body for name, body in found}


def machine_note(meter: LoadMeter, script: str) -> str:
    """The line under a timing table: the command that wrote it, the machine, and its load over
    the measurement (`meter` started before it)."""
    return (
        f"Written by `python benchmarks/{script} --readme` on {platform.machine()} Linux with {os.cpu_count()} CPUs; "
        f"during the measurement {describe(meter.read())}."
    )
