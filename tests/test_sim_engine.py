"""SimEngine: analytic cases, preemption, and the event-jumping fast path against --exact."""

from __future__ import annotations

import dataclasses

import pytest

from rlsim.profile import load_profile
from rlsim.protocol import Finished, Preempted, Request
from rlsim.sim_engine import SimEngine


def _profile(**kw):
    base = load_profile("h100-qwen2.5-7b-tp1")
    return dataclasses.replace(base, **kw)


def _req(rid: int, prompt: int, length: int, instance: int = 0, max_tokens: int = 10**6) -> Request:
    return Request(rid, rid, 0, 0, prompt, max_tokens, length, instance, 0)


def _drain(engine: SimEngine) -> list:
    out = []
    while events := engine.step():
        out += events
    return out


@pytest.mark.parametrize("exact", [False, True])
def test_batch_one_constant_step_time_is_sum_of_work(exact: bool) -> None:
    """One instance, batch 1, constant step time: rollout time = sum of lengths x step time."""
    p = _profile(t_w_s=0.01, alpha_s=0, beta_s=0, gamma_s=0, prefill_s_per_token=0, max_num_seqs=1)
    eng = SimEngine(p, 1, exact=exact)
    lengths = [5, 17, 1, 230, 42]
    eng.submit([_req(i, 100, n) for i, n in enumerate(lengths)])
    events = _drain(eng)
    assert sorted(e.request_id for e in events) == list(range(5))
    assert eng.now == pytest.approx(0.01 * sum(lengths), rel=1e-12)


@pytest.mark.parametrize("exact", [False, True])
def test_equal_requests_match_closed_form(exact: bool) -> None:
    """B equal requests: one prefill iteration, then L-1 decode iterations with C growing by B."""
    p = _profile(
        t_w_s=0.005,
        alpha_s=2e-5,
        beta_s=3e-8,
        gamma_s=1.5e-5,
        prefill_s_per_token=4e-6,
        max_num_batched_tokens=100_000,
    )
    b, prompt, length = 64, 120, 900
    eng = SimEngine(p, 1, exact=exact)
    eng.submit([_req(i, prompt, length) for i in range(b)])
    events = _drain(eng)
    assert all(isinstance(e, Finished) and e.num_output_tokens == length for e in events)
    first = p.t_w_s + p.alpha_s * b + p.beta_s * b * prompt + p.prefill_s_per_token * b * prompt
    k, c0 = length - 1, b * (prompt + 1)
    decode = k * (p.t_w_s + (p.alpha_s + p.gamma_s) * b + p.beta_s * c0) + p.beta_s * b * k * (k - 1) / 2
    assert eng.now == pytest.approx(first + decode, rel=1e-9)


def test_kv_exhaustion_preempts_and_still_completes() -> None:
    """A KV cache too small for the batch forces preemptions; every request still finishes."""
    p = _profile(kv_capacity_tokens=6000)
    for exact in (False, True):
        eng = SimEngine(p, 1, exact=exact)
        eng.submit([_req(i, 150, 400 + 37 * i) for i in range(40)])
        events = _drain(eng)
        finished = [e for e in events if isinstance(e, Finished)]
        assert len([e for e in events if isinstance(e, Preempted)]) > 0
        assert sorted(e.request_id for e in finished) == list(range(40))
        assert all(e.num_output_tokens == 400 + 37 * e.request_id for e in finished)


def test_max_tokens_cap_gives_length_finish() -> None:
    """A request capped below its natural length stops at the cap with finish_reason 'length'."""
    eng = SimEngine(_profile(), 1)
    eng.submit([_req(0, 50, 500, max_tokens=100), _req(1, 50, 80, max_tokens=100)])
    by_id = {e.request_id: e for e in _drain(eng)}
    assert (by_id[0].num_output_tokens, by_id[0].finish_reason) == (100, "length")
    assert (by_id[1].num_output_tokens, by_id[1].finish_reason) == (80, "stop")


def test_submit_mid_jump_joins_at_next_iteration() -> None:
    """A request submitted while an instance jumps starts at the next iteration, as in --exact."""
    times = {}
    for exact in (False, True):
        eng = SimEngine(_profile(), 1, exact=exact)
        eng.submit([_req(0, 100, 3000)])
        eng.call_at(1.234, "late")
        got = []
        while events := eng.step():
            for e in events:
                if getattr(e, "tag", None) == "late":
                    eng.submit([_req(1, 100, 500), _req(2, 80, 700)])
                elif isinstance(e, Finished):
                    got.append((e.request_id, e.time))
        times[exact] = dict(got)
    for rid in (0, 1, 2):
        assert times[False][rid] == pytest.approx(times[True][rid], rel=1e-9)


def test_abort_frees_the_request_and_reports_tokens() -> None:
    """Abort of a running request reports the tokens generated so far."""
    from rlsim.protocol import Aborted

    eng = SimEngine(_profile(), 1)
    eng.submit([_req(0, 100, 5000), _req(1, 100, 200)])
    events = []
    while not any(isinstance(e, Finished) for e in events):
        events += eng.step()
    eng.abort([0])
    rest = _drain(eng)
    ab = [e for e in rest if isinstance(e, Aborted)]
    assert len(ab) == 1 and 199 <= ab[0].num_output_tokens <= 201
