"""The `rlsim` command line. Heavy imports live inside commands so `--help` stays instant.

Any `RlsimError` raised by a command becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import signal
import sys
import warnings

import typer
from typer.core import TyperGroup

from rlsim.errors import RlsimError


class _Group(TyperGroup):
    """Top-level group: turns user errors into one line and exit code 2, never a traceback."""

    def invoke(self, ctx):  # noqa: ANN001 - click's signature
        try:
            return super().invoke(ctx)
        except RlsimError as exc:
            msg = " ".join(str(exc).split())
            typer.echo(f"error: {msg}", err=True)
            raise typer.Exit(2) from None
        except BrokenPipeError:
            raise  # the reader went away (`| head`): nothing to tell it
        except OSError as exc:  # a file the command reads or writes: no folder, no permission, disk full
            where = f" {exc.filename}" if exc.filename else ""
            typer.echo(f"error: cannot use{where}: {exc.strerror or exc}", err=True)
            raise typer.Exit(2) from None
        except Exception as exc:
            # An unknown option or command, a value of the wrong type or choice: click's UsageError
            # (Typer vendors its own click, so the class is matched by name), but not the help a
            # bare group prints.
            kinds = {c.__name__ for c in type(exc).__mro__}
            if "UsageError" not in kinds or "NoArgsIsHelpError" in kinds:
                raise
            msg = " ".join(exc.format_message().split())
            where = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "rlsim"
            typer.echo(f"error: {msg} (see {where} --help)", err=True)
            raise typer.Exit(2) from None


app = typer.Typer(
    cls=_Group,
    help="Simulate and run rollout scheduling policies for LLM RL post-training.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from rlsim import __version__

        typer.echo(f"rlsim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """rlsim: how long will RL post-training take, on how many GPUs, under which policy."""


def _register() -> None:
    from rlsim.cli.calibrate import calibrate_app
    from rlsim.cli.compare import register_compare
    from rlsim.cli.plan import register as register_plan
    from rlsim.cli.profile import profile_app
    from rlsim.cli.real import register as register_real
    from rlsim.cli.sim import register
    from rlsim.cli.trace import trace_app

    app.add_typer(trace_app, name="trace")
    app.add_typer(calibrate_app, name="calibrate")
    app.add_typer(profile_app, name="profile")
    register(app)
    register_compare(app)
    register_real(app)
    register_plan(app)


_register()


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    """A warning as one line on stderr (`warning: ...`), not Python's file:line form."""
    print(f"warning: {message}", file=sys.stderr)


def _terminated(signum: int, frame) -> None:  # noqa: ANN001 - the signal module's signature
    """SIGTERM (a scheduler's stop, `kill`) unwinds like Ctrl-C does, so that what a command was
    writing is cleaned up (a run directory's temporary folder) rather than left half written."""
    raise SystemExit(128 + signum)


def main() -> None:
    """Console-script entry point."""
    signal.signal(signal.SIGTERM, _terminated)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        app()


if __name__ == "__main__":
    main()
