"""One switch between compiled and pure-Python code, and mutable state records that work in both.

The compiled core of the simulator is written once, in the subset of Python that numba compiles
(ints, floats, numpy arrays, records of them): `njit` compiles a function with numba (cached on
disk, never fast-math, so it computes the same IEEE doubles in the same order as the Python it
came from) and leaves it as plain Python when numba is missing or `RLSIM_PURE_PYTHON=1` is set.
The pure path runs the very same source, so it gives the same bytes; CI runs both.

The state a compiled function works on is a record: a `Record` subclass whose numba type is a
`StructType` subclass, tied by `define`. Compiled, it is a numba `StructRef` (its fields, arrays
included, reassignable inside compiled code, so tables can grow there); on the pure path, a plain
slotted class with the same fields; build records inside a compiled function, so that their
constructor is cached with it. `int_dict()`, `float_dict()` and `quad_dict()` are the matching mappings
(numba typed dicts, or dicts).

Machine code ships with the package: `shipped/<python>-numba<version>/` holds the cache of the
functions `CompiledEngine` calls, compiled for the generic x86-64 CPU (`NUMBA_CPU_NAME=generic`,
which this module sets unless the user set it) by `python -m rlsim.package_data core`, and dated by
the core's digest, not by file times, so a fresh clone or a wheel loads it instead of compiling
for a minute. Where it does not fit (another CPython, numba, platform or CPU setting, or a changed
core) the core compiles once, into the cache beside its source, as any numba cache does.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rlsim.sim.compile_switch import pure_python, use_generic_cpu

# Generic x86-64 machine code, so that the shipped cache (and a cache copied between machines)
# loads on any x86-64 CPU
use_generic_cpu()

try:
    import numba
    from numba import types
    from numba.experimental import structref
    from numba.typed import Dict
except ImportError:  # pragma: no cover - numba is a dependency; the pure path still runs without it
    numba = None

PURE = numba is None or pure_python()
_CORE = Path(__file__).resolve().parent


def _core_digest() -> str:
    """A digest of every module of the compiled core's code. numba dates a cached function by its own
    source file only, so a function calling into a changed module would load its stale machine
    code (with the old records' layout); every cached function is dated by the whole core."""
    h = hashlib.sha256()
    for path in sorted(_CORE.glob("*.py")):
        if path.name == "sim_engine.py":  # (the Python class over the core: nothing of it is compiled)
            continue
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


SHIPPED = _CORE / "shipped"


def shipped_dir() -> Path:
    """Where the shipped machine code for this CPython and numba lives (it may not exist)."""
    tag = f"py{sys.version_info.major}{sys.version_info.minor}-numba{numba.__version__ if numba else 'none'}"
    return SHIPPED / tag


if not PURE:
    from numba.core import caching

    _DIGEST = _core_digest()

    class _Dated:
        """A locator mixin: the source stamp is the core's digest (its code, not its files' times,
        so the cache of one checkout is as fresh in another: a clone, a wheel)."""

        def get_source_stamp(self):  # noqa: ANN202 - numba's hook
            return _DIGEST

    class _InTree(_Dated, caching.InTreeCacheLocator):
        pass

    class _UserWide(_Dated, caching.UserWideCacheLocator):
        pass

    class _CoreCacheImpl(caching.CompileResultCacheImpl):
        _locator_classes = [_InTree, _UserWide]

    class _Index(caching.IndexDataCacheFile):
        """numba's cache index, read as empty where it names a type this process cannot import: another
        process compiled the core for rules of a module not on this one's path (a test's engine, added
        with `rlsim.sim.compiled.rules.add_rules`). The functions then load from the shipped code or
        compile here, and the index is written again without those entries."""

        def _load_index(self) -> dict:
            try:
                return super()._load_index()
            except (ImportError, AttributeError):
                return {}

    class _CoreCache(caching.FunctionCache):
        """numba's function cache, with the shipped machine code read (never written) after it."""

        _impl_class = _CoreCacheImpl

        def __init__(self, py_func: Callable) -> None:
            super().__init__(py_func)
            self._cache_file = _Index(self._cache_path, self._impl.filename_base, _DIGEST)
            self.shipped = _Index(str(shipped_dir()), self._impl.filename_base, _DIGEST)

        def _load_overload(self, sig, target_context):  # noqa: ANN001, ANN202 - numba's hook
            data = super()._load_overload(sig, target_context)
            if data is None and self._enabled:
                found = self.shipped.load(self._index_key(sig, target_context.codegen()))
                if found is not None:
                    data = self._impl.rebuild(target_context, found)
            return data


def njit(fn: Callable) -> Callable:
    """Compile `fn` (cached, no fast-math), or leave it as Python on the pure path. Called from
    compiled code, it is compiled for its arguments' plain types: numba would otherwise compile
    another copy for every call site that passes a constant (`Literal[int](1)`, `Literal[bool](True)`),
    a third more compiling for the same machine code's results."""
    if PURE:
        return fn
    dispatcher = numba.njit(fastmath=False, nogil=True)(fn)
    dispatcher._cache = _CoreCache(fn)  # (what `cache=True` does, with the core's own freshness)
    plain = dispatcher.get_call_template

    def get_call_template(args: tuple, kws: dict):  # noqa: ANN202 - numba's hook
        return plain(tuple(map(types.unliteral, args)), {k: types.unliteral(v) for k, v in kws.items()})

    dispatcher.get_call_template = get_call_template
    return dispatcher


def cached(*dispatchers: Callable) -> bool:
    """Whether the on-disk cache or the shipped machine code holds this core's source, compiled for
    this CPU setting, for every one of these compiled functions (else their first call compiles:
    about a minute for the engine's entry points)."""
    if PURE:
        return True
    from numba.core.registry import cpu_target

    magic = cpu_target.target_context.codegen().magic_tuple()

    def fits(index: dict) -> bool:
        return any(key[1] == magic for key in index)

    return all(fits(d._cache._cache_file._load_index()) or fits(d._cache.shipped._load_index()) for d in dispatchers)


if PURE:

    def int_dict() -> dict:
        """An empty int -> int mapping the compiled code can take (callable in compiled code)."""
        return {}

    def float_dict() -> dict:
        """An empty int -> float mapping the compiled code can take (callable in compiled code)."""
        return {}

    def quad_dict() -> dict:
        """An empty (int, int, int, int) -> int mapping the compiled code can take (callable in compiled code)."""
        return {}

else:

    @numba.njit(cache=True)
    def int_dict() -> dict:
        """An empty int -> int mapping the compiled code can take (callable in compiled code)."""
        return Dict.empty(key_type=types.int64, value_type=types.int64)

    @numba.njit(cache=True)
    def float_dict() -> dict:
        """An empty int -> float mapping the compiled code can take (callable in compiled code)."""
        return Dict.empty(key_type=types.int64, value_type=types.float64)

    _QUAD = types.UniTuple(types.int64, 4)

    @numba.njit(cache=True)
    def quad_dict() -> dict:
        """An empty (int, int, int, int) -> int mapping the compiled code can take (callable in compiled code)."""
        return Dict.empty(key_type=_QUAD, value_type=types.int64)


if PURE:
    StructType = object

    class Record:
        """The pure path's record: a plain class whose slots are filled positionally."""

        __slots__ = ()

        def __init__(self, *values: object) -> None:
            for name, value in zip(self.__slots__, values, strict=True):
                setattr(self, name, value)

    def define(record_cls: type, type_cls: type, fields: tuple[str, ...]) -> None:
        """Nothing to register on the pure path (the record class lists its slots)."""

else:

    class StructType(types.StructRef):
        """Base of a record's numba type (subclass it at module level, so caches can name it)."""

        def preprocess_fields(self, fs):  # noqa: ANN001, ANN202 - numba's hook
            return tuple((n, types.unliteral(t)) for n, t in fs)

    Record = structref.StructRefProxy

    def define(record_cls: type, type_cls: type, fields: tuple[str, ...]) -> None:
        """Register `type_cls`, make `record_cls(*values)` build one with these fields, and give
        Python read access to each field (compiled code reads them directly)."""
        structref.register(type_cls)
        structref.define_proxy(record_cls, type_cls, list(fields))
        for name in fields:
            getter = numba.njit(eval(f"lambda r: r.{name}"))  # noqa: S307 - a field name of ours
            setattr(record_cls, name, property(getter))


@njit
def grow(a: np.ndarray) -> np.ndarray:
    """`a` with twice the rows, its rows copied and the new ones zero (the compiled core's tables
    double when full, inside compiled code)."""
    out = np.zeros((2 * a.shape[0],) + a.shape[1:], a.dtype)
    out[: a.shape[0]] = a
    return out


@njit
def grow_cols(t: np.ndarray) -> np.ndarray:
    """A slot table `t` with twice the columns (slots), its columns copied and the new ones zero."""
    out = np.zeros((t.shape[0], 2 * t.shape[1]), t.dtype)
    out[:, : t.shape[1]] = t
    return out
