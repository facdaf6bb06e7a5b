"""rlsim's SGLang rules against SGLang's own `Scheduler`, iteration by iteration (the CI subset of
`rlsim.sim.sglang_parity.GRID`, and a few rows more among the checks too long for CI, `.ci/long`;
`benchmarks/sglang_parity.py` runs the whole grid).

SGLang runs in its own environment (`.ci/sglang-env`), named by `RLSIM_SGLANG_PYTHON`; without it
the test skips, unless `RLSIM_REQUIRE_SGLANG=1` (`.ci/run`), where a skip fails. Each case asserts
that its workload exercises what it claims (retractions, aborts, EOS stops) before it compares.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest

from rlsim.config import SGLangSettings
from rlsim.sim import sglang_parity as sp
from rlsim.sim.sglang_parity import GRID, WARMUP, abort_rids, counts, first_difference, run_rlsim, run_sglang

REQUIRED = os.environ.get("RLSIM_REQUIRE_SGLANG") == "1"
if not os.environ.get("RLSIM_SGLANG_PYTHON") and not REQUIRED:
    pytest.skip("SGLang's environment is not built (.ci/sglang-env; set RLSIM_SGLANG_PYTHON)", allow_module_level=True)


@pytest.fixture(scope="module")
def driver() -> Iterator[sp.SGLangDriver]:
    """SGLang's driver, serving this worker's rows: its imports once, each row's `Scheduler` forked."""
    with sp.SGLangDriver() as d:
        yield d


ROWS = [*sp.CI_GRID, *(pytest.param(*row, marks=pytest.mark.long) for row in sp.LONG_GRID)]


IDS = [f"{n}-{'overlap' if o else 'normal'}" for n, o in (*sp.CI_GRID, *sp.LONG_GRID)]


@pytest.mark.parametrize(("name", "overlap"), ROWS, ids=IDS)
def test_each_iteration_and_finish_equals_sglangs(name: str, overlap: bool, driver: sp.SGLangDriver) -> None:
    cfg = dataclasses.replace(GRID[name], overlap=overlap)
    ours = run_rlsim(cfg)
    assert first_difference(ours, run_rlsim(cfg, fast=False)) is None  # the jumps equal the steps
    assert first_difference(ours, run_rlsim(cfg, compiled=True)) is None  # the compiled rules, as `simulate` runs
    theirs = run_sglang(cfg, driver=driver)
    got = counts(theirs)
    assert got["finished"] > 0 and got["prefills"] > 1
    if name == "retractions":
        assert got["retractions"] > 0
    if cfg.abort_at is not None:
        assert got["finished"] < cfg.num_prompts * cfg.samples_per_prompt  # the wave took some
    if cfg.parallel_sample:  # every group's prompt prefilled alone first, most samples then extending its last page
        extends = [e for r in theirs["iterations"] for e in r.get("extend", [])]
        assert len({rid for rid, _ in extends if rid >= WARMUP}) == cfg.num_prompts
        ones = sum(take <= cfg.page_size for rid, take in extends if rid < WARMUP)  # (a page's tail at most)
        assert ones > cfg.num_prompts * cfg.samples_per_prompt // 2, ones  # (the rest: evicted before admission)
    if cfg.drain:  # a later wave's first prefill read the initial ratio again, after decodes had lowered it
        _assert_idle_reset(cfg, theirs)
    if name == "abort mid-chunk":  # an aborted request was cut mid-prompt and never extended again
        _assert_aborted_mid_chunk(cfg, theirs)
    if cfg.sglang_env:  # the settings reached SGLang: its first admission read their initial ratio
        settings = SGLangSettings.parse(cfg.sglang_env, cfg.schedule_conservativeness)
        assert theirs["iterations"][0]["ratio"] == settings.init_ratio != SGLangSettings().init_ratio
    if name == "cannot fit":  # prompts the pool cannot hold (aborted, one token prefilled), outputs clipped
        kv = cfg.kv_tokens
        refused = {w.request_id for w in cfg.work() if w.prompt_tokens >= kv - 1 - 5}
        assert refused and not refused & set(map(int, theirs["finish"]))
        assert all(take == 1 for r in theirs["iterations"] for rid, take in r.get("extend", []) if rid in refused)
        assert any(w.prompt_tokens + w.output_tokens > kv - 2 for w in cfg.work() if w.request_id not in refused)
        assert got["finished"] == cfg.num_prompts * cfg.samples_per_prompt - len(refused)
    if cfg.page_size > 1:  # a cached prompt was hit in whole pages, short of its tokens but the last
        plen = {w.request_id: w.prompt_tokens for w in cfg.work()}
        hits = [plen[rid] - take for r in theirs["iterations"] for rid, take in r.get("extend", []) if rid in plen]
        assert any(h > 0 and h % cfg.page_size == 0 for h in hits)
        assert any(take > 1 and take < cfg.page_size for r in theirs["iterations"] for rid, take in r.get("extend", [])
                   if rid in plen and plen[rid] % cfg.page_size)  # fmt: skip
    if name == "abort during prefills":  # the wave came while a prefill batch ran
        assert any("extend" in r for r in theirs["iterations"] if cfg.abort_at - 2 <= r["at"] <= cfg.abort_at)
    assert first_difference(ours, theirs) is None
    assert counts(ours) == got


def _assert_idle_reset(cfg, log: dict) -> None:  # noqa: ANN001 - a SGLangParityConfig
    first = {w.request_id for w in cfg.work() if w.arrive == 0}
    rows = [r for r in log["iterations"] if "extend" in r]
    later = [r for r in rows if any(rid not in first and rid < WARMUP for rid, _ in r["extend"])]
    assert later and min(r["ratio"] for r in rows) < rows[0]["ratio"]
    assert later[0]["ratio"] == rows[0]["ratio"], later[0]


def _assert_aborted_mid_chunk(cfg, log: dict) -> None:  # noqa: ANN001 - a SGLangParityConfig
    plen = {w.request_id: w.prompt_tokens for w in cfg.work()}
    gone = set(abort_rids(cfg))
    cut = {rid for r in log["iterations"] if r["at"] < cfg.abort_at for rid, take in r.get("extend", [])
           if rid in gone and take < plen[rid]}  # fmt: skip
    assert cut
    assert not any(rid in cut for r in log["iterations"] if r["at"] > cfg.abort_at for rid, _ in r.get("extend", []))


def test_the_chunk_budget_by_gpu_memory_is_sglangs() -> None:
    """Where a run leaves the chunk budget unset (veRL passes SGLang none), rlsim sizes it by the
    GPU's memory as SGLang's own server arguments resolve it, for every GPU rlsim knows and at each
    of SGLang's thresholds."""
    from rlsim.config import sglang_chunked_prefill_size
    from rlsim.derive.gpus import load_gpu
    from rlsim.sim.sglang_parity import sglang_chunk_sizes

    gpus = ("h100", "h200", "h800", "h20", "a100-40gb", "a100", "l40s", "b200", "gb200", "mi300x")
    mib = sorted({load_gpu(g).memory_bytes / 2**20 for g in gpus} | {20 * 1024 - 1, 20 * 1024, 160 * 1024})
    theirs = sglang_chunk_sizes(mib)
    assert len(set(theirs.values())) == 4  # (2,048, 4,096, 8,192 and 16,384 all reached)
    assert {m: sglang_chunked_prefill_size(m * 2**20) for m in mib} == theirs
