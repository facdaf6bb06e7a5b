"""Terminal output helpers shared by the commands."""

from __future__ import annotations

from rich.console import Console


def console() -> Console:
    """A rich console; when output is piped, wide enough that tables are not truncated."""
    c = Console()
    return c if c.is_terminal else Console(width=140)
