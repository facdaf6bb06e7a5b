"""`@engine_options()`: a command's vLLM engine options, declared once, from `EngineConfig`.

As vLLM's `EngineArgs.add_cli_args` builds its flags from its dataclass fields, the decorator
reads `rlsim.config.EngineConfig`'s fields (their defaults, their help, their on/off flag) and adds
one Typer option per field to the command, then hands the command one `engine: EngineConfig`
built from them. `rlsim simulate`, `compare`, `plan` and `run --real` thus take the same options
with the same help; a command leaves out the fields it does not take (`exclude`).
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import MISSING, fields

import typer

from rlsim.config import EngineConfig

ENGINE_FIELDS = tuple(f.name for f in fields(EngineConfig))


def engine_options(exclude: tuple[str, ...] = ()) -> Callable:
    """Replace the command's `engine` parameter by one option per `EngineConfig` field."""
    unknown = set(exclude) - set(ENGINE_FIELDS)
    if unknown:
        raise ValueError(f"not EngineConfig fields: {sorted(unknown)}")
    hints = typing.get_type_hints(EngineConfig)
    taken = [f for f in fields(EngineConfig) if f.name not in exclude]

    def wrap(command: Callable) -> Callable:
        sig = inspect.signature(command)
        if "engine" not in sig.parameters:
            raise TypeError(f"{command.__name__} must take an `engine: EngineConfig` parameter")

        @functools.wraps(command)
        def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - the command's own
            knobs = {f.name: kwargs.pop(f.name) for f in taken}
            return command(*args, engine=EngineConfig(**knobs), **kwargs)

        params = [p for p in sig.parameters.values() if p.name != "engine"]
        annotations = {k: v for k, v in command.__annotations__.items() if k != "engine"}
        for f in taken:
            flag = f.metadata.get("flag")
            decls = (f"--{flag}/--no-{flag}",) if flag else ()
            default = f.default if f.default is not MISSING else None
            option = typer.Option(default, *decls, help=f.metadata["help"])
            kind = inspect.Parameter.KEYWORD_ONLY
            params.append(inspect.Parameter(f.name, kind, default=option, annotation=hints[f.name]))
            annotations[f.name] = hints[f.name]
        run.__signature__ = sig.replace(parameters=params)
        run.__annotations__ = annotations
        return run

    return wrap
