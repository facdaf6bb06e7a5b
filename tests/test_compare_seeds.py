"""`rlsim compare --seeds N`: every time with its spread over data-order seeds, and a policy whose
rank changes between seeds marked as a tie rather than a winner (rlsim.sim.compare.aggregate)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsim.cli.app import app
from rlsim.sim.compare import aggregate

runner = CliRunner()


def _row(policy: str, total: float, speedup: float | None) -> dict:
    return {"policy": policy, "total_time_s": total, "epoch_time_s": {0: total}, "speedup_vs_sync": speedup}


def test_a_rank_that_changes_between_seeds_is_a_tie() -> None:
    """b beats c under one seed and loses under the other: both tie for 2-3; a is first under both."""
    runs = [
        [_row("a", 8.0, 1.25), _row("b", 10.0, 1.0), _row("c", 12.0, 0.83)],
        [_row("a", 9.0, 1.22), _row("b", 11.0, 1.0), _row("c", 10.5, 1.05)],
    ]
    rows = {r["policy"]: r for r in aggregate(runs, [0, 1])}
    assert rows["a"]["rank_by_seed"] == [1, 1] and not rows["a"]["tie"]
    assert rows["b"]["rank_by_seed"] == [2, 3] and rows["b"]["tie"]
    assert rows["c"]["rank_by_seed"] == [3, 2] and rows["c"]["tie"]
    assert rows["c"]["total_time_s"] == pytest.approx(11.25) and rows["c"]["total_time_s_range"] == (10.5, 12.0)
    assert rows["c"]["epoch_time_s_range"] == {0: (10.5, 12.0)}
    assert rows["a"]["speedup_vs_sync_range"] == (1.22, 1.25) and rows["a"]["seeds"] == [0, 1]


def test_compare_over_seeds_prints_spreads_and_ranks(small_trace_path: Path) -> None:
    base = ["compare", "--trace", str(small_trace_path), "--policies", "sync,rollpacker", "--gpus", "4",
            "--profile", "h100-qwen2.5-7b-tp1", "--workers", "1", "--prompts-per-step", "4"]  # fmt: skip
    res = runner.invoke(app, [*base, "--seeds", "3", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    for r in rows:
        assert min(r["total_time_s_by_seed"]) == r["total_time_s_range"][0] <= r["total_time_s"]
        assert r["total_time_s"] <= r["total_time_s_range"][1] == max(r["total_time_s_by_seed"])
        assert r["seeds"] == [0, 1, 2] and len(r["rank_by_seed"]) == 3
    assert len(set(rows[0]["total_time_s_by_seed"])) > 1  # the seeds hand the prompts out in other orders
    single = json.loads(runner.invoke(app, [*base, "--json"]).stdout)  # --seed 0 alone: the first of the three
    assert [r["total_time_s"] for r in single] == [r["total_time_s_by_seed"][0] for r in rows]
    table = runner.invoke(app, [*base, "--seeds", "2"]).output
    assert "±" in table and "#1" in table and "data-order seeds [0, 1]" in table.replace("\n", " ")
    bad = runner.invoke(app, [*base, "--seeds", "0"])
    assert bad.exit_code == 2
