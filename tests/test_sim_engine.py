"""SimEngine: analytic cases, preemption, and the event-jumping fast path against --exact."""

from __future__ import annotations

import dataclasses

import pytest

from rlsim.config import EngineConfig
from rlsim.profile import load_profile
from rlsim.protocol import Finished, Preempted, Request
from rlsim.sim.engine import SimEngine
from rlsim.step_costs import with_engine

ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}


def _profile(**kw):
    """The 7B profile with these costs and engine settings (synchronous scheduling unless asked:
    async scheduling's one-iteration lags are `tests/test_async_scheduling.py`'s)."""
    engine = {k: kw.pop(k) for k in list(kw) if k in ENGINE_FIELDS}
    base = dataclasses.replace(load_profile("h100-qwen2.5-7b-tp1"), **kw)
    return with_engine(base, EngineConfig(**{"async_scheduling": False, **engine}))


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


def _prompt_req(rid: int, prompt_id: int, prompt: int, length: int) -> Request:
    return Request(rid, prompt_id, rid, 0, prompt, 10**6, length, 0, 0)


@pytest.mark.parametrize("exact", [False, True])
def test_prefix_cache_shares_a_prompt_between_siblings(exact: bool) -> None:
    """Four samples of one prompt prefill it once (plus, each, the last partial 16-token block, as
    vLLM hits whole blocks only), and hold its KV once: where four copies would preempt, one does
    not."""
    p = _profile(t_w_s=0.01, alpha_s=0, beta_s=0, gamma_s=0, prefill_s_per_token=1e-5, kv_capacity_tokens=2500)
    firsts = {}
    for caching in (True, False):
        eng = SimEngine(with_engine(p, EngineConfig(enable_prefix_caching=caching)), 1, exact=exact)
        eng.submit([_prompt_req(i, 7, 1000, 300) for i in range(4)])
        events = _drain(eng)
        firsts[caching] = sorted(eng.first_token.values())
        preempted = sum(isinstance(e, Preempted) for e in events)
        assert preempted == (0 if caching else preempted) and (caching or preempted > 0)
        assert eng.prefix_hit_tokens == (3 * (999 // 16 * 16) if caching else 0)  # whole 16-token blocks
    assert firsts[True] == pytest.approx([0.01 + 1e-5 * (1000 + 3 * 8)] * 4, rel=1e-12)
    assert firsts[False][0] > firsts[True][0]


def test_freed_prompt_blocks_are_reused() -> None:
    """A prompt whose last request finished stays cached in free memory: a later sample of it
    computes its last partial block (8 tokens), not the prompt."""
    p = _profile(t_w_s=0.01, alpha_s=0, beta_s=0, gamma_s=0, prefill_s_per_token=1e-5)
    eng = SimEngine(p, 1)
    eng.submit([_prompt_req(0, 7, 1000, 5)])
    _drain(eng)
    t0 = eng.now
    eng.submit([_prompt_req(1, 7, 1000, 5)])
    _drain(eng)
    assert eng.first_token[1] - t0 == pytest.approx(0.01 + 1e-5 * 8, rel=1e-12)
    assert eng.prefix_hit_tokens == 992


@pytest.mark.parametrize("exact", [False, True])
def test_sleep_frees_kv_and_carried_requests_reprefill(exact: bool) -> None:
    """pause(sleep=True) mid-decode frees the KV; after resume the request recomputes its prompt
    plus generated tokens in one prefill, then decodes the rest: it ends one prefill later than
    after a pause that keeps the KV."""
    p = _profile(t_w_s=0.01, alpha_s=0, beta_s=0, gamma_s=0, prefill_s_per_token=1e-5)
    done = {}
    for sleep in (False, True):
        eng = SimEngine(p, 1, exact=exact)
        eng.submit([_prompt_req(0, 3, 500, 1000)])
        eng.call_at(2.01, "train")  # the prefill (15 ms) and 199 decodes are done, one is half done
        eng.call_at(10.0, "wake")
        while events := eng.step():
            for e in events:
                if getattr(e, "tag", None) == "train":
                    eng.pause(sleep=sleep)
                elif getattr(e, "tag", None) == "wake":
                    eng.resume()
                elif isinstance(e, Finished):
                    done[sleep] = e.time
        assert eng.wake_reprefill_tokens == (500 + 201 if sleep else 0)
        assert eng.pause_interrupts == (0 if exact else 1)
    # 201 tokens before the pause (the prefill's and 200 decodes': the one in progress completes);
    # after the wake with its KV freed: one prefill of 701 tokens that samples token 202.
    assert done[False] == pytest.approx(10.0 + 0.01 * (1000 - 201), rel=1e-9)
    assert done[True] == pytest.approx(done[False] + 1e-5 * 701, rel=1e-9)


def test_replay_takes_each_iteration_time_from_the_recording() -> None:
    """Replay: the k-th iteration takes the k-th recorded time, whatever the profile says; an
    iteration whose batch matches the recording's is counted, and iterations past the end of
    the recording fall back to the model."""
    p = _profile(t_w_s=0.01, alpha_s=0, beta_s=0, gamma_s=0, prefill_s_per_token=0, max_num_seqs=1)
    lengths = [3, 2]  # 5 iterations one at a time (batch 1, no prefill beyond each first)
    exact = SimEngine(p, 1, exact=True)
    exact.submit([_req(i, 10, n) for i, n in enumerate(lengths)])
    _drain(exact)
    times = [0.5, 0.25, 0.125, 0.0625]  # one short of the 5 iterations
    rec = [(t, 1, 0) for t in times]
    eng = SimEngine(p, 1, iteration_times=[rec])
    eng.submit([_req(i, 10, n) for i, n in enumerate(lengths)])
    events = _drain(eng)
    assert sorted(e.request_id for e in events if isinstance(e, Finished)) == [0, 1]
    assert eng.now == pytest.approx(sum(times) + 0.01, rel=1e-12)  # the 5th from the model
    # each request's first iteration prefills its 10 prompt tokens, unlike the (1 decode, 0
    # prefill) batches recorded: only iterations 2 and 3 (request 0 decoding) match
    assert eng.replay == {"iterations": 5, "same_batch": 2, "past_recording": 1}
    assert exact.now == pytest.approx(0.05, rel=1e-12)


@pytest.mark.parametrize("exact", [False, True])
def test_per_request_term_is_paid_once_per_prefilled_request(exact: bool) -> None:
    """`prefill_request_s` adds its seconds for each request an iteration prefills: B requests
    whose prompts fit one iteration add B x the term to the rollout, and nothing to decoding."""
    base = dict(t_w_s=0.005, alpha_s=0, beta_s=0, gamma_s=1e-5, prefill_s_per_token=4e-6,
                max_num_batched_tokens=100_000)  # fmt: skip
    times = {}
    for term in (0.0, 2e-3):
        eng = SimEngine(_profile(prefill_request_s=term, **base), 1, exact=exact)
        eng.submit([_req(i, 100, 50 + i) for i in range(32)])
        _drain(eng)
        times[term] = eng.now
    assert times[2e-3] - times[0.0] == pytest.approx(32 * 2e-3, rel=1e-9)


def test_per_request_term_in_a_profile_file() -> None:
    """A profile file states the term or leaves it out (0, as files written before it); a
    negative one is refused in one sentence."""
    from rlsim.errors import RlsimError
    from rlsim.profile import profile_from_dict

    raw = load_profile("h100-qwen2.5-7b-tp1").to_dict()
    assert "prefill_request_s" not in raw and profile_from_dict(raw).prefill_request_s == 0.0
    p = profile_from_dict(raw | {"prefill_request_s": 1.5e-4})
    assert p.to_dict()["prefill_request_s"] == 1.5e-4
    assert p.iteration_s(4, 0, 0, 100, 2) - p.iteration_s(4, 0, 0, 100, 0) == pytest.approx(3e-4)
    with pytest.raises(RlsimError, match="prefill_request_s"):
        profile_from_dict(raw | {"prefill_request_s": -1.0})
