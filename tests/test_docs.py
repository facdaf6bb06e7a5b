"""The README and the documentation site: the README stays short, the site builds with no broken
link between its pages, the README's links land on a page and heading that exist, nothing cites a
document the repository does not hold, and every `rlsim` command written in them parses (an
unknown command or option fails here; `python -m doctables.doc_commands --run` runs them)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify
from typer.testing import CliRunner

from doctables.doc_commands import commands
from rlsim.cli.app import app

from .conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"


def _anchors(page: Path) -> set[str]:
    """The heading anchors MkDocs gives a page (its default `toc` slugs), outside code blocks."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {slugify(m.group(1).strip(), "-") for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readme_is_at_most_400_lines() -> None:
    assert README.read_text().count("\n") <= 400


def test_the_docs_build_strict_with_every_link_between_pages_checked(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "site" / "policies" / "index.html").exists()


def test_every_docs_page_is_in_the_site_navigation() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    assert sorted(p.name for p in DOCS.glob("*.md")) == sorted(re.findall(r": (\S+\.md)$", nav, re.M))


def test_the_readme_links_land_on_files_and_headings_that_exist() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [ln for ln in links if not re.match(r"https?://", ln)]
    assert len(local) >= 10  # the README links to every page
    for link in local:
        path, _, anchor = link.partition("#")
        target = README.parent / path if path else README
        assert target.exists(), f"README links to {link}, which does not exist"
        if anchor:
            assert anchor in _anchors(target), f"README links to {link}: no such heading"


def test_a_broken_readme_link_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# Step parity with vLLM's scheduler\n```\n# not a heading\n```\n")
    assert _anchors(page) == {"step-parity-with-vllms-scheduler"}


def test_nothing_cites_a_document_outside_the_repository() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    outside = re.compile(r"\b(POLICIES|DESIGN|STYLE)\.md\b|\.\./shared/")
    hits = []
    for name in tracked:
        path = REPO / name
        text_file = path.suffix in (".py", ".md", ".toml", ".yml", ".yaml", ".ipynb", ".txt", ".json", ".cfg")
        if not text_file or path.resolve() == Path(__file__).resolve():
            continue
        for i, line in enumerate(path.read_text(errors="replace").split("\n"), 1):
            if outside.search(line):
                hits.append(f"{name}:{i}: {line.strip()[:100]}")
    assert hits == []


RLSIM_COMMANDS = [c for c in commands() if c.rlsim_argv() is not None]


def test_the_pages_write_many_rlsim_commands() -> None:
    assert len(RLSIM_COMMANDS) >= 50
    assert {c.file for c in RLSIM_COMMANDS} >= {"README.md", "docs/simulate.md", "docs/real.md", "docs/traces.md"}


@pytest.mark.parametrize("cmd", RLSIM_COMMANDS, ids=lambda c: f"{c.file}:{c.line}")
def test_every_written_rlsim_command_parses(cmd) -> None:  # noqa: ANN001
    """`--help` appended: click parses every option before it answers help, so an unknown command,
    an unknown option or an option without its value fails; nothing runs."""
    r = CliRunner().invoke(app, [*cmd.rlsim_argv(), "--help"])
    assert r.exit_code == 0, f"{cmd.file}:{cmd.line}: {cmd.text}\n{r.output[-1500:]}"


def test_a_misspelt_option_fails_to_parse() -> None:
    r = CliRunner().invoke(app, ["compare", "--gpus", "8", "--polices", "sync", "--help"])
    assert r.exit_code == 2
