"""`rlsim.sim.engine.SimEngine`'s instances and event loop as the compiled core runs them.

`SimEngine` runs one SimPy process per instance. Here the processes are state machines over the
instances' scheduler states, asked through the rules' seam (`rlsim.sim.compiled.rules`: vLLM's
`rlsim.sim.compiled.scheduler` or SGLang's `rlsim.sim.compiled.sglang`, the engine compiled for
each; what SimEngine does under SGLang's rules alone, it does here too: the radix cache flushed at
a weight update, the new-token ratio reset when idle, a prompt the pool cannot hold reported as
aborted), and SimPy's event queue is reproduced as
SimPy keeps it: a heap (`rlsim.sim.compiled.heap`) of (time, priority, event number, event)
where every scheduled event takes the next number, a process resumes in the callbacks of the
event it waits on, and an interrupt is an urgent event that leaves the timeout it cut short in
the queue, to fire later as a no-op. The
same events are scheduled in the same order as `SimEngine` schedules them, so every tie between
instances breaks the same way and every batch `step()` returns is the same, event for event.

Where `SimEngine` iterates a Python set (the aborts an instance applies together), the order is
CPython's set order, reproduced by `_set_order`. The states a process waits in:
`R_INIT` (not started), `R_RESUME` (paused), `R_WAKE` (idle), `R_HOLD` (lockstep, outputs not yet
taken), `R_ITER` (one iteration), `R_JUMP` (a jump), `R_JUMP_REST` (the iteration in progress
when a jump was interrupted).
"""

from __future__ import annotations

import math

import numpy as np

from rlsim.sim.compiled import heap as hp
from rlsim.sim.compiled import rules as ru
from rlsim.sim.compiled.jit import PURE, Record, StructType, define, float_dict, grow, int_dict, njit

FIELDS = (
    # settings and the profile's cost model
    "n", "exact", "lockstep", "async_sched", "cap", "t_w", "alpha", "beta", "gamma", "pspt", "preq", "t0",
    "resid_x", "resid_y", "draft_s",
    # SimPy: the clock, the event counter, the queue and the events
    "now", "eid", "heap", "heap_len",
    "ev_kind", "ev_inst", "ev_tag", "ev_triggered", "ev_spare", "num_ev_spare", "num_ev",
    # the instances
    "scheds", "wait_ev", "wait_seq", "wait_ctr", "state", "jumping", "busy", "seq_time", "cur_batch",
    "run_start", "has_run", "emitted", "wake", "k", "start", "took", "batch", "done_k",
    "seg_start", "seg_end", "num_seg", "ab_rid", "num_ab",
    "q_kind", "q_val", "q_next", "in_head", "in_tail", "rd_head", "rd_tail", "q_spare", "num_q_spare", "num_q",
    # the engine
    "paused", "sleep", "resume_ev", "held", "num_held", "where", "slot_of", "first_token",
    "wake_reprefill_tokens", "pause_interrupts", "timed",
    "ob_i", "ob_f", "num_ob",
    "error", "error_inst", "error_tokens", "scratch",
    # weight updates: an instance whose rules flush then flushes before its next schedule
    "flush",
    # `step(prompts=...)`: finishes each prompt may still have before the step ends (0: unwatched)
    "watch", "watch_hit",
)  # fmt: skip


class EngineStateType(StructType):
    """numba's type of `EngineState`."""


class EngineState(Record):
    """The whole simulated cluster: its instances' schedulers, processes and SimPy's queue."""

    __slots__ = FIELDS if PURE else ()


define(EngineState, EngineStateType, FIELDS)

# event kinds and the states a process waits in
E_INIT, E_TIMEOUT, E_WAKE, E_HOLD, E_RESUME, E_TIMER, E_INTERRUPT = 0, 1, 2, 3, 4, 5, 6
R_INIT, R_RESUME, R_WAKE, R_HOLD, R_ITER, R_JUMP, R_JUMP_REST = 0, 1, 2, 3, 4, 5, 6
URGENT, NORMAL = 0, 1
# outbox kinds, as `rlsim.protocol`'s `EventBatch.kind`
O_FINISHED, O_ABORTED, O_PREEMPTED, O_TIMER = 0, 1, 2, 3
IDLE = 2**62  # `step(finishes=IDLE)`: on until no request is left or a timer fired
# arrival kinds (async scheduling)
A_SUBMIT, A_ABORT, A_CALL, A_CALL_END = 0, 1, 2, 3  # (a call's samples: A_CALL each, A_CALL_END the last)
OWN_ABORT = 1  # an aborted outbox row's length column where the engine aborted it of its own accord
_NONE = -1


def new_engine(profile, num_instances: int, exact: bool, lockstep: bool, draft_s: float, scheds: list,  # noqa: ANN001
               cap: int) -> EngineState:  # fmt: skip
    """The state of `num_instances` idle instances under `profile` (a `Profile` with its engine), each
    scheduling with its state in `scheds` (built by its rules' builder, as `rlsim.sim.compiled.rules`'
    `vllm_states`: the engine is compiled for their type); a request needing more than `cap` KV
    tokens is refused at submit."""
    engine = profile.engine
    knots = profile.decode_residual_s or []
    return _make_engine(
        num_instances, exact, lockstep, engine.async_scheduling, cap, profile.t_w_s, profile.alpha_s, profile.beta_s,
        profile.gamma_s, profile.prefill_s_per_token, profile.prefill_request_s,
        profile.t_w_s if profile.linear_t0_s is None else profile.linear_t0_s,
        np.array([x for x, _ in knots], np.float64), np.array([y for _, y in knots], np.float64), draft_s, scheds,
    )  # fmt: skip


@njit
def _make_engine(n: int, exact: bool, lockstep: bool, async_sched: bool, cap_tokens: int, t_w: float,
                 alpha: float, beta: float, gamma: float, pspt: float, preq: float, t0: float,
                 resid_x: np.ndarray, resid_y: np.ndarray, draft_s: float, scheds: list) -> EngineState:  # fmt: skip
    cap = 16
    zi = np.zeros(cap, np.int64)
    ni = np.zeros(n, np.int64)
    nf = np.zeros(n)
    none = np.full(n, _NONE, np.int64)
    e = EngineState(
        n, exact, lockstep, async_sched, cap_tokens, t_w, alpha, beta, gamma, pspt, preq, t0,
        resid_x, resid_y, draft_s,
        0.0, 0, np.zeros((cap, 4), np.int64), 0, zi.copy(), zi.copy(), zi.copy(), zi.copy(), zi.copy(), 0, 0,
        scheds, none.copy(), ni.copy(), 0, ni.copy(), ni.copy(), nf.copy(), nf.copy(), ni.copy(),
        nf.copy(), ni.copy(), ni.copy(), none.copy(), ni.copy(), nf.copy(), nf.copy(), ni.copy(), ni.copy(),
        np.zeros((n, cap)), np.zeros((n, cap)), ni.copy(), np.zeros((n, 4), np.int64), ni.copy(),
        zi.copy(), zi.copy(), zi.copy(), none.copy(), none.copy(), none.copy(), none.copy(), zi.copy(), 0, 0,
        False, False, 0, np.zeros(max(n, 1), np.int64), 0, int_dict(), int_dict(), float_dict(),
        0, 0, False,
        np.zeros((cap, 6), np.int64), np.zeros((cap, 2)), 0,
        0, 0, 0, zi.copy(), ni.copy(),
        zi.copy(), False,
    )  # fmt: skip
    _start(e)
    return e


@njit
def _start(e: EngineState) -> None:
    """SimPy's `env.process()` for each instance: an urgent initialize event each, then the shared
    resume event `pause()` waits on."""
    for i in range(e.n):
        ev = _event(e, E_INIT, i)
        _schedule(e, ev, 0.0, URGENT)
        _wait(e, i, ev, R_INIT)
    e.resume_ev = _event(e, E_RESUME, _NONE)


# ---- SimPy: events and the queue ---------------------------------------------------------------
@njit
def _event(e: EngineState, kind: int, inst: int) -> int:
    """A new, untriggered event (SimPy's `env.event()`; a timeout is scheduled at once)."""
    if e.num_ev_spare:
        e.num_ev_spare -= 1
        ev = e.ev_spare[e.num_ev_spare]
    else:
        ev = e.num_ev
        if ev == e.ev_kind.shape[0]:
            e.ev_kind, e.ev_inst, e.ev_tag = grow(e.ev_kind), grow(e.ev_inst), grow(e.ev_tag)
            e.ev_triggered, e.ev_spare = grow(e.ev_triggered), grow(e.ev_spare)
        e.num_ev += 1
    e.ev_kind[ev], e.ev_inst[ev], e.ev_tag[ev], e.ev_triggered[ev] = kind, inst, 0, 0
    return ev


@njit
def _schedule(e: EngineState, ev: int, delay: float, priority: int) -> None:
    """SimPy's `env.schedule()`: the event is triggered and queued with the next number."""
    e.ev_triggered[ev] = 1
    e.heap = hp.push(e.heap, e.heap_len, hp.time_key(e.now + delay), priority, e.eid, ev)
    e.heap_len += 1
    e.eid += 1


@njit
def _timeout(e: EngineState, i: int, delay: float, state: int) -> None:
    """Instance i yields `env.timeout(delay)` and waits in `state`."""
    ev = _event(e, E_TIMEOUT, i)
    _schedule(e, ev, delay, NORMAL)
    _wait(e, i, ev, state)


@njit
def _wait(e: EngineState, i: int, ev: int, state: int) -> None:
    e.wait_ev[i], e.state[i] = ev, state
    e.wait_seq[i] = e.wait_ctr  # (the shared resume event resumes its waiters in this order)
    e.wait_ctr += 1


@njit
def peek(e: EngineState) -> float:
    return hp.key_time(e.heap[0, 0]) if e.heap_len else math.inf


@njit
def advance(e: EngineState) -> None:
    """SimPy's `env.step()`: process the next event (its callbacks resume who waits on it)."""
    key, _, _, ev = hp.pop(e.heap, e.heap_len)
    e.heap_len -= 1
    e.now = hp.key_time(key)
    kind, i = e.ev_kind[ev], e.ev_inst[ev]
    if kind == E_TIMER:
        _out(e, O_TIMER, _NONE, _NONE, 0, 0, e.ev_tag[ev])
        e.timed = True
    elif kind == E_RESUME:
        waiters = np.empty(e.n, np.int64)
        m = 0
        for j in range(e.n):
            if e.wait_ev[j] == ev:
                waiters[m] = j
                m += 1
        order = np.argsort(e.wait_seq[waiters[:m]], kind="mergesort")
        for j in waiters[:m][order]:
            if e.wait_ev[j] == ev:
                _proceed(e, j, False)
    elif kind == E_INTERRUPT:  # the timeout it waited on stays queued, with no one waiting
        _proceed(e, i, True)
    elif e.wait_ev[i] == ev:  # (a timeout cut short by an interrupt fires as a no-op)
        _proceed(e, i, False)
    e.ev_spare[e.num_ev_spare] = ev
    e.num_ev_spare += 1


# ---- the outbox -----------------------------------------------------------------------------------
@njit
def _out(e: EngineState, kind: int, rid: int, inst: int, tokens: int, length: int, tag: int) -> None:
    """An outbox row: (kind, request id, instance, tokens, length?, timer tag) and (time, first
    token time: a finished or aborted request's, NaN if it had none, which the engine forgets)."""
    j = e.num_ob
    if j == e.ob_i.shape[0]:
        e.ob_i, e.ob_f = grow(e.ob_i), grow(e.ob_f)
    r = e.ob_i[j]
    r[0], r[1], r[2], r[3], r[4], r[5] = kind, rid, inst, tokens, length, tag
    first = math.nan
    if (kind == O_FINISHED or kind == O_ABORTED) and rid in e.first_token:
        first = e.first_token[rid]
        del e.first_token[rid]
    e.ob_f[j, 0], e.ob_f[j, 1] = e.now, first
    e.num_ob += 1


# ---- the cost model (`Profile.iteration_s`, `compute_excess_s`; `rlsim.sim.jump`) ---------------
@njit
def _excess(e: EngineState, tokens: float) -> float:
    v = (e.pspt - e.gamma) * tokens - e.t0
    excess = v if v > 0.0 else 0.0  # (max(0.0, v))
    if e.resid_x.shape[0] == 0:
        return excess
    return excess + _residual(e, tokens)


@njit
def _residual(e: EngineState, tokens: float) -> float:
    xs, ys = e.resid_x, e.resid_y
    if tokens <= 0:
        return 0.0
    i = np.searchsorted(xs, tokens, side="left")  # bisect_left on (x, y) pairs against (tokens, -inf)
    if i >= xs.shape[0]:
        return ys[-1]
    x1, y1 = xs[i], ys[i]
    x0, y0 = (xs[i - 1], ys[i - 1]) if i else (0.0, 0.0)
    return y1 if x1 == x0 else y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)


@njit
def _jump_cost(e: EngineState, s: ru.State, k: int) -> float:
    a = e.t_w + e.alpha * s.num_decoding + e.gamma * s.verify_sum + e.beta * (s.ctx + s.rate_sum)
    a += _excess(e, s.verify_sum) + e.draft_s * s.num_spec
    q = e.beta * s.rate_sum
    return a * k + q * k * (k - 1) / 2


@njit
def _iters_done(e: EngineState, s: ru.State, elapsed: float, k: int) -> int:
    a = _jump_cost(e, s, 1)
    q = e.beta * s.rate_sum
    if q == 0:
        n = int(elapsed / a)
    else:
        bq = a - q / 2
        n = int((-bq + math.sqrt(bq * bq + 2 * q * elapsed)) / q)
    while n > 0 and _jump_cost(e, s, n) > elapsed + 1e-12:
        n -= 1
    while n + 1 <= k and _jump_cost(e, s, n + 1) <= elapsed:
        n += 1
    return min(n, k)


# ---- CPython's set order ---------------------------------------------------------------------------
@njit
def _set_order(vals: np.ndarray) -> np.ndarray:
    """The order CPython iterates a set of these non-negative ints, added in this order to an
    empty set (setobject.c: linear probes of 9, then perturbed probing; the table grows to the
    first power of two above four times the entries when three fifths full)."""
    size = 8
    table = np.full(size, -1, np.int64)
    used = 0
    for v in vals:
        size, table, used = _set_add(table, size, used, v)
    return table[table >= 0]


@njit
def _set_add(table: np.ndarray, size: int, used: int, v: int) -> tuple:
    j = _probe(table, size - 1, v)
    if table[j] == v:
        return size, table, used
    table[j] = v
    used += 1
    if used * 5 < (size - 1) * 3:
        return size, table, used
    minused = used * 2 if used > 50000 else used * 4
    new = 8
    while new <= minused:
        new <<= 1
    fresh = np.full(new, -1, np.int64)
    for x in table:  # (reinserted in table order, as set_table_resize does)
        if x >= 0:
            fresh[_probe(fresh, new - 1, x)] = x
    return new, fresh, used


@njit
def _probe(table: np.ndarray, mask: int, v: int) -> int:
    """Where v is, or the first empty slot on its probe sequence (a set without deletions)."""
    h = v % (2**61 - 1)
    i = h & mask
    perturb = h
    while True:
        probes = 9 if i + 9 <= mask else 0
        for j in range(i, i + probes + 1):
            if table[j] == v or table[j] < 0:
                return j
        perturb >>= 5
        i = (i * 5 + 1 + perturb) & mask


# ---- arrivals under async scheduling (linked lists per instance) ---------------------------------
@njit
def _q_push(e: EngineState, i: int, kind: int, val: int) -> None:
    if e.num_q_spare:
        e.num_q_spare -= 1
        r = e.q_spare[e.num_q_spare]
    else:
        r = e.num_q
        if r == e.q_kind.shape[0]:
            e.q_kind, e.q_val, e.q_next, e.q_spare = grow(e.q_kind), grow(e.q_val), grow(e.q_next), grow(e.q_spare)
        e.num_q += 1
    e.q_kind[r], e.q_val[r], e.q_next[r] = kind, val, _NONE
    if e.in_tail[i] == _NONE:
        e.in_head[i] = r
    else:
        e.q_next[e.in_tail[i]] = r
    e.in_tail[i] = r


@njit
def _defer(e: EngineState, i: int) -> bool:
    return e.async_sched and (e.has_run[i] != 0 or e.rd_head[i] != _NONE or e.in_head[i] != _NONE)


@njit
def _take_arrivals(e: EngineState, i: int) -> None:
    s = e.scheds[i]
    if e.paused or not ru.has_work(s):  # all of it lands
        if e.rd_head[i] == _NONE:
            head = e.in_head[i]
        else:
            head = e.rd_head[i]
            e.q_next[e.rd_tail[i]] = e.in_head[i]
        e.rd_head[i] = e.rd_tail[i] = _NONE
    else:
        head = e.rd_head[i]
        e.rd_head[i], e.rd_tail[i] = e.in_head[i], e.in_tail[i]
    e.in_head[i] = e.in_tail[i] = _NONE
    aborts = np.empty(8, np.int64)
    na = 0
    call = np.empty(8, np.int64)
    nc = 0
    r = head
    while r != _NONE:
        kind = e.q_kind[r]
        if kind == A_SUBMIT:
            ru.enqueue(s, e.q_val[r])
        elif kind == A_CALL or kind == A_CALL_END:
            if nc == call.shape[0]:
                call = grow(call)
            call[nc] = e.q_val[r]
            nc += 1
            if kind == A_CALL_END:
                ru.add_call(s, call[:nc])
                nc = 0
        else:
            if na == aborts.shape[0]:
                aborts = grow(aborts)
            aborts[na] = e.q_val[r]
            na += 1
        nxt = e.q_next[r]
        e.q_spare[e.num_q_spare] = r
        e.num_q_spare += 1
        r = nxt
    if na:
        abort_now(e, aborts[:na])


# ---- aborts ------------------------------------------------------------------------------------------
@njit
def abort_now(e: EngineState, rids: np.ndarray) -> None:
    """Abort these requests before the next schedule (waiting ones at once), events in this order."""
    firsts = np.empty(rids.shape[0], np.int64)  # instances in order of first appearance
    nf = 0
    for rid in rids:
        if rid in e.where:
            i = e.where[rid]
            seen = False
            for j in range(nf):
                if firsts[j] == i:
                    seen = True
                    break
            if not seen:
                firsts[nf] = i
                nf += 1
    gone_rid = np.empty(rids.shape[0], np.int64)  # waiting requests taken out, by request id
    gone_slot = np.empty(rids.shape[0], np.int64)
    ng = 0
    for j in range(nf):
        i = firsts[j]
        mine = np.empty(rids.shape[0], np.int64)
        m = 0
        for rid in rids:
            if rid in e.where and e.where[rid] == i:
                mine[m] = rid
                m += 1
        for k in ru.remove_waiting(e.scheds[i], mine[:m]):
            gone_rid[ng], gone_slot[ng] = ru.fields(e.scheds[i], k)[0], k
            ng += 1
    order = np.argsort(gone_rid[:ng])
    gone_rid, gone_slot = gone_rid[:ng][order], gone_slot[:ng][order]
    for rid in rids:
        if rid not in e.where:
            continue
        i = e.where[rid]
        g = np.searchsorted(gone_rid, rid)
        if g < ng and gone_rid[g] == rid:
            k = gone_slot[g]
            s = e.scheds[i]
            _gone(e, rid)
            _out(e, O_ABORTED, rid, i, ru.fields(s, k)[4], 0, 0)
            ru.release_slot(s, k)
            continue
        _abort_add(e, i, rid)
        if not e.has_run[i]:  # between iterations (idle or paused): abort now
            _apply_aborts(e, i)
        else:
            _poke(e, i)


@njit
def _gone(e: EngineState, rid: int) -> None:
    """The request left the engine (finished or aborted)."""
    if rid in e.where:
        del e.where[rid]
    if rid in e.slot_of:
        del e.slot_of[rid]


@njit
def _abort_add(e: EngineState, i: int, rid: int) -> None:
    for j in range(e.num_ab[i]):
        if e.ab_rid[i, j] == rid:
            return
    if e.num_ab[i] == e.ab_rid.shape[1]:
        a = np.zeros((e.n, 2 * e.ab_rid.shape[1]), np.int64)
        a[:, : e.ab_rid.shape[1]] = e.ab_rid
        e.ab_rid = a
    e.ab_rid[i, e.num_ab[i]] = rid
    e.num_ab[i] += 1


@njit
def _apply_aborts(e: EngineState, i: int) -> None:
    s = e.scheds[i]
    for rid in _set_order(e.ab_rid[i, : e.num_ab[i]].copy()):  # `list(inst.aborts)`
        if rid in e.slot_of:
            k = e.slot_of[rid]
            if ru.can_abort(s, k, rid):
                gen = ru.abort(s, k)
                _out(e, O_ABORTED, rid, i, gen, 0, 0)
                _gone(e, rid)
    e.num_ab[i] = 0


@njit
def _poke(e: EngineState, i: int) -> None:
    w = e.wake[i]
    if w != _NONE and not e.ev_triggered[w]:
        _schedule(e, w, 0.0, NORMAL)
    elif e.jumping[i]:
        e.jumping[i] = 0  # one interrupt per jump
        _schedule(e, _event(e, E_INTERRUPT, i), 0.0, URGENT)


# ---- an instance's process ---------------------------------------------------------------------------
@njit
def _busy(e: EngineState, i: int, start: float, end: float) -> None:
    e.has_run[i] = 0
    if end <= start:
        return
    e.busy[i] += end - start
    m = e.num_seg[i]
    if m and e.seg_end[i, m - 1] >= start - 1e-12:
        e.seg_end[i, m - 1] = end
        return
    if m == e.seg_start.shape[1]:
        a, b = np.zeros((e.n, 2 * m)), np.zeros((e.n, 2 * m))
        a[:, :m], b[:, :m] = e.seg_start, e.seg_end
        e.seg_start, e.seg_end = a, b
    e.seg_start[i, m], e.seg_end[i, m] = start, end
    e.num_seg[i] = m + 1


@njit
def _finished(e: EngineState, i: int, s: ru.State) -> None:
    if not s.num_due:
        return
    e.emitted[i] = 1
    for j in range(s.num_due):
        k = s.due[j]
        if ru.own_abort(s, k):  # the engine aborted it of its own accord, and went on (its request as sent)
            rid, p, _, _, _, _ = ru.fields(s, k)
            _out(e, O_ABORTED, rid, i, 0, OWN_ABORT, 0)
        else:
            rid, p, _, max_tokens, _, _ = ru.fields(s, k)
            gen = ru.generated(s, k)
            _out(e, O_FINISHED, rid, i, gen, 1 if gen >= max_tokens else 0, 0)
        _gone(e, rid)
        if p < e.watch.shape[0] and e.watch[p] > 0:  # a watched prompt's finish
            e.watch[p] -= 1
            if not e.watch[p]:
                e.watch_hit = True


@njit
def _free_kv(e: EngineState, i: int) -> None:
    s = e.scheds[i]
    for k in ru.free_all(s):
        _, _, npt, _, generated, _ = ru.fields(s, k)
        e.wake_reprefill_tokens += npt + generated


@njit
def _proceed(e: EngineState, i: int, interrupted: bool) -> None:
    """Run instance i's process from where it waited to its next wait (`SimEngine._run`)."""
    s = e.scheds[i]
    state = e.state[i]
    e.wait_ev[i] = _NONE
    if state == R_WAKE:
        e.wake[i] = _NONE
    elif state == R_ITER:
        _iteration_end(e, i, s, True)
    elif state == R_JUMP:
        if not interrupted:
            _jump_end(e, i, s, e.k[i])
        else:
            done_k = _iters_done(e, s, e.now - e.start[i], e.k[i])
            if done_k < e.k[i]:
                done_k += 1  # the iteration in progress completes
            end = e.start[i] + _jump_cost(e, s, done_k)
            e.jumping[i] = 0
            if end > e.now:
                e.done_k[i] = done_k
                _timeout(e, i, end - e.now, R_JUMP_REST)
                return
            _jump_end(e, i, s, done_k)
    elif state == R_JUMP_REST:
        _jump_end(e, i, s, e.done_k[i])
    while True:
        if e.rd_head[i] != _NONE or e.in_head[i] != _NONE:
            _take_arrivals(e, i)
        if e.num_ab[i]:
            _apply_aborts(e, i)
        if e.flush[i]:
            e.flush[i] = 0
            _free_kv(e, i)
        if e.paused:
            if e.sleep:
                _free_kv(e, i)
            ru.on_idle(s)  # (an engine left with nothing has idled before the pause reached it)
            _wait(e, i, e.resume_ev, R_RESUME)
            return
        if not ru.has_work(s):
            ru.on_idle(s)  # SGLang: a fully idle engine's new-token ratio goes back to its start
            w = _event(e, E_WAKE, i)
            e.wake[i] = w
            _wait(e, i, w, R_WAKE)
            return
        if e.lockstep and e.emitted[i]:
            e.emitted[i] = 0  # the previous iteration's outputs reach the driver before the next one starts
            h = _event(e, E_HOLD, i)
            if e.num_held == e.held.shape[0]:
                e.held = grow(e.held)
            e.held[e.num_held] = h
            e.num_held += 1
            _wait(e, i, h, R_HOLD)
            return
        k = 0 if e.exact or e.rd_head[i] != _NONE else ru.jump_plan(s)
        e.start[i], e.run_start[i], e.has_run[i] = e.now, e.now, 1
        if k == 0:
            ru.schedule(s)
            if ru.failed(s):  # a request that cannot decode in the whole pool
                e.error, e.error_inst, e.error_tokens = 2, i, ru.failed(s)
                return
            for j in range(s.out_num_preempted):
                v = s.out_preempted[j]
                rid, _, _, _, generated, reported = ru.fields(s, v)
                if not reported:  # (async: a finished request's slot, dropped)
                    _out(e, O_PREEMPTED, rid, i, generated, 0, 0)
                    e.emitted[i] = 1
            batch = s.out_num_decodes + s.out_num_chunks
            if batch == 0 and not s.out_num_preempted and ru.holds_finished(s):  # async: only finished ones held slots
                ru.release_finishing(s)
                e.has_run[i] = 0
                continue
            if batch == 0 and not s.out_num_preempted:  # nothing running and the head cannot fit
                e.error, e.error_inst = 1, i
                return
            if batch:
                took = (e.t_w + e.alpha * batch + e.beta * s.ctx + e.gamma * s.out_decode_tokens
                        + e.pspt * s.out_prefill_tokens + e.preq * s.out_num_chunks)  # fmt: skip
                took += _excess(e, s.out_decode_tokens) + e.draft_s * s.num_spec
                e.cur_batch[i], e.took[i], e.batch[i] = batch, took, batch
                _timeout(e, i, took, R_ITER)
                return
            _iteration_end(e, i, s, False)
        else:
            e.k[i] = k
            e.cur_batch[i] = s.num_decoding
            e.jumping[i] = 1
            _timeout(e, i, _jump_cost(e, s, k), R_JUMP)
            return


@njit
def _iteration_end(e: EngineState, i: int, s: ru.State, ran: bool) -> None:
    if ran:
        e.seq_time[i] += e.batch[i] * e.took[i]
    n = s.out_num_chunks
    ru.complete(s)  # (which leaves `out_chunk` as the schedule wrote it)
    chunks = s.out_chunk
    for j in range(n):
        k = chunks[j]
        rid, _, _, _, generated, _ = ru.fields(s, k)
        if generated:  # its prefill ended: the first token is out
            if rid not in e.first_token:
                e.first_token[rid] = e.now
    _busy(e, i, e.start[i], e.now)
    _finished(e, i, s)


@njit
def _jump_end(e: EngineState, i: int, s: ru.State, done_k: int) -> None:
    e.jumping[i] = 0
    e.seq_time[i] += s.num_decoding * (e.now - e.start[i])
    ru.advance(s, done_k)
    _busy(e, i, e.start[i], e.now)
    ru.finish_due(s)
    _finished(e, i, s)


# ---- the Engine protocol's calls ------------------------------------------------------------------
@njit
def submit(e: EngineState, rid: np.ndarray, prompt_id: np.ndarray, npt: np.ndarray, max_tokens: np.ndarray,
           prompt_len: np.ndarray, more_turns: np.ndarray, target: np.ndarray, kept: np.ndarray,
           inst: np.ndarray, rate: np.ndarray, verify: np.ndarray, lookahead: np.ndarray, call_end: np.ndarray,
           touched: np.ndarray) -> int:  # fmt: skip
    """Queue these requests (deferred by one schedule on a busy instance under async scheduling),
    then wake the instances `touched`, in that order. A request whose `call_end` is 0 is a sample of
    one call with the requests after it, up to one whose `call_end` is 1 (rules that group a call's
    samples take them together: `add_call`). Returns the index of a request larger than an
    instance's KV, or -1."""
    slots = np.empty(rid.shape[0], np.int64)
    start = 0
    for j in range(rid.shape[0]):
        if npt[j] + target[j] > e.cap:
            return j
        i = inst[j]
        s = e.scheds[i]
        k = ru.new_slot(s, rid[j], prompt_id[j], npt[j], max_tokens[j], prompt_len[j], more_turns[j] != 0,
                        target[j], kept[j], rate[j], verify[j], lookahead[j])  # fmt: skip
        slots[j] = k
        e.where[rid[j]] = i
        e.slot_of[rid[j]] = k
        if not call_end[j]:
            continue
        if j == start:
            if _defer(e, i):
                _q_push(e, i, A_SUBMIT, k)
            else:
                ru.enqueue(s, k)
        elif _defer(e, i):
            for m in range(start, j):
                _q_push(e, i, A_CALL, slots[m])
            _q_push(e, i, A_CALL_END, k)
        else:
            ru.add_call(s, slots[start : j + 1])
        start = j + 1
    for i in touched:
        _poke(e, i)
    return -1


@njit
def abort(e: EngineState, rids: np.ndarray) -> None:
    if e.async_sched:
        now = np.empty(rids.shape[0], np.int64)
        m = 0
        for rid in rids:
            i = e.where[rid] if rid in e.where else _NONE
            if i != _NONE and _defer(e, i):
                _q_push(e, i, A_ABORT, rid)
                _poke(e, i)
            else:
                now[m] = rid
                m += 1
        rids = now[:m]
    abort_now(e, rids)


@njit
def call_at(e: EngineState, when: float, tag: int) -> None:
    ev = _event(e, E_TIMER, _NONE)
    e.ev_tag[ev] = tag
    d = when - e.now
    _schedule(e, ev, d if d > 0.0 else 0.0, NORMAL)


@njit
def pause(e: EngineState, sleep: bool) -> None:
    e.paused, e.sleep = True, sleep
    for i in range(e.n):
        if not e.has_run[i]:
            if sleep:
                _free_kv(e, i)
        elif e.jumping[i]:
            e.jumping[i] = 0
            _schedule(e, _event(e, E_INTERRUPT, i), 0.0, URGENT)
            e.pause_interrupts += 1


@njit
def weights_updated(e: EngineState) -> None:
    """New weights reached the rollout, under rules that flush on it (SGLang's radix cache, what
    runs retracted): each instance flushes now if between iterations, else once its iteration in
    progress ends (a jump stops after its current one)."""
    for i in range(e.n):
        if not e.has_run[i]:
            _free_kv(e, i)
        else:
            e.flush[i] = 1
            _poke(e, i)


@njit
def resume(e: EngineState) -> None:
    e.paused = e.sleep = False
    if not e.ev_triggered[e.resume_ev]:
        _schedule(e, e.resume_ev, 0.0, NORMAL)
    e.resume_ev = _event(e, E_RESUME, _NONE)


@njit
def step(e: EngineState, finishes: int, rows: np.ndarray, times: np.ndarray, prompts: np.ndarray,
         counts: np.ndarray) -> tuple:  # fmt: skip
    """Run to the next instant with events, and through it, and on, instant after instant, until
    `finishes` requests have finished, `counts[j]` requests of a prompt `prompts[j]` have, none
    is left or a timer fired (`SimEngine.step`; 1: the first instant only, `IDLE`: until none is
    left or a timer fired; no prompts: none watched). Returns (status,
    the number of outbox rows, the time): status 0 when nothing is left to happen, -1 when an
    instance cannot run its head (`error`), else the number of rows. The rows, as `_out` writes
    them, are copied into `rows` and `times` when they fit; otherwise they wait for `take_outbox`
    (with buffers that hold them) before anything else is called."""
    if prompts.shape[0]:
        top = prompts.max() + 1
        if top > e.watch.shape[0]:
            e.watch = np.zeros(max(top, 2 * e.watch.shape[0]), np.int64)
        e.watch[prompts] = counts
        e.watch_hit = False
    status = _step(e, finishes)
    if prompts.shape[0]:
        e.watch[prompts] = 0
        e.watch_hit = False
    m = e.num_ob if status > 0 else 0
    if status > 0 and m <= rows.shape[0]:
        take_outbox(e, rows, times)
    return status, m, e.now


@njit
def take_outbox(e: EngineState, rows: np.ndarray, times: np.ndarray) -> None:
    """Copy the outbox's rows into `rows` and `times` (which hold them all) and empty it."""
    m = e.num_ob
    rows[:m] = e.ob_i[:m]
    times[:m] = e.ob_f[:m]
    e.num_ob = 0
    e.timed = False


@njit
def _through_instant(e: EngineState) -> bool:
    """Process everything else happening at this instant; False if an instance failed."""
    now = e.now
    while e.heap_len and peek(e) <= now:
        advance(e)
        if e.error:
            return False
    return True


@njit
def _step(e: EngineState, finishes: int) -> int:
    for j in range(e.num_held):  # lockstep: the driver has seen the outputs; the instances go on
        _schedule(e, e.held[j], 0.0, NORMAL)
    e.num_held = 0
    while e.num_ob == 0:  # (aborts the driver made since the last step may be in it already)
        if not e.heap_len:
            return 0
        advance(e)
        if e.error:
            return -1
    if not _through_instant(e):
        return -1
    if finishes > 1 and not e.watch_hit and not e.lockstep:  # on, instant by instant, while requests run
        seen = done = 0
        while True:
            for j in range(seen, e.num_ob):  # (an abort of the engine's own accord ends a request too)
                if e.ob_i[j, 0] == O_FINISHED or (e.ob_i[j, 0] == O_ABORTED and e.ob_i[j, 4] == OWN_ABORT):
                    done += 1
            seen = e.num_ob
            if done >= finishes or e.watch_hit or not len(e.where) or e.timed or not e.heap_len:
                break
            advance(e)
            if e.error or not _through_instant(e):
                return -1
    if e.lockstep:
        e.emitted[:] = 0
    return e.num_ob


@njit
def counters(e: EngineState) -> tuple:
    """(Tokens re-prefilled after sleeps, jumps a pause interrupted, the instance in error, the error:
    1 its waiting head cannot fit, 2 a request of `error_tokens` KV tokens cannot decode in its pool;
    those tokens)."""
    return e.wake_reprefill_tokens, e.pause_interrupts, e.error_inst, e.error, e.error_tokens


@njit
def turn_counts_of(e: EngineState, i: int) -> tuple:
    s = e.scheds[i]
    return s.turn_tokens, s.turn_hit_tokens


@njit
def instance_times(e: EngineState, i: int) -> tuple:
    """(busy seconds, sequence-seconds, start of the run in progress or NaN, running sequences)."""
    return e.busy[i], e.seq_time[i], e.run_start[i] if e.has_run[i] else math.nan, e.cur_batch[i]


@njit
def segments(e: EngineState, i: int) -> tuple:
    m = e.num_seg[i]
    return e.seg_start[i, :m].copy(), e.seg_end[i, :m].copy()


@njit
def prefix_hit_tokens(e: EngineState) -> int:
    n = 0
    for s in e.scheds:
        n += s.prefix_hit_tokens
    return n
