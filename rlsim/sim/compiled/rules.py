"""The seam between the compiled engine and a rollout engine's rules: what `rlsim.sim.compiled.engine`
asks of one instance's scheduler state, whichever rules it holds.

`rlsim.sim.rollout_scheduler.RolloutScheduler` in compiled form, functions only: each name below
serves every rules' state type. Compiled, numba picks the rules' own function by the state's type
as it compiles the caller (an `overload`), so the engine is compiled once for each rules and
branches on none at run time; on the pure path, by the state's class. vLLM's rules are
`rlsim.sim.compiled.scheduler`, SGLang's `rlsim.sim.compiled.sglang`, each added with `add_rules`
(its state's types and its answer to every question of `QUESTIONS`); `vllm_states` and
`sglang_states` build an engine's instances' states, the builder its registry entry names
(`RolloutEngine.compiled`).

What the engine reads directly is common to both states by name: an iteration's batch (`out_*`),
the finishes a pass reports (`due`, `num_due`), and the sums the cost model prices (`ctx`,
`num_decoding`, `rate_sum`, `verify_sum`, `num_spec`) and the counters a run reports
(`prefix_hit_tokens`, `turn_tokens`, `turn_hit_tokens`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlsim.errors import RlsimError
from rlsim.sim.compiled import scheduler as cs
from rlsim.sim.compiled import sglang as sg
from rlsim.sim.compiled.jit import PURE, njit

State = cs.SchedState | sg.SGState  # an instance's scheduler state, of either rules

# ---- the rules' own functions, as one signature each -------------------------------------------------


@njit
def _v_has_work(s: cs.SchedState) -> bool:
    return s.num_running > 0 or s.w_len > 0


@njit
def _g_has_work(s: sg.SGState) -> bool:
    return s.num_running > 0 or s.w_len > 0


@njit
def _v_holds_finished(s: cs.SchedState) -> bool:
    return s.num_finishing > 0


@njit
def _g_holds_finished(s: sg.SGState) -> bool:
    return s.num_fin > 0


@njit
def _v_failed(s: cs.SchedState) -> int:
    """vLLM's rules preempt down to one request, which always fits (a request is refused at submit)."""
    return 0


@njit
def _g_failed(s: sg.SGState) -> int:
    """The KV tokens of a request that cannot decode even alone in the pool (0: none)."""
    return s.error


@njit
def _v_enqueue(s: cs.SchedState, k: int) -> None:
    cs.enqueue(s, k)


@njit
def _v_on_idle(s: cs.SchedState) -> None:
    """vLLM keeps nothing to reset when idle."""


@njit
def _v_own_abort(s: cs.SchedState, k: int) -> bool:
    """vLLM aborts nothing of its own accord (it refuses a request too large at submit)."""
    return False


@njit
def _v_can_abort(s: cs.SchedState, k: int, rid: int) -> bool:
    t = s.t
    return t[cs.C_RUNNING, k] != 0 and t[cs.C_RID, k] == rid and not t[cs.C_REPORTED, k]


@njit
def _g_can_abort(s: sg.SGState, k: int, rid: int) -> bool:
    t = s.t
    return t[sg.C_RUNNING, k] != 0 and t[sg.C_RID, k] == rid and not t[sg.C_REPORTED, k]


@njit
def _v_fields(s: cs.SchedState, k: int) -> tuple:
    """(request id, prompt id, prompt tokens, max tokens, generated as of its last fold, reported)."""
    t = s.t
    return t[cs.C_RID, k], t[cs.C_PROMPT_ID, k], t[cs.C_NPT, k], t[cs.C_MAX_TOKENS, k], t[cs.C_GENERATED, k], \
        t[cs.C_REPORTED, k]  # fmt: skip


@njit
def _g_fields(s: sg.SGState, k: int) -> tuple:
    t = s.t
    return t[sg.C_RID, k], t[sg.C_PROMPT_ID, k], t[sg.C_NPT, k], t[sg.C_MAX_TOKENS, k], t[sg.C_GENERATED, k], \
        t[sg.C_REPORTED, k]  # fmt: skip


@njit
def _v_new_slot(s: cs.SchedState, rid: int, prompt_id: int, npt: int, max_tokens: int, prompt_len: int,
                more_turns: bool, target: int, kept: int, rate: float, verify: float,
                lookahead: int) -> int:  # fmt: skip
    return cs.new_slot(s, rid, prompt_id, npt, max_tokens, prompt_len, more_turns, target, kept, kept > 0, rate,
                       verify, lookahead)  # fmt: skip


@njit
def _g_new_slot(s: sg.SGState, rid: int, prompt_id: int, npt: int, max_tokens: int, prompt_len: int,
                more_turns: bool, target: int, kept: int, rate: float, verify: float,
                lookahead: int) -> int:  # fmt: skip
    """(SGLang's rules model no speculation: `CompiledEngine` refuses it first.)"""
    return sg.new_slot(s, rid, prompt_id, npt, max_tokens, prompt_len, target, kept, kept > 0)


@njit
def _v_groups_calls(s: cs.SchedState) -> bool:
    """vLLM's frontend fans a call's samples out into requests before its scheduler."""
    return False


@njit
def _g_groups_calls(s: sg.SGState) -> bool:
    return s.groups


@njit
def _v_add_call(s: cs.SchedState, slots: np.ndarray) -> None:
    for k in slots:
        cs.enqueue(s, k)


# the seam's questions: each name, and how many arguments it takes after the state
QUESTIONS = {
    "has_work": 0, "failed": 0, "holds_finished": 0, "jump_plan": 0, "schedule": 0, "complete": 0,
    "finish_due": 0, "release_finishing": 0, "free_all": 0, "on_idle": 0, "groups_calls": 0, "advance": 1, "abort": 1,
    "generated": 1, "enqueue": 1, "add_call": 1, "own_abort": 1, "release_slot": 1, "fields": 1, "remove_waiting": 1,
    "can_abort": 2, "new_slot": 11,
}  # fmt: skip
# each rules' answers, by the class of its state (the pure path, and Python callers) and by its numba type
_BY_CLASS: dict[type, dict[str, Callable]] = {}
_BY_TYPE: dict[type, dict[str, Callable]] = {}


def add_rules(state_cls: type, type_cls: type, answers: dict[str, Callable]) -> None:
    """Let the engine run the rules whose state is a `state_cls` (a `Record` of numba type
    `type_cls`): `answers` holds their function for every question of `QUESTIONS`, compiled with
    `njit`, taking the state first."""
    if missing := sorted(set(QUESTIONS) - set(answers)):
        raise RlsimError(f"rules of {state_cls.__name__} answer no {', '.join(missing)}")
    _BY_CLASS[state_cls] = _BY_TYPE[type_cls] = dict(answers)


def _question(name: str, nargs: int) -> Callable:
    """One function of the seam: on the pure path it calls the rules' own by the state's class;
    compiled, an overload picks it by the state's type (numba wants the typing function's arguments
    named as the function's, hence the functions are written out here)."""
    args = ", ".join(["s"] + [f"a{j}" for j in range(nargs)])
    space: dict = {"by_class": _BY_CLASS, "by_type": _BY_TYPE}
    exec(  # noqa: S102 - the seam's functions, one per question
        f"def {name}({args}):\n    return by_class[type(s)]['{name}']({args})\n"
        f"def typer({args}):\n"
        f"    picked = by_type[type(s)]['{name}']\n"
        f"    def impl({args}):\n        return picked({args})\n"
        f"    return impl\n",
        space,
    )
    fn = space[name]
    fn.__doc__ = f"The rules' answer to `{name}`, whichever rules the state is of."
    if not PURE:
        from numba.extending import overload

        overload(fn)(space["typer"])
    return fn


for _name, _nargs in QUESTIONS.items():
    globals()[_name] = _question(_name, _nargs)

add_rules(cs.SchedState, cs.SchedStateType, {
    "has_work": _v_has_work, "failed": _v_failed, "holds_finished": _v_holds_finished, "jump_plan": cs.jump_plan,
    "schedule": cs.schedule, "complete": cs.complete, "finish_due": cs.finish_due,
    "release_finishing": cs.release_finishing, "free_all": cs.free_all, "on_idle": _v_on_idle,
    "advance": cs.advance, "abort": cs.abort, "generated": cs.generated, "enqueue": _v_enqueue,
    "own_abort": _v_own_abort, "release_slot": cs.release_slot, "fields": _v_fields,
    "remove_waiting": cs.remove_waiting, "can_abort": _v_can_abort, "new_slot": _v_new_slot,
    "groups_calls": _v_groups_calls, "add_call": _v_add_call,
})  # fmt: skip
add_rules(sg.SGState, sg.SGStateType, {
    "has_work": _g_has_work, "failed": _g_failed, "holds_finished": _g_holds_finished, "jump_plan": sg.jump_plan,
    "schedule": sg.schedule, "complete": sg.complete, "finish_due": sg.finish_due,
    "release_finishing": sg.release_finishing, "free_all": sg.free_all, "on_idle": sg.on_idle,
    "advance": sg.advance, "abort": sg.abort, "generated": sg.generated, "enqueue": sg.add,
    "own_abort": sg.own_abort, "release_slot": sg.release_slot, "fields": _g_fields,
    "remove_waiting": sg.remove_waiting, "can_abort": _g_can_abort, "new_slot": _g_new_slot,
    "groups_calls": _g_groups_calls, "add_call": sg.add_call,
})  # fmt: skip


# ---- an engine's instances' states ---------------------------------------------------------------------
def vllm_states(engine, kv_tokens: int, n: int) -> tuple[list, int, int]:  # noqa: ANN001 - an EngineConfig
    """vLLM's scheduler state for each of `n` instances holding `kv_tokens` KV tokens
    (`rlsim.sim.vllm_rules.vllm_rules`); with the largest request a submit takes and the
    capacity its errors name (whole blocks, both)."""
    num_blocks = kv_tokens // engine.block_size
    args = (num_blocks, engine.block_size, engine.max_num_seqs, engine.max_num_batched_tokens,
            engine.enable_chunked_prefill, engine.enable_prefix_caching, bool(engine.async_scheduling))  # fmt: skip
    cap = num_blocks * engine.block_size
    return _v_states(n, *args), cap, cap


def sglang_states(engine, kv_tokens: int, n: int) -> tuple[list, int, int]:  # noqa: ANN001 - an EngineConfig
    """SGLang's scheduler state for each of `n` instances (`rlsim.sim.sglang_rules.sglang_rules`,
    its overlap scheduler on); a submit takes any request (SGLang aborts one its pool cannot hold,
    and goes on), and its errors name the pool's tokens (whole pages)."""
    from rlsim.sim.sglang_scheduler import MAX_PREFILL_TOKENS, check_settings

    policy, page = engine.schedule_policy or "fcfs", engine.page_size or 1
    check_settings(policy, page)
    d = engine.sglang_settings()
    args = (kv_tokens, engine.max_num_seqs, engine.max_num_batched_tokens, engine.enable_chunked_prefill,
            engine.enable_prefix_caching, True, MAX_PREFILL_TOKENS, policy == "lpm", d.init_ratio, d.min_ratio,
            d.ratio_decay, d.clip_max_new_tokens_estimation, d.retract_decode_steps, page,
            bool(engine.parallel_sampling))  # fmt: skip
    return _g_states(n, *args), 2**62, kv_tokens // page * page


if PURE:

    def _v_states(n: int, *args: object) -> list:
        return [cs.new_scheduler(*args) for _ in range(n)]

    def _g_states(n: int, *args: object) -> list:
        return [sg.new_scheduler(*args) for _ in range(n)]

else:
    from numba.typed import List

    @njit
    def _v_states(n: int, num_blocks: int, block_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                  chunked: bool, caching: bool, async_sched: bool) -> list:  # fmt: skip
        out = List()
        for _ in range(n):
            out.append(cs.new_scheduler(num_blocks, block_size, max_num_seqs, max_num_batched_tokens, chunked,
                                        caching, async_sched))  # fmt: skip
        return out

    @njit
    def _g_states(n: int, num_tokens: int, max_running: int, chunk: int, chunked: bool, caching: bool,
                  overlap: bool, max_prefill: int, lpm: bool, init_ratio: float, min_ratio: float, decay: float,
                  clip: int, retract_steps: int, page: int, parallel_sampling: bool) -> list:  # fmt: skip
        out = List()
        for _ in range(n):
            out.append(sg.new_scheduler(num_tokens, max_running, chunk, chunked, caching, overlap, max_prefill, lpm,
                                        init_ratio, min_ratio, decay, clip, retract_steps, page,
                                        parallel_sampling))  # fmt: skip
        return out
