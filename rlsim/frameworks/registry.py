"""The one registry of framework readers and writers: `--from FRAMEWORK:CONFIG` and `--emit
FRAMEWORK:PATH` are parsed here for every command (simulate, compare, plan, validate), so a
framework is added in one place."""

from __future__ import annotations

from pathlib import Path

from rlsim.errors import RlsimError
from rlsim.frameworks.run_setup import RunSetup

FRAMEWORKS = ("verl", "nemo-rl")


def split(spec: str, flag: str, what: str = "CONFIG") -> tuple[str, Path]:
    """(framework, path) of `FLAG FRAMEWORK:PATH`, or one sentence naming the option."""
    framework, sep, path = spec.partition(":")
    if not sep or framework not in FRAMEWORKS or not path:
        raise RlsimError(f"{flag} {spec}: write FRAMEWORK:{what}, with FRAMEWORK one of {', '.join(FRAMEWORKS)}")
    return framework, Path(path)


def read(spec: str) -> RunSetup:
    """The setup of `--from FRAMEWORK:CONFIG`, read by that framework's reader."""
    framework, path = split(spec, "--from")
    if framework == "nemo-rl":
        from rlsim.frameworks.nemo_rl import read_nemo_rl

        return read_nemo_rl(path)
    from rlsim.frameworks.verl import read_verl

    return read_verl(path)
