"""Options declared once, by the config object a command builds from them: `@config_options(Cls, "name")`.

As vLLM's `EngineArgs.add_cli_args` builds its flags from its dataclass fields, the decorator
reads a frozen dataclass's fields (their defaults, their help, their on/off flag or other names:
the field's metadata) and adds one Typer option per field to the command, then hands the command
one object of the class built from them, under the parameter's name. `@engine_options()` does
this for `rlsim.config.EngineConfig` (`engine`), so `rlsim simulate`, `compare`, `plan` and `run
--real` take the same engine options with the same help; `rlsim.cli.run_options` declares the
cluster, RL and profile options the same way. A command leaves out the fields it does not take
(`exclude`).

A field's metadata: `help` (required), `flag` (a switch's name: `--flag/--no-flag`), `decls`
(the option's names, where not `--field-name` alone) and `min` (the least value click accepts).
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

import typer

from rlsim.config import EngineConfig

ENGINE_FIELDS = tuple(f.name for f in fields(EngineConfig))


def _option(f) -> Any:  # noqa: ANN001, ANN401 - a dataclass field; typer's OptionInfo
    meta = f.metadata
    flag = meta.get("flag")
    decls = (f"--{flag}/--no-{flag}",) if flag else tuple(meta.get("decls", ()))
    extra = {"min": meta["min"]} if "min" in meta else {}
    return typer.Option(f.default if f.default is not MISSING else None, *decls, help=meta["help"], **extra)


def field_option(cls: type, name: str) -> Any:  # noqa: ANN401 - typer's OptionInfo
    """One field's option, for a command that takes only some of a class's fields."""
    return _option(next(f for f in fields(cls) if f.name == name))


def config_options(cls: type, param: str, exclude: tuple[str, ...] = ()) -> Callable:
    """Replace the command's `param` parameter by one option per field of `cls`."""
    names = {f.name for f in fields(cls)}
    unknown = set(exclude) - names
    if unknown:
        raise ValueError(f"not {cls.__name__} fields: {sorted(unknown)}")
    hints = typing.get_type_hints(cls)
    taken = [f for f in fields(cls) if f.name not in exclude]

    def wrap(command: Callable) -> Callable:
        sig = inspect.signature(command)
        if param not in sig.parameters:
            raise TypeError(f"{command.__name__} must take a `{param}: {cls.__name__}` parameter")
        clash = {f.name for f in taken} & set(sig.parameters)
        if clash:
            raise TypeError(f"{command.__name__}: {sorted(clash)} are {cls.__name__} fields already")

        @functools.wraps(command)
        def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - the command's own
            knobs = {f.name: kwargs.pop(f.name) for f in taken}
            return command(*args, **{param: cls(**knobs)}, **kwargs)

        params = [p for p in sig.parameters.values() if p.name != param]
        annotations = {k: v for k, v in command.__annotations__.items() if k != param}
        for f in taken:
            option = _option(f)
            kind = inspect.Parameter.KEYWORD_ONLY
            params.append(inspect.Parameter(f.name, kind, default=option, annotation=hints[f.name]))
            annotations[f.name] = hints[f.name]
        run.__signature__ = sig.replace(parameters=params)
        run.__annotations__ = annotations
        return run

    return wrap


def engine_options(exclude: tuple[str, ...] = ()) -> Callable:
    """Replace the command's `engine` parameter by one option per `EngineConfig` field."""
    return config_options(EngineConfig, "engine", exclude)
