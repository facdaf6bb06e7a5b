"""The rollout engines rlsim schedules as, and what each can do: one registry, asked by capability.

Simulation, real mode, the planner and the commands ask an engine's entry what it does (does it
speculate, do the compiled core's rules cover it, does it abort a prompt its KV pool cannot hold)
and never compare its name; `tests/test_engine_seam.py` finds any comparison with an engine's name
outside this module and the framework config readers (`rlsim.frameworks`, which read the names
frameworks write). Where an engine's code lives is written as `module:attribute`, imported when
asked for (`resolve`), so that this module sits in the base layer and a simulating user never imports
an engine's real-mode package.

- vLLM 0.32 (the default): its v1 `Scheduler`, or `AsyncScheduler` where the engine schedules
  asynchronously (`rlsim.sim.scheduler`); HistoSpec drafts inside it; the compiled core runs it.
- SGLang 0.5.23: its `Scheduler`'s rules on RL's loop (`rlsim.sim.sglang_scheduler`): its overlap
  loop, its radix cache flushed by a weight update, its chunk budget by GPU memory where unset,
  and its own abort of a prompt its KV pool cannot hold; the compiled core runs it too, parallel
  sampling included, apart from lockstep and the replay of a real run that sent each request its
  length (`rlsim.sim.simulate.compiled_covers`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from rlsim.errors import RlsimError


@dataclass(frozen=True, slots=True)
class RolloutEngine:
    """One rollout engine: how it is named and written, its own settings, what its rules do, and
    where its code lives (`module:attribute`)."""

    name: str  # as configs, profiles and --rollout-engine name it
    label: str  # as output names it
    version: str  # the release whose rules rlsim follows
    scheduler: str  # (EngineConfig, KV tokens) -> one instance's RolloutScheduler (`rlsim.sim.rollout_scheduler`)
    # real mode ("": the engine is simulated only; `real` refuses it in one sentence)
    real_instance: str = ""  # one engine instance in this process (`rlsim.real`)
    real_ray_class: str = ""  # () -> the Ray actor class of an instance
    real_require: str = ""  # import the engine's package, or refuse in one sentence
    real_installed: str = ""  # check the package is installed, without importing it where that logs
    own_settings: tuple[str, ...] = ()  # `EngineConfig` fields only this engine has
    lacks_note: str = ""  # said where another engine's setting is refused under this one
    default: bool = False  # what a run schedules with unless told (and what a profile records by omission)
    speculates: bool = False  # speculative decoding (HistoSpec, Seer's grouped drafts) is modelled under its rules
    # the compiled core's builder of its instances' scheduler states (`rlsim.sim.compiled.rules`), where the
    # core (`rlsim.sim.compiled`) runs its rules ("": they run on SimEngine only)
    compiled: str = ""
    # an unset chunked-prefill budget follows the GPU's memory: GPU memory bytes -> tokens ("": the profile's)
    chunk_budget_by_gpu: str = ""
    aborts_too_long: bool = False  # it aborts a prompt its KV pool cannot hold and goes on (else: refused)
    reads_max_tokens: bool = False  # its rules read a request's max tokens (a replay sends each its length)
    flushes_on_weight_update: bool = False  # new weights flush its prefix cache, retracting what runs
    # in lockstep, its real instance hands a batch's outputs only after launching the next, and answers
    # an abort before its next schedule (SGLang's overlap loop); else an iteration's outputs reach the
    # driver before the next starts
    outputs_after_next_launch: bool = False
    real_tensor_parallel: bool = True  # rlsim's real instance launches tensor-parallel ranks

    def real(self, what: str) -> Any:  # noqa: ANN401 - whatever the entry names
        """Real mode's `what` of this engine (`real_instance`, `real_ray_class`, `real_require`,
        `real_installed`), imported now; one sentence where the engine has no real mode."""
        where = getattr(self, what)
        if not where:
            real = " or ".join(e.name for e in REGISTRY.values() if e.real_instance)
            raise RlsimError(
                f"rollout engine {self.name} ({self.label}) is simulated only: rlsim drives no real {self.label} "
                f"engine; run --real with --rollout-engine {real}"
            )
        return resolve(where)


REGISTRY: dict[str, RolloutEngine] = {
    e.name: e
    for e in (
        RolloutEngine(
            "vllm", "vLLM", "0.32", "rlsim.sim.vllm_rules:vllm_rules",
            "rlsim.real.vllm_instance:VllmInstance", "rlsim.real.vllm_instance:ray_instance_class",
            "rlsim.real.vllm_engine:require_vllm", "rlsim.real.vllm_engine:require_vllm",
            own_settings=("block_size", "async_scheduling"), default=True, speculates=True,
            compiled="rlsim.sim.compiled.rules:vllm_states",
        ),
        RolloutEngine(
            "sglang", "SGLang", "0.5.23", "rlsim.sim.sglang_rules:sglang_rules",
            "rlsim.real.sglang_instance:SglangInstance", "rlsim.real.sglang_instance:sglang_ray_instance_class",
            "rlsim.real.sglang_instance:require_sglang", "rlsim.real.sglang_instance:sglang_installed",
            own_settings=("schedule_policy", "parallel_sampling", "schedule_conservativeness", "sglang_env",
                          "page_size"),
            lacks_note=" (its KV page is --page-size, its overlap scheduler always on)",
            chunk_budget_by_gpu="rlsim.config:sglang_chunked_prefill_size", aborts_too_long=True,
            reads_max_tokens=True, flushes_on_weight_update=True,
            outputs_after_next_launch=True, real_tensor_parallel=False,
            compiled="rlsim.sim.compiled.rules:sglang_states",
        ),
    )
}  # fmt: skip
DEFAULT = next(e.name for e in REGISTRY.values() if e.default)
BUILT_IN = frozenset(REGISTRY)


def register(entry: RolloutEngine) -> None:
    """Add a rollout engine: its rules, at `entry.scheduler`, implement `RolloutScheduler`
    (`rlsim.sim.rollout_scheduler`) and run on SimEngine; where `entry.compiled` names a builder of
    its instances' states, whose rules were added to the compiled core's seam
    (`rlsim.sim.compiled.rules.add_rules`), the compiled core runs them too. Every command and layer
    then asks this entry what the engine does; nothing else names it. A name taken, a second
    default, or rules that do not import are refused."""
    if entry.name in REGISTRY:
        raise RlsimError(f"rollout engine {entry.name!r} is registered already")
    if entry.default:
        raise RlsimError(f"rollout engine {entry.name!r} cannot be the default: {DEFAULT} is")
    # (one that does not import: refused now, not at the first run; a compiled builder's module adds its
    # rules to the compiled core's seam as it is imported)
    for what, where in (("rules", entry.scheduler), ("compiled core's states", entry.compiled)):
        try:
            if where:
                resolve(where)
        except (ImportError, AttributeError) as e:
            why = f"rollout engine {entry.name!r}: its {what} ({where}) cannot be imported: {e}"
            raise RlsimError(why) from None
    REGISTRY[entry.name] = entry


def unregister(name: str) -> None:
    """Take a registered engine out again (one `register` added; the built-in ones stay)."""
    if name in BUILT_IN:
        raise RlsimError(f"rollout engine {name!r} is built in")
    REGISTRY.pop(name, None)


def rollout_engine(name: str) -> RolloutEngine:
    """The entry of an engine, or one sentence naming the known ones."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise RlsimError(f"unknown rollout engine {name!r}: use {' or '.join(REGISTRY)}")
    return entry


def resolve(where: str) -> Any:  # noqa: ANN401 - whatever the entry names
    """The attribute `module:attribute` names, imported now."""
    module, _, attr = where.partition(":")
    return getattr(importlib.import_module(module), attr)


def others_settings(name: str) -> dict[str, RolloutEngine]:
    """The settings other engines have and this one does not, each with the engine it belongs to."""
    own = set(rollout_engine(name).own_settings)
    return {s: e for e in REGISTRY.values() if e.name != name for s in e.own_settings if s not in own}
