"""A framework config's text and YAML, read as strictly as its framework reads them: a missing
file, a directory, bytes that are not UTF-8 and a key written twice at one level of a mapping are
each one sentence naming the file (PyYAML keeps the last of two keys without a word; Hydra and
NeMo RL's loader read through it, so a duplicated section silently replaced the first)."""

from __future__ import annotations

from pathlib import Path

import yaml

from rlsim.errors import RlsimError


def read_text(path: Path, spec: str) -> str:
    """The UTF-8 text of the config `spec` (`--from verl:PATH`, as the user wrote it) names."""
    if path.is_dir():
        raise RlsimError(f"{spec}: {path} is a directory, not a config file")
    if not path.is_file():
        raise RlsimError(f"{spec}: no such file {path}")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise RlsimError(
            f"{spec}: {path} is not UTF-8 text (byte {exc.start}, line {line}): save it as UTF-8"
        ) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key written twice in one mapping."""

    def construct_mapping(self, node, deep=False):  # noqa: ANN001, ANN201, FBT002 - PyYAML's signature
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} twice (lines {seen[key]} and {key_node.start_mark.line + 1})",
                    key_node.start_mark,
                )  # fmt: skip
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str, where: str):  # noqa: ANN201 - whatever the YAML holds
    """`text` as YAML (safe), a key written twice in one mapping refused: one sentence naming `where`."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.constructor.ConstructorError as exc:
        if exc.problem and "twice" in exc.problem:
            raise RlsimError(f"{where}: it writes the {exc.problem}: keep one") from None
        raise RlsimError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except yaml.YAMLError as exc:
        raise RlsimError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
