"""CompiledEngine: `SimEngine` behind the same `Engine` protocol, run by the compiled core.

The same instances, rules, costs and event order as `rlsim.sim.engine.SimEngine`
(`rlsim.sim.compiled.engine` reproduces its SimPy processes), so a run gives the same bytes on
either; this class only turns the protocol's calls into the core's arrays and the core's outbox
into an `EventBatch`. Replay of measured iteration times is not ported: `simulate` runs
`SimEngine` for it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from rlsim.errors import RlsimError
from rlsim.profile import Profile
from rlsim.protocol import (
    ABORTED,
    FINISHED,
    PREEMPTED,
    Aborted,
    EventBatch,
    Finished,
    Preempted,
    Request,
    RequestBatch,
    Timer,
)
from rlsim.rollout_engines import resolve, rollout_engine
from rlsim.sim.compiled import engine as ce
from rlsim.sim.compiled import rules as ru
from rlsim.sim.compiled.jit import cached
from rlsim.sim.engine import head_too_large, request_too_large
from rlsim.sim.replay import Replay
from rlsim.sim.sglang_scheduler import pool_too_small

# the core's submit columns, in its order (the target, min(target_tokens, max_tokens), after the sixth)
_SUBMIT = ("request_id", "prompt_id", "num_prompt_tokens", "max_tokens", "prompt_len", "more_turns", "kept_tokens",
           "instance")  # fmt: skip


_REASON = ("stop", "length")  # a finish reason by whether it hit its length: one object each, as the records keep
_ABORT_REASON = ("abort", "prompt_too_long")  # a policy's abort; the engine's own (`ce.OWN_ABORT`)
# a reason per request (a string numpy built per row would be kept too, about 56 bytes a request)
_new_finished = partial(tuple.__new__, Finished)  # a Finished from its fields' tuple, in C
_new_aborted = partial(tuple.__new__, Aborted)
_NO_PROMPTS = np.zeros(0, np.int64)  # `step` watching no prompt (never written)


def entry_points() -> dict[str, object]:
    """The core's compiled functions that Python calls, by name: each `ce.<name>(` of this module that
    is compiled, and the compiled functions that a plain-Python one of them calls (`new_engine`); and
    each `sg.<name>(` that SimEngine's SGLang rules call (`rlsim.sim.sglang_rules`), as `sg.<name>`.
    Each holds the machine code of everything it calls, so these are what the package ships."""
    import inspect
    import re

    from rlsim.sim.compiled import scheduler as cs
    from rlsim.sim.compiled import sglang as sg

    found = {}
    for name in re.findall(r"\bce\.(\w+)\(", inspect.getsource(inspect.getmodule(entry_points))):
        fn = getattr(ce, name)
        inner = [] if hasattr(fn, "_cache") else re.findall(r"\b(_?\w+)\(", inspect.getsource(fn))
        found.update({n: getattr(ce, n) for n in [name, *inner] if hasattr(getattr(ce, n, None), "_cache")})
    here = Path(sg.__file__).resolve().parents[1]  # (the callers are read, not imported: they import this core)
    for module, alias, caller in ((sg, "sg", "sglang_rules.py"), (cs, "cs", "vllm_rules.py")):
        for name in re.findall(rf"\b{alias}\.(\w+)\(", (here / caller).read_text()):
            found[f"{alias}.{name}"] = getattr(module, name)
    return dict(sorted(found.items()))


def core_compiled() -> bool:
    """Whether the compiled core's entry points load from the cache (else the first run compiles them)."""
    return cached(ce.submit, ce.step, ce.take_outbox, ce._make_engine)


def _events(rows: np.ndarray, times: np.ndarray, new) -> list:  # noqa: ANN001 - _new_finished or _new_aborted
    """The outbox rows' `Finished` (or `Aborted`) tuples, built column by column."""
    cols = [rows[:, 1].tolist(), times[:, 0].tolist(), rows[:, 2].tolist(), rows[:, 3].tolist()]
    if new is _new_finished:
        cols.append(list(map(_REASON.__getitem__, (rows[:, 4] != 0).tolist())))  # (the two shared strings)
    else:
        cols.append(list(map(_ABORT_REASON.__getitem__, rows[:, 4].tolist())))
    return list(map(new, zip(*cols, strict=True)))


def _call_ends(q: dict) -> np.ndarray:
    """1 where a request ends its call, as `SimEngine.submit` groups them: a launch's consecutive
    samples of one prompt on one instance, none of them a later turn or carrying KV."""
    col = {f: np.asarray(q[f], np.int64) for f in ("request_id", "instance", "epoch", "prompt_id", "prompt_len",
                                                   "kept_tokens")}  # fmt: skip
    alone = (col["prompt_len"] != 0) | (col["kept_tokens"] != 0)
    same = np.ones(len(alone) - 1, np.bool_)
    for f in ("instance", "epoch", "prompt_id"):
        same &= col[f][1:] == col[f][:-1]
    joins = same & (col["request_id"][1:] == col["request_id"][:-1] + 1) & ~alone[1:] & ~alone[:-1]
    return np.append(~joins, True).astype(np.int64)


class _Counts:
    """An instance's turn counters, where `rlsim.driver.turns` reads them (`inst.sched`)."""

    def __init__(self, engine: CompiledEngine, i: int) -> None:
        self.sched = self
        self._engine, self._i = engine, i

    @property
    def turn_tokens(self) -> int:
        return int(ce.turn_counts_of(self._engine.core, self._i)[0])

    @property
    def turn_hit_tokens(self) -> int:
        return int(ce.turn_counts_of(self._engine.core, self._i)[1])


# the profile's costs the core's state holds (`rlsim.sim.compiled.engine.new_engine`)
_COSTS = ("t_w_s", "alpha_s", "beta_s", "gamma_s", "prefill_s_per_token", "prefill_request_s", "linear_t0_s")


class CompiledEngine:
    """Simulated rollout instances behind the `Engine` protocol, compiled."""

    def __init__(
        self,
        profile: Profile,
        num_instances: int,
        exact: bool = False,
        spec=None,  # noqa: ANN001 - rlsim.spec.speculation.SpecModel or None
        lockstep: bool = False,
    ) -> None:
        engine = profile.engine
        self.profile = profile
        # the core is compiled for costs in floats: one given as an integer (a profile built in code with
        # a 0) would type its state anew, and compile the whole core again for it (minutes)
        profile = replace(profile, **{f: float(getattr(profile, f)) for f in _COSTS if getattr(profile, f) is not None})
        self.num_instances = num_instances
        self.exact, self.lockstep = exact, lockstep
        self.async_scheduling = engine.async_scheduling
        self.block_size = engine.block_size
        self.spec = spec
        self.replay = dict.fromkeys(Replay.COUNTS, 0)
        self._rules = rules = rollout_engine(engine.rollout_engine)  # (`simulate` runs this core only where it may)
        if spec is not None and not rules.speculates:
            raise RlsimError("speculative decoding is modelled under vLLM's rules only: use --rollout-engine vllm")
        # each instance's scheduler state under the engine's rules, the largest request a submit takes, and
        # the capacity errors name
        scheds, self._submit_cap, self._cap = resolve(rules.compiled)(engine, profile.kv_capacity_tokens, num_instances)
        draft_s = spec.draft_s if spec is not None else 0.0
        self.core = ce.new_engine(profile, num_instances, exact, lockstep, draft_s, scheds, self._submit_cap)
        # whether the rules take a call's samples as one request (SGLang's parallel sampling: `add_call`)
        self._groups = num_instances > 0 and bool(ru.groups_calls(scheds[0]))
        # first token times of the requests the last batches finished or aborted (the driver pops them)
        self.first_token: dict[int, float] = {}
        self._now = 0.0
        self.instances = [_Counts(self, i) for i in range(num_instances)]
        self._tags: list[str] = []
        self._rows, self._times = np.empty((1024, 6), np.int64), np.empty((1024, 2))  # a step's outbox, copied in

    # ---- what `simulate` and the records read -----------------------------------------------
    @property
    def prefix_hit_tokens(self) -> int:
        return int(ce.prefix_hit_tokens(self.core))

    @property
    def wake_reprefill_tokens(self) -> int:
        return int(ce.counters(self.core)[0])

    @property
    def pause_interrupts(self) -> int:
        return int(ce.counters(self.core)[1])

    @property
    def max_num_seqs(self) -> int:
        return self.profile.engine.max_num_seqs

    # ---- Engine protocol ------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self._now  # (only `step` moves the clock)

    def submit(self, requests: Sequence[Request]) -> None:
        if not isinstance(requests, RequestBatch):
            batch = RequestBatch()
            batch.extend(zip(*requests, strict=True) if len(requests) else [()] * len(Request._fields))
            requests = batch
        n = len(requests)
        q = dict(zip(Request._fields, requests.columns, strict=True))
        target = np.minimum(np.array(q["target_tokens"], np.int64), np.array(q["max_tokens"], np.int64))
        c = [np.array(q[f], np.int64) for f in _SUBMIT[:6]] + [target] + [np.array(q[f], np.int64) for f in _SUBMIT[6:]]
        rate, verify, lookahead = np.ones(n), np.ones(n), np.zeros(n, np.int64)
        if self.spec is not None:
            plan = self.spec.plan
            for j, r in enumerate(requests):
                rate[j], verify[j] = plan(r.epoch, r.prompt_id, r.sample_idx, int(target[j]), r.policy_version)
                if rate[j] != 1.0:
                    lookahead[j] = self.spec.lookahead
        call_end = _call_ends(q) if self._groups and n else np.ones(n, np.int64)
        touched = set(q["instance"])  # (woken in a set's order, as SimEngine does)
        bad = ce.submit(self.core, *c, rate, verify, lookahead, call_end, np.array(list(touched), np.int64))
        if bad >= 0:
            r = requests[bad]
            raise request_too_large(r, min(r.target_tokens, r.max_tokens), self._cap)

    def abort(self, request_ids: Iterable[int]) -> None:
        ce.abort(self.core, np.array(list(request_ids), np.int64))

    def call_at(self, when: float, tag: str) -> None:
        self._tags.append(tag)
        ce.call_at(self.core, when, len(self._tags) - 1)

    def pause(self, sleep: bool = False) -> None:
        ce.pause(self.core, sleep)

    def weights_updated(self) -> None:
        """New weights reached the rollout: under rules that flush on it (SGLang's radix cache), each
        instance flushes, retracting what runs, once its iteration in progress ends (`SimEngine`'s)."""
        if self._rules.flushes_on_weight_update:
            ce.weights_updated(self.core)

    def resume(self) -> None:
        ce.resume(self.core)

    def step(self, until_idle: bool = False, finishes: int = 1, prompts: Mapping[int, int] | None = None) -> EventBatch:
        count = ce.IDLE if until_idle else min(finishes, ce.IDLE)
        watched = counts = _NO_PROMPTS
        if prompts:
            watched = np.fromiter(prompts.keys(), np.int64, len(prompts))
            counts = np.maximum(np.fromiter(prompts.values(), np.int64, len(prompts)), 1)
        got, m, self._now = ce.step(self.core, count, self._rows, self._times, watched, counts)
        if got < 0:
            _, _, inst, error, tokens = ce.counters(self.core)
            if error == 2:  # (SGLang's rules: a request that cannot decode even alone in its pool)
                raise pool_too_small(int(tokens), self._cap)
            raise head_too_large(int(inst), self._cap)
        out = EventBatch()
        if got == 0:
            return out
        if m > len(self._rows):  # more rows than the buffers hold: larger ones take them
            self._rows, self._times = np.empty((2 * m, 6), np.int64), np.empty((2 * m, 2))
            ce.take_outbox(self.core, self._rows, self._times)
        rows, times = self._rows[:m], self._times[:m]
        fin = rows[:, 0] == FINISHED if got >= 64 else None
        if fin is not None and (fin | (rows[:, 0] == ABORTED)).all():  # a large batch of finishes and aborts
            first = times[:, 1]
            has_first = first == first  # (not NaN)
            if fin.all():  # (an epoch's bulk)
                out.extend(_events(rows, times, _new_finished))
            elif not fin.any():  # (an update that aborts whatever flies)
                out.extend(_events(rows, times, _new_aborted))
            else:  # each kind's tuples, then put back in the batch's order
                f, a = np.flatnonzero(fin), np.flatnonzero(~fin)
                made = _events(rows[f], times[f], _new_finished) + _events(rows[a], times[a], _new_aborted)
                at = np.empty(m, np.int64)
                at[f], at[a] = np.arange(len(f)), np.arange(len(f), m)
                out.extend(map(made.__getitem__, at.tolist()))
            self.first_token.update(zip(rows[has_first, 1].tolist(), first[has_first].tolist(), strict=True))
            return out
        first_token = self.first_token
        for (k, r, i, n, ln, g), (t, first) in zip(rows.tolist(), times.tolist(), strict=True):
            if k == FINISHED:
                out.append(_new_finished((r, t, i, n, _REASON[ln])))
            elif k == ABORTED:
                out.append(_new_aborted((r, t, i, n, _ABORT_REASON[ln])))
            elif k == PREEMPTED:
                out.append(Preempted(r, t, i, n))
                continue
            else:
                out.append(Timer(self._tags[g], t))
                continue
            if first == first:  # (not NaN)
                first_token[r] = first
        return out

    def busy_time(self, instance: int) -> float:
        busy, _, start, _ = ce.instance_times(self.core, instance)
        return busy + (self._now - start if not math.isnan(start) else 0.0)

    def seq_time(self, instance: int) -> float:
        _, seq, start, batch = ce.instance_times(self.core, instance)
        return seq + ((self._now - start) * batch if not math.isnan(start) else 0.0)

    def segments(self, instance: int) -> list[tuple[float, float]]:
        """Merged busy intervals in time order, the iteration or jump in progress counted up to now."""
        lo, hi = ce.segments(self.core, instance)
        segs = list(zip(lo.tolist(), hi.tolist(), strict=True))
        _, _, start, _ = ce.instance_times(self.core, instance)
        now = float(self._now)
        if not math.isnan(start) and now > start:
            if segs and segs[-1][1] >= start - 1e-12:
                segs[-1] = (segs[-1][0], now)
            else:
                segs.append((start, now))
        return segs
