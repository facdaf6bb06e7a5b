"""The command layer only parses: each command builds config objects and calls the library, in at
most 60 lines (`@app.command()` and `@app.callback()` functions under `rlsim/cli/`), and nothing
else in rlsim imports typer (an import-linter contract in pyproject.toml, broken on purpose in
`tests/test_layers.py`)."""

from __future__ import annotations

import ast

from .conftest import REPO

MAX_LINES = 60


def commands(source: str) -> list[tuple[str, int]]:
    """(name, lines) of every function a Typer app registers as a command or callback."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                call = dec.func if isinstance(dec, ast.Call) else dec
                if isinstance(call, ast.Attribute) and call.attr in ("command", "callback"):
                    out.append((node.name, node.end_lineno - node.lineno + 1))
                    break
    return out


def test_no_command_is_longer_than_60_lines() -> None:
    found = {(p.name, name): n for p in sorted((REPO / "rlsim" / "cli").glob("*.py"))
             for name, n in commands(p.read_text())}  # fmt: skip
    assert len(found) >= 20  # (every command of the rlsim command is found)
    long = {k: n for k, n in found.items() if n > MAX_LINES}
    assert not long, f"commands over {MAX_LINES} lines (move the work into the library or a helper): {long}"


def test_the_finder_counts_a_decorated_command() -> None:
    """The check can fail: a 71-line command is found and counted, a plain function is not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(70))
    code = (f"@app.command()\ndef big() -> None:\n{body}\n\n\n@group.callback()\ndef root():\n    pass\n\n\n"
            "def plain():\n    pass\n")  # fmt: skip
    assert sorted(commands(code)) == [("big", 71), ("root", 2)]
