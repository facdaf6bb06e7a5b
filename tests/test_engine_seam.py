"""Engines asked by capability, never by name: no comparison with a rollout engine's name in the
code outside its registry (`rlsim/rollout_engines.py`) and the framework config readers
(`rlsim/frameworks/`, which read the names frameworks write), nor a table keyed by one."""

from __future__ import annotations

import ast
from pathlib import Path

from rlsim.rollout_engines import REGISTRY, RolloutEngine, rollout_engine

from .conftest import REPO

ALLOWED = ("rlsim/rollout_engines.py", "rlsim/frameworks/")


def _names(node: ast.AST) -> list[str]:
    """The engine names a comparison's operand spells out (a literal, or a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and node.value in REGISTRY:
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [n for elt in node.elts for n in _names(elt)]
    return []


def name_comparisons(source: str) -> list[tuple[int, str]]:
    """(line, engine name) of every comparison with an engine's name in `source`, and of every table
    keyed by one (a dict literal: a lookup by name, as a comparison is)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            out += [(node.lineno, n) for key in node.keys if key is not None for n in _names(key)]
        elif isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                out += [(node.lineno, n) for n in _names(operand)]
        elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
            out += [(node.pattern.lineno, n) for n in _names(node.pattern.value)]
    return out


def test_no_code_compares_an_engines_name() -> None:
    found = []
    for path in sorted([*(REPO / "rlsim").rglob("*.py"), *(REPO / "policies").rglob("*.py")]):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(ALLOWED):
            continue
        found += [f"{rel}:{line}: compares with {name!r}" for line, name in name_comparisons(path.read_text())]
    assert not found, "ask the engine's entry (rlsim.rollout_engines) for a capability instead:\n" + "\n".join(found)


def test_the_finder_finds_each_form() -> None:
    """The check can fail: each way of writing a comparison with a name is found."""
    code = '''
if engine == "sglang": pass
if e.rollout_engine != "vllm": pass
if name in ("vllm", "sglang"): pass
if "sglang" == x: pass
match engine:
    case "vllm": pass
ok = registry["vllm"].speculates
LABELS = {"vllm": "vLLM", "other": "x"}
'''
    found = [n for _, n in name_comparisons(code)]
    assert sorted(found) == sorted(["sglang", "vllm", "vllm", "sglang", "sglang", "vllm", "vllm"])


def test_each_engine_answers_every_capability() -> None:
    """Every registered engine names where its rules and real instance live, and they resolve."""
    from rlsim.rollout_engines import resolve

    assert sum(e.default for e in REGISTRY.values()) == 1
    for entry in REGISTRY.values():
        assert isinstance(entry, RolloutEngine) and rollout_engine(entry.name) is entry
        assert callable(resolve(entry.scheduler))
        if entry.chunk_budget_by_gpu:
            assert resolve(entry.chunk_budget_by_gpu)(80 * 2**30) > 0
    assert Path(REPO / ALLOWED[0]).is_file()
