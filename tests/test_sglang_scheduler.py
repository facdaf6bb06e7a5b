"""SGLang's scheduling rules (`rlsim.sim.sglang_scheduler`, `rlsim.sim.radix_cache`): each rule on a
case small enough to work out by hand, the event jumps against the step-by-step path on a workload
that retracts and aborts, and the settings refused for SGLang.
"""

from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest

from rlsim.config import EngineConfig
from rlsim.errors import RlsimError
from rlsim.profile import load_profile
from rlsim.protocol import Aborted, Finished, Preempted, Request
from rlsim.sim.engine import SimEngine
from rlsim.sim.radix_cache import RadixCache
from rlsim.sim.rollout_scheduler import make_scheduler
from rlsim.sim.seq import Seq
from rlsim.sim.sglang_rules import SGLangRules
from rlsim.sim.sglang_scheduler import (
    INIT_NEW_TOKEN_RATIO,
    MIN_NEW_TOKEN_RATIO,
    NEW_TOKEN_RATIO_DECAY,
    RETRACT_DECODE_STEPS,
    SGLangScheduler,
)
from rlsim.step_costs import with_engine


def _req(rid: int, prompt: int, target: int, max_tokens: int = 2000, prompt_id: int | None = None) -> Request:
    return Request(rid, rid if prompt_id is None else prompt_id, 0, 0, prompt, max_tokens, target, 0, 0)


def _seq(rid: int, prompt: int, target: int, **kw) -> Seq:
    req = _req(rid, prompt, target, **kw)
    return Seq(req, min(target, req.max_tokens))


def _run(s: SGLangScheduler, iters: int) -> list:
    """Run up to `iters` iterations step by step; return the finished requests' ids."""
    done = []
    for _ in range(iters):
        out = s.schedule()
        if not out.chunks and not out.num_decodes:
            s.release_finishing()
            if not s.running and not s.waiting:
                break
            continue
        done += [seq.req.request_id for seq in s.complete(out)]
    return done


def test_admission_reserves_each_new_requests_output_and_marks_the_batch_full() -> None:
    """3,000 slots: the first request needs 50 + 2,000 + 1 < 3,000 and reserves 50 + 1 + 2,000;
    the second needs the same 2,051 of the 949 left, so the batch is full, and no admission is
    tried again until a request leaves, even after the ratio falls."""
    s = SGLangScheduler(3000, max_running_requests=64, chunked_prefill_size=8192, overlap=False)
    for i in range(3):
        s.add(_seq(i, 50, 100))
    out = s.schedule()
    assert [(seq.req.request_id, take) for seq, take in out.chunks] == [(0, 50)]
    assert s.batch_is_full and len(s.waiting) == 2
    s.complete(out)
    for _ in range(98):  # request 0 decodes; the queue waits though the ratio decays
        out = s.schedule()
        assert not out.chunks and out.num_decodes == 1
        s.complete(out)
    assert s.new_token_ratio == pytest.approx(INIT_NEW_TOKEN_RATIO - 98 * NEW_TOKEN_RATIO_DECAY)
    out = s.schedule()  # its 100th token
    assert [seq.req.request_id for seq in s.complete(out)] == [0]
    assert not s.batch_is_full  # it left: the next schedule admits
    out = s.schedule()
    assert [seq.req.request_id for seq, _ in out.chunks] == [1]


def test_running_requests_reserve_their_remaining_output_times_the_ratio() -> None:
    """Once the ratio has decayed, the running request's reservation is (max_new - output) * ratio,
    so a second request fits beside it."""
    s = SGLangScheduler(3000, max_running_requests=64, chunked_prefill_size=8192, overlap=False)
    s.add(_seq(0, 50, 1500))
    s.complete(s.schedule())
    for _ in range(700):  # the ratio reaches its floor after 600 decode steps
        s.complete(s.schedule())
    assert s.new_token_ratio == MIN_NEW_TOKEN_RATIO
    s.add(_seq(1, 50, 10))
    out = s.schedule()
    # 3,000 - 750 slots used - (2,000 - 701) * 0.098 = 2,122.7 > 2,051
    assert [seq.req.request_id for seq, _ in out.chunks] == [1]


def test_a_prompt_longer_than_the_chunk_budget_is_cut_and_continues_first() -> None:
    s = SGLangScheduler(20000, max_running_requests=64, chunked_prefill_size=1000, overlap=False)
    s.add(_seq(0, 2500, 5))
    s.add(_seq(1, 100, 5))
    takes = []
    for _ in range(3):
        out = s.schedule()
        takes.append([(seq.req.request_id, take) for seq, take in out.chunks])
        s.complete(out)
    assert takes == [[(0, 1000)], [(0, 1000)], [(0, 500), (1, 100)]]


def test_a_groups_samples_admitted_together_each_prefill_the_prompt() -> None:
    """Four samples of one 300-token prompt, sent one per sample as RL frameworks send them and
    admitted in one pass: matching happens at admission, so each prefills the prompt; when they
    are inserted the tree keeps one copy and the other three give their slots back. A sample
    admitted later hits the cached prompt, all but its last token."""
    s = SGLangScheduler(50000, max_running_requests=64, chunked_prefill_size=8192, overlap=False)
    for i in range(4):
        s.add(_seq(i, 300, 20, prompt_id=7))
    out = s.schedule()
    assert out.prefill_tokens == 4 * 300
    s.complete(out)
    assert s.cache.free == 50000 - 300
    s.add(_seq(9, 300, 20, prompt_id=7))
    out = s.schedule()
    assert [(seq.req.request_id, take) for seq, take in out.chunks] == [(9, 1)]
    assert s.prefix_hit_tokens == 299


def test_retraction_takes_the_fewest_outputs_first_and_resets_the_ratio() -> None:
    """A decodes alone; with the ratio at 0 its reservation is nothing, so B (120 + 600 + 1 <
    1,200 - 101) joins it, and C, for which B's own reservation leaves no room, marks the batch
    full. A and B outgrow the 1,200 slots: B, with the fewest output tokens, is retracted, its
    output freed, and the ratio becomes (output + 20) / (max_new + 1) over A."""
    s = SGLangScheduler(1200, max_running_requests=64, chunked_prefill_size=8192, overlap=False)
    a, b, c = _seq(0, 100, 900, max_tokens=600), _seq(1, 120, 900, max_tokens=600), _seq(2, 100, 900, max_tokens=600)
    s.add(a)
    s.complete(s.schedule())
    s.complete(s.schedule())  # A decodes one step
    s.new_token_ratio = 0.0  # (as if long decayed)
    s.add(b)
    s.add(c)
    out = s.schedule()
    assert [seq.req.request_id for seq, _ in out.chunks] == [1] and s.batch_is_full
    s.complete(out)
    retracted = []
    for _ in range(600):
        out = s.schedule()
        retracted += [seq.req.request_id for seq in out.preempted]
        if retracted:
            break
        s.complete(out)
    assert retracted == [1]
    assert list(s.running) == [0] and not s.batch_is_full
    assert 100 + s.computed(a) - 100 + 120 + b.generated > 1200 - 1  # they did outgrow the pool
    expect = (s.generated(a) + RETRACT_DECODE_STEPS) / (600 + 1)
    assert s.new_token_ratio == pytest.approx(min(1.0, expect))
    assert list(s.waiting) == [c, b] and b.computed == 0 and b.generated > 0


def test_radix_cache_evicts_least_recently_used_unlocked_leaves_whole() -> None:
    c = RadixCache(1000)
    nodes = []
    for pid in range(3):  # three prompts of 100 tokens, each inserted then released
        node, dup = c.insert(c.root, 0, pid, 100, pid, 100)
        c.free -= 100
        assert dup == 0
        nodes.append(node)
    assert c.evictable == 300 and c.free == 700
    # prompt 0 matched to its last token but one: split there, the upper 99 touched, the 1-token
    # tail keeping its old access time, so the tail, prompt 1 and prompt 2 are the oldest leaves
    c.match(0, 100, 0, 99)
    assert c.evict(150) == 1 + 100 + 100  # whole leaves until 150 are freed
    assert c.match(0, 100, 0, 99)[1] == 99 and c.match(1, 100, 1, 99)[1] == 0 and c.match(2, 100, 2, 99)[1] == 0
    node, hit = c.match(0, 100, 0, 50)  # split at 50; the request locks the upper half
    c.lock(node)
    assert hit == 50 and c.evictable == 49
    assert c.evict(1000) == 49 and c.free == 950
    c.unlock(node)
    assert c.evict(1000) == 50 and c.free == 1000


def _workload(n_groups: int = 16, group: int = 8, seed: int = 0) -> list[Request]:
    """Groups sharing a prompt, heavy-tailed lengths (median 1,100 tokens, many at the 3,000 cap)."""
    rng = np.random.default_rng(seed)
    reqs = []
    for g in range(n_groups):
        prompt = int(rng.integers(100, 600))
        for k in range(group):
            target = int(min(3000, rng.lognormal(7.0, 1.0)))
            reqs.append(Request(g * group + k, g, k, 0, prompt, 3000, max(target, 1), 0, 0))
    return reqs


def _engine_run(exact: bool) -> tuple[list, SimEngine]:
    prof = dataclasses.replace(load_profile("h100-qwen2.5-7b-tp1"), kv_capacity_tokens=12000)
    prof = with_engine(prof, EngineConfig(rollout_engine="sglang"))
    eng = SimEngine(prof, 1, exact=exact)
    reqs = _workload()
    eng.submit(reqs[:96])
    events = list(eng.step(finishes=20))
    eng.abort([r.request_id for r in reqs[80:96]])  # an abort wave over part of the batch
    eng.submit(reqs[96:])
    while batch := eng.step():
        events += batch
    return events, eng


def test_event_jumps_equal_the_step_by_step_path_with_retractions_and_aborts() -> None:
    fast, eng = _engine_run(exact=False)
    exact, _ = _engine_run(exact=True)
    assert len(fast) == len(exact)
    for a, b in zip(fast, exact, strict=True):
        assert type(a) is type(b) and a.request_id == b.request_id and a.num_output_tokens == b.num_output_tokens
        assert a.time == pytest.approx(b.time, rel=1e-9)
    retracted = sum(isinstance(e, Preempted) for e in fast)
    assert retracted > 0 and eng.instances[0].sched.retractions == retracted  # the workload retracts
    assert sum(isinstance(e, Aborted) for e in fast) > 0  # and aborts
    finished = {e.request_id for e in fast if isinstance(e, Finished)}
    aborted = {e.request_id for e in fast if isinstance(e, Aborted)}
    assert finished | aborted == set(range(128))


def test_make_scheduler_gives_sglangs_for_sglang() -> None:
    """The compiled core's source (`SGLangRules`), which both engines run."""
    s = make_scheduler(EngineConfig(rollout_engine="sglang", max_num_seqs=8, max_num_batched_tokens=256), 1600)
    assert type(s) is SGLangRules
    assert (s.kv_capacity_tokens, s.max_running_requests, s.chunked_prefill_size) == (1600, 8, 256)


@pytest.mark.parametrize("setting", [{"block_size": 16}, {"async_scheduling": True}])
def test_vllm_only_settings_are_refused_under_sglang(setting: dict) -> None:
    prof = load_profile("h100-qwen2.5-7b-tp1")
    with pytest.raises(RlsimError, match="vLLM setting that SGLang does not have"):
        with_engine(prof, EngineConfig(rollout_engine="sglang", **setting))


def test_sglang_only_settings_are_refused_under_vllm() -> None:
    with pytest.raises(RlsimError, match="SGLang setting that vLLM does not have"):
        with_engine(load_profile("h100-qwen2.5-7b-tp1"), EngineConfig(schedule_policy="lpm"))


def test_a_flushed_radix_tree_is_freed_without_a_garbage_collection() -> None:
    """Parent and child links make a tree a reference cycle: a flush unlinks it, so reference
    counting frees it at once instead of a collection pausing over every node the run made."""
    c = RadixCache(100_000)
    for pid in range(200):  # 200 prompts, each with 5 requests' own outputs below it, splits included
        for rid in range(5):
            c.insert(c.root, 0, pid, 50, 1000 * pid + rid, 80)
            c.match(pid, 50, 1000 * pid + rid, 20 + rid)  # (nothing here holds a node past the reset)
    assert len(c._nodes) > 1000
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        c.reset()
        assert gc.collect() == 0  # no cycle was left for the collector
    finally:
        if was:
            gc.enable()
    assert c.free == 100_000 and not c.root.children


def test_lpm_takes_the_longest_cached_prefix_first_and_defers_a_groups_duplicates() -> None:
    """Prompt 7 is cached (a finished sample); of the waiting queue [8a, 8b, 7, 9], lpm puts 7
    (its prompt cached) first, then 8a and 9 (nothing cached, each the first of its prompt), and
    8b last: it shares 8a's prompt, which one prefill should cache first (in-batch prefix caching)."""
    s = SGLangScheduler(50000, max_running_requests=64, chunked_prefill_size=8192, overlap=False,
                        schedule_policy="lpm")  # fmt: skip
    s.add(_seq(0, 300, 1, prompt_id=7))
    s.complete(s.schedule())  # it finishes at its prefill: prompt 7 stays in the tree
    assert not s.running
    for rid, prompt in ((1, 8), (2, 8), (3, 7), (4, 9)):
        s.add(_seq(rid, 300, 20, prompt_id=prompt))
    s.max_running_requests = 1  # (admit one, to see the order)
    out = s.schedule()
    assert [q.req.request_id for q, _ in out.chunks] == [3] and out.prefill_tokens == 1
    assert [q.req.request_id for q in s.waiting] == [1, 4, 2]


def test_unknown_rollout_engine_is_refused() -> None:
    with pytest.raises(RlsimError, match="unknown rollout engine 'trtllm'"):
        EngineConfig(rollout_engine="trtllm")


def test_compare_shows_each_policy_under_both_engines() -> None:
    """`compare --rollout-engine vllm,sglang`: each policy's row under each engine, speedups
    against sync under the same engine; a speculating policy runs under vLLM's rules only."""
    import json

    from typer.testing import CliRunner

    from rlsim.cli.app import app

    args = ["compare", "--policies", "sync,rollpacker,rollpacker+histospec", "--prompts-per-step", "32",
            "--max-steps", "1", "--json", "--workers", "1"]  # fmt: skip
    res = CliRunner().invoke(app, [*args, "--rollout-engine", "vllm,sglang"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout[res.stdout.index("[") :])
    got = [(r["policy"], r["rollout_engine"]) for r in rows]
    assert got == [("sync", "vllm"), ("rollpacker", "vllm"), ("rollpacker+histospec", "vllm"),
                   ("sync", "sglang"), ("rollpacker", "sglang")]  # fmt: skip
    assert [r["speedup_vs_sync"] for r in rows if r["policy"] == "sync"] == [1.0, 1.0]
    assert all(r["scheduler"].startswith("SGLang 0.5.23") for r in rows if r["rollout_engine"] == "sglang")
    assert "left out under SGLang's rules" in res.stderr and "rollpacker+histospec" in res.stderr


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--rollout-engine", "trtllm"], "unknown rollout engine 'trtllm'"),
        (["--rollout-engine", "vllm,vllm"], "names an engine twice"),
        (["--rollout-engine", "sglang", "--block-size", "32"], "block_size is a vLLM setting"),
    ],
)
def test_bad_rollout_engine_is_one_line_and_exit_2(extra: list, says: str) -> None:
    from typer.testing import CliRunner

    from rlsim.cli.app import app

    res = CliRunner().invoke(app, ["compare", "--policies", "sync", "--max-steps", "1", *extra])
    assert res.exit_code == 2
    assert says in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("overlap", [False, True])
def test_running_offsets_sum_to_the_bit_as_sglang_sums_them(overlap: bool) -> None:
    """At every prefill pass of a workload that retracts and aborts, the vectorised offset
    (`RunningOffsets`) equals the one summed request by request in batch order, as a float, both
    compiled (`_sum_loop`, where numba is) and in numpy passes (the pure path)."""
    from rlsim.sim.running_offsets import _compiled_sum
    from rlsim.sim.sglang_parity import GRID, run_rlsim

    checked, lags = [], set()
    real = SGLangScheduler._touch_waiting_prefixes

    def check(self: SGLangScheduler) -> None:
        ratio, lag = self.new_token_ratio, self._lag_mode()
        fast = self._offsets.total(ratio, self.dsteps, lag, self.iters, 4096)
        assert fast == self.running_offset_reference(ratio)
        if self._offsets._slot:  # (`_sum_numpy` sums a batch of one request or more)
            assert self._offsets._sum_numpy(ratio, self.dsteps, lag, self.iters, 4096) == fast
        checked.append(fast)
        lags.add(lag)
        real(self)

    SGLangScheduler._touch_waiting_prefixes = check
    try:
        cfg = dataclasses.replace(GRID["retractions"], overlap=overlap, abort_at=3000)
        log = run_rlsim(cfg, fast=False)
    finally:
        SGLangScheduler._touch_waiting_prefixes = real
    assert sum(len(r["retracted"]) for r in log["iterations"]) > 0
    assert len(checked) > 50 and any(checked)
    assert lags == ({"decoding", "joined"} if overlap else {"none"})
    from rlsim.sim.compiled.jit import PURE

    assert (_compiled_sum() is None) == PURE  # the compiled sum ran where numba is


def test_a_sweep_grid_lists_both_rollout_engines(tmp_path) -> None:  # noqa: ANN001
    """`rollout_engine: [vllm, sglang]` in a sweep grid: one row per engine, each under its rules."""
    import pandas as pd
    import yaml
    from typer.testing import CliRunner

    from rlsim.cli.app import app

    fixed = {"num_prompts": 32, "trace_epochs": 1, "epochs": 1, "prompts_per_step": 16, "samples_per_prompt": 4,
             "gpus": 8, "policy": "sync"}  # fmt: skip
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"fixed": fixed, "grid": {"rollout_engine": ["vllm", "sglang"]}}))
    out = tmp_path / "sweep.parquet"
    res = CliRunner().invoke(app, ["sweep", str(grid), "--out", str(out), "--workers", "1"])
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(out)
    assert list(df["rollout_engine"]) == ["vllm", "sglang"]
    assert df["total_time_s"].iloc[0] != df["total_time_s"].iloc[1]


@pytest.mark.parametrize("exact", [False, True])
def test_a_weight_update_flushes_the_radix_cache_retracting_what_runs(exact: bool) -> None:
    """SGLang flushes its radix cache at a weight update (with nothing running: what runs is
    retracted first, as frameworks pause it). Idle: the cache empties. Mid-run: the running
    requests wait again, re-prefill prompt and output, and still finish with their full length.
    vLLM's rules keep their state."""
    prof = dataclasses.replace(load_profile("h100-qwen2.5-7b-tp1"), kv_capacity_tokens=60000)
    reqs = _workload(n_groups=4, group=4)
    eng = SimEngine(with_engine(prof, EngineConfig(rollout_engine="sglang")), 1, exact=exact)
    eng.submit(reqs[:8])
    while eng.step():
        pass
    cache = eng.instances[0].sched.cache
    assert cache.evictable > 0  # the finished groups' prompts and outputs are cached
    eng.weights_updated()
    assert cache.evictable == 0 and cache.free == cache.num_tokens and eng.wake_reprefill_tokens == 0
    eng.submit(reqs[8:])
    events = list(eng.step(finishes=2))  # mid-run: some finished, the rest running
    sched = eng.instances[0].sched
    assert any(not q.reported for q in sched.running.values())  # running, not yet finished
    eng.weights_updated()
    while batch := eng.step():
        events += batch
    assert eng.wake_reprefill_tokens > 0  # they were retracted and prefilled again
    finished = {e.request_id: e.num_output_tokens for e in events if isinstance(e, Finished)}
    assert finished == {r.request_id: r.target_tokens for r in reqs[8:]}
    vllm = SimEngine(prof, 1, exact=exact)
    vllm.submit(reqs[:8])
    while vllm.step():
        pass
    before = vllm.prefix_hit_tokens
    vllm.weights_updated()
    vllm.submit(reqs[:8])  # the same prompts again: still cached under vLLM's rules
    while vllm.step():
        pass
    assert vllm.prefix_hit_tokens > before


@pytest.mark.parametrize("exact", [False, True])
def test_parallel_sampling_prefills_each_groups_prompt_once(exact: bool) -> None:
    """--parallel-sampling: a launch's samples of one prompt are one request with n > 1; the
    prompt is prefilled alone first and every sample then matches all of it but its last token.
    The warm-up is the engine's own: no event names it, and every sample finishes as before."""
    prof = dataclasses.replace(load_profile("h100-qwen2.5-7b-tp1"), kv_capacity_tokens=200_000)
    reqs = _workload(n_groups=6, group=8)
    runs = {}
    for on in (False, True):
        eng = SimEngine(with_engine(prof, EngineConfig(rollout_engine="sglang", parallel_sampling=on)), 1, exact=exact)
        eng.submit(reqs)
        events = []
        while batch := eng.step():
            events += batch
        runs[on] = (eng, events)
    for _, events in runs.values():
        assert sorted(e.request_id for e in events) == [r.request_id for r in reqs]
        assert all(isinstance(e, Finished) for e in events)
        assert {e.request_id: e.num_output_tokens for e in events} == {r.request_id: r.target_tokens for r in reqs}
    sched = runs[True][0].instances[0].sched
    assert sched.warmups_run == 6
    # each sample hits its prompt but the last token; one request a sample hits nothing in its own pass
    assert sched.prefix_hit_tokens == sum(r.num_prompt_tokens - 1 for r in reqs)
    assert runs[False][0].instances[0].sched.prefix_hit_tokens < sched.prefix_hit_tokens / 2


def test_parallel_sampling_is_sglangs_and_needs_per_prompt_dispatch(small_trace_path, tmp_path) -> None:  # noqa: ANN001
    from typer.testing import CliRunner

    from rlsim.cli.app import app

    args = ["simulate", "--trace", str(small_trace_path), "--prompts-per-step", "8", "--samples-per-prompt", "4",
            "--max-steps", "1", "--parallel-sampling", "--out", str(tmp_path / "run")]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "parallel_sampling is an SGLang setting" in res.output
    res = CliRunner().invoke(app, [*args, "--rollout-engine", "sglang"])
    assert res.exit_code == 2 and "add --dispatch per_prompt" in res.output
    res = CliRunner().invoke(app, [*args, "--rollout-engine", "sglang", "--dispatch", "per_prompt"])
    assert res.exit_code == 0, res.output


# ---- SGLang on RL's own loop: the idle reset, aborts, the settings users run with --------------
def test_a_fully_idle_engine_resets_the_new_token_ratio_and_a_busy_one_does_not() -> None:
    s = SGLangScheduler(20_000, max_running_requests=64, chunked_prefill_size=8192, overlap=False)
    s.add(_seq(0, 50, 300))
    s.add(_seq(1, 50, 400))
    _run(s, 320)  # request 0 finished; request 1 decodes on
    assert s.running and s.new_token_ratio < INIT_NEW_TOKEN_RATIO
    s.on_idle()  # not idle: nothing resets
    assert s.new_token_ratio < INIT_NEW_TOKEN_RATIO
    _run(s, 200)
    assert not s.running and not s.waiting
    s.on_idle()
    assert s.new_token_ratio == INIT_NEW_TOKEN_RATIO


def test_the_engine_idling_between_steps_resets_sglangs_ratio() -> None:
    prof = with_engine(load_profile("h100-qwen2.5-7b-tp1"), EngineConfig(rollout_engine="sglang"))
    eng = SimEngine(prof, 1)
    eng.submit([_req(i, 100, 700) for i in range(4)])
    while eng.step():
        pass
    assert eng.instances[0].sched.new_token_ratio == INIT_NEW_TOKEN_RATIO  # (it had decayed over 700 steps)


def test_an_abort_mid_chunk_discards_the_chunk_computed_last() -> None:
    """Two samples of a 3,000-token prompt, chunks of 1,000: the first is aborted after two chunks;
    the first chunk was stashed in the tree, the second not yet, so its sibling hits 1,000 tokens."""
    s = SGLangScheduler(40_000, max_running_requests=64, chunked_prefill_size=1000, overlap=False)
    a, b = _seq(0, 3000, 50, prompt_id=7), _seq(1, 3000, 50, prompt_id=7)
    s.add(a)
    s.add(b)
    for _ in range(2):
        s.complete(s.schedule())
    assert s.chunked is a and a.computed == 2000
    s.abort(a)
    out = s.schedule()
    assert [(q.req.request_id, take) for q, take in out.chunks] == [(1, 1000)]
    assert b.computed == 1000  # the hit: the first chunk only
    assert s.cache.free == 40_000 - 2 * 1000  # the cached chunk (b holds it) and b's new one: the discarded one freed


def test_an_overlap_abort_after_prefills_decodes_twice_more() -> None:
    """Under the overlap loop a decoding request aborted while prefills run stays in the first decode
    batch and the one after it (its result is processed after that schedule); one aborted right after
    a decode step stays in the next one only."""
    for prefill_between, extra in ((True, 2), (False, 1)):
        s = SGLangScheduler(40_000, max_running_requests=64, chunked_prefill_size=8192, overlap=True)
        s.add(_seq(0, 50, 500))
        for _ in range(10):
            s.complete(s.schedule())
        if prefill_between:
            s.add(_seq(1, 50, 500))
            out = s.schedule()
            assert out.chunks
            s.complete(out)
        s.abort(s.running[0])
        runs = 0
        for _ in range(5):
            out = s.schedule()
            if out.num_decodes:
                runs += 0 in {q.req.request_id for q in s.running.values() if q.decoding}
            s.complete(out)
        assert runs == extra and 0 not in s.running


@pytest.mark.parametrize("compiled", [False, True])
def test_a_prompt_the_pool_cannot_hold_is_aborted_and_the_engine_goes_on(compiled: bool) -> None:
    """On SimEngine and on the compiled core alike."""
    prof = with_engine(dataclasses.replace(load_profile("h100-qwen2.5-7b-tp1"), kv_capacity_tokens=6000),
                       EngineConfig(rollout_engine="sglang"))  # fmt: skip
    if compiled:
        from rlsim.sim.compiled.sim_engine import CompiledEngine

        eng = CompiledEngine(prof, 1)
    else:
        eng = SimEngine(prof, 1)
    eng.submit([_req(0, 5995, 100), _req(1, 500, 100), _req(2, 3000, 4000, max_tokens=4000)])
    events = []
    while batch := eng.step():
        events += batch
    aborted = [e for e in events if type(e) is Aborted]
    assert [(e.request_id, e.reason, e.num_output_tokens) for e in aborted] == [(0, "prompt_too_long", 0)]
    finished = {e.request_id: e for e in events if type(e) is Finished}
    assert finished[1].num_output_tokens == 100 and finished[1].finish_reason == "stop"
    # its output clipped to what the pool holds beside its prompt: 6,000 - 1 - 3,000 - 1 tokens
    assert (finished[2].num_output_tokens, finished[2].finish_reason) == (2998, "length")


def test_conservativeness_and_sglangs_variables_set_the_ratio() -> None:
    eng = EngineConfig(rollout_engine="sglang", schedule_conservativeness=1.3,
                       sglang_env="SGLANG_INIT_NEW_TOKEN_RATIO=0.6,SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS=100")  # fmt: skip
    s = SGLangScheduler(20_000, max_running_requests=64, chunked_prefill_size=8192, settings=eng.sglang_settings())
    assert s.new_token_ratio == pytest.approx(0.78)
    s.add(_seq(0, 50, 300))
    _run(s, 150)
    assert s.new_token_ratio == pytest.approx(0.78 * 0.14)  # the floor, reached in 100 decode steps


@pytest.mark.parametrize(
    ("env", "says"),
    [("SGLANG_NOPE=1", "NAME=VALUE pairs"), ("SGLANG_RETRACT_DECODE_STEPS=x", "must be an integer"),
     ("SGLANG_RETRACT_DECODE_STEPS=0", "must be positive"), ("SGLANG_INIT_NEW_TOKEN_RATIO", "NAME=VALUE")],
)  # fmt: skip
def test_bad_sglang_settings_are_refused_in_one_sentence(env: str, says: str) -> None:
    with pytest.raises(RlsimError, match=says):
        EngineConfig(rollout_engine="sglang", sglang_env=env)
    with pytest.raises(RlsimError, match="SGLang setting that vLLM does not have"):
        with_engine(load_profile("h100-qwen2.5-7b-tp1"), EngineConfig(schedule_conservativeness=1.2))


@pytest.mark.parametrize(("gib", "chunk"), [(16, 2048), (48, 4096), (80, 8192), (141, 8192), (180, 16384)])
def test_sglangs_chunk_budget_follows_the_gpus_memory_where_the_run_leaves_it(gib: int, chunk: int) -> None:
    prof = load_profile("h100-qwen2.5-7b-tp1")
    prof = dataclasses.replace(prof, gpu_facts={**prof.gpu_facts, "memory_bytes": gib * 10**9})
    assert with_engine(prof, EngineConfig(rollout_engine="sglang")).engine.max_num_batched_tokens == chunk
    given = EngineConfig(rollout_engine="sglang", max_num_batched_tokens=4096)
    assert with_engine(prof, given).engine.max_num_batched_tokens == 4096
    assert with_engine(prof, EngineConfig()).engine.max_num_batched_tokens == prof.engine.max_num_batched_tokens


@pytest.mark.parametrize("policy", ["sync", "rollpacker", "one_step_off"])
def test_a_run_whose_prompts_the_pool_cannot_hold_goes_on_under_sglang(small_trace, policy: str) -> None:  # noqa: ANN001
    """Two prompts of 7,000 tokens against a 6,000-token pool: vLLM's rules refuse the run, SGLang's
    abort those samples (recorded with their reason, each policy told its sample ended) and go on."""
    from rlsim.config import ClusterConfig, RLConfig
    from rlsim.sim.simulate import simulate

    t = small_trace.table
    t.loc[t.prompt_id.isin(t.prompt_id.unique()[:2]), "num_prompt_tokens"] = 7000
    prof = dataclasses.replace(load_profile("h100-qwen2.5-7b-tp1"), kv_capacity_tokens=6000)
    cluster, rl = ClusterConfig(num_gpus=2), RLConfig(prompts_per_step=8, samples_per_prompt=4, max_response_len=2000)
    with pytest.raises(RlsimError, match="does not fit an instance's KV cache"):
        simulate(small_trace, policy, cluster, rl, profile=prof)
    res = simulate(small_trace, policy, cluster, rl, profile=prof, engine_cfg=EngineConfig(rollout_engine="sglang"))
    gone = res.requests[res.requests.finish_reason == "prompt_too_long"]
    assert len(gone) == res.summary["engine_aborts"]["prompt_too_long"] > 0
    assert set(gone.outcome) == {"aborted"} and (gone.num_prompt_tokens == 7000).all()
    assert res.summary["num_steps"] == 10


def test_sleep_after_an_overlap_abort_leaves_no_request_counted_as_decoding() -> None:
    """An aborted request still running its last decode steps when the engine sleeps leaves with the
    rest: nothing is counted as decoding afterwards (a count left behind made every later decode
    step take slots for requests that were gone)."""
    s = SGLangScheduler(40_000, max_running_requests=64, chunked_prefill_size=8192, overlap=True)
    for i in range(3):
        s.add(_seq(i, 50, 500))
    for _ in range(10):
        s.complete(s.schedule())
    s.add(_seq(3, 50, 500))
    s.complete(s.schedule())  # a prefill: request 0's abort now waits for its next decode step
    s.abort(s.running[0])
    carried = s.free_all()
    assert {q.req.request_id for q in carried} == {1, 2, 3}
    assert s.num_decoding == 0 and s.rate_sum == 0 and not s.running
    _run(s, 2000)
    assert s.cache.free + s.cache.evictable == 40_000


def test_pages_are_matched_held_and_reserved_whole() -> None:
    """Pages of 16 tokens: a sample of a cached 100-token prompt hits 96 tokens (whole pages of all but
    its last token) and prefills 4; each request holds whole pages; admission reserves a page each."""
    s = SGLangScheduler(4000, max_running_requests=64, chunked_prefill_size=8192, overlap=False, page_size=16)
    a, b = _seq(0, 100, 40, prompt_id=3), _seq(1, 100, 40, prompt_id=3)
    s.add(a)
    out = s.schedule()
    assert s.cache.free == 4000 - 112  # 100 tokens: 7 pages
    s.complete(out)
    assert s.cache.free == 4000 - 112  # (the 96 tokens of whole pages now in the tree, locked by a)
    s.add(b)
    out = s.schedule()
    assert [(q.req.request_id, take) for q, take in out.chunks] == [(1, 4)] and b.computed == 96
    assert s.cache.free == 4000 - 112 - 16  # b's own last page
    s.complete(out)
    for _ in range(12):  # each computes positions 100..111, in its 7th page
        s.complete(s.schedule())
    assert s.cache.free == 4000 - 112 - 16
    s.complete(s.schedule())  # position 112 starts an 8th page for each
    assert s.cache.free == 4000 - 112 - 16 - 2 * 16


@pytest.mark.parametrize("page", [16, 64])
def test_paged_jumps_equal_the_step_by_step_path(page: int) -> None:
    from rlsim.sim.sglang_parity import GRID, first_difference, run_rlsim

    for name in ("retractions", "parallel sampling", "abort wave"):
        for overlap in (False, True):
            cfg = dataclasses.replace(GRID[name], page_size=page, overlap=overlap)
            assert first_difference(run_rlsim(cfg), run_rlsim(cfg, fast=False)) is None, (name, overlap)


def test_page_size_is_sglangs_and_reaches_its_scheduler() -> None:
    prof = load_profile("h100-qwen2.5-7b-tp1")
    eng = with_engine(prof, EngineConfig(rollout_engine="sglang", page_size=64)).engine
    assert make_scheduler(eng, 10_000).page == 64 and make_scheduler(eng, 10_000).kv_capacity_tokens == 9984
    with pytest.raises(RlsimError, match="SGLang setting that vLLM does not have"):
        with_engine(prof, EngineConfig(page_size=64))


def test_an_overlap_retraction_of_a_request_ended_in_flight_reprefills_it_and_reports_it_once() -> None:
    """Under the overlap loop a request whose end-of-sequence token is in flight can be retracted by
    the next schedule (SGLang drops that token with it); it re-prefills, ends again, and leaves,
    reported once. (It used to be requeued and then decode forever, its end already reported.)"""
    s = SGLangScheduler(4200, max_running_requests=64, chunked_prefill_size=8192, overlap=True)
    a, b = _seq(0, 60, 5), _seq(1, 50, 2000)  # (among equal outputs the longer prompt goes first)
    s.add(a)
    s.add(b)
    reported = []
    reported += s.complete(s.schedule())
    while not reported:
        reported += s.complete(s.schedule())
    assert reported == [a] and a.reported and a in s.finishing
    held = s.cache.free - 1
    s.cache.alloc(held)  # the pool all but full: the next decode step retracts
    out = s.schedule()
    assert out.preempted == [a] and list(s.waiting) == [a]
    s.cache.free += held
    again = []
    for _ in range(50):
        again += s.complete(s.schedule())
    assert again == [] and 0 not in s.running and not s.waiting  # re-prefilled, ended, gone, not reported again


def test_an_abort_whose_finish_step_is_unchanged_ends_the_request_once() -> None:
    """Without the overlap loop, a request aborted one step before its own last one is pushed again
    on the same finish step: it ends once (it was freed twice, a KeyError, before)."""
    s = SGLangScheduler(40_000, max_running_requests=64, chunked_prefill_size=8192, overlap=False)
    seq = _seq(0, 50, 3)
    s.add(seq)
    s.complete(s.schedule())  # its prefill: the first token
    s.complete(s.schedule())  # one decode step: its last is the next
    assert seq.finish_iter == s.dsteps + 1
    s.abort(seq)
    assert seq.finish_iter == s.dsteps + 1 and len(s.heap) == 2  # the same finish, pushed twice
    assert s.complete(s.schedule()) == []  # ended (unreported: the engine reported it when it aborted it)
    assert not s.running and s.cache.free + s.cache.evictable == 40_000
