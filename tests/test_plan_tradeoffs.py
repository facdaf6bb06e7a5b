"""The planner rediscovers known trade-offs from the model alone: each test sweeps one parameter
through the planner's own estimate (`rlsim.plan.planner.estimate`: 4 simulated steps of the bundled trace,
DAPO's batch, Qwen2.5-32B on 32 H100s) and asserts a direction across the sweep, not one point.

Figures measured on this release (epoch hours; the docstrings give each test's own)."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

import pytest

from rlsim.config import RLConfig
from rlsim.paths import default_trace
from rlsim.plan.planner import estimate
from rlsim.plan.space import Candidate

RL = {k: v for k, v in asdict(RLConfig()).items() if k not in ("epochs", "max_steps", "seed")}  # DAPO's batch
STEPS = 4
CAPS = (4096, 8192, 20480)


def _run(cands: list[Candidate]) -> list[dict]:
    with ProcessPoolExecutor(max_workers=2) as ex:
        futs = [ex.submit(estimate, str(default_trace()), asdict(c), RL, STEPS, 0) for c in cands]
        rows = [f.result() for f in futs]
    assert not any(r["error"] for r in rows), rows
    return rows


def _c(policy: str, cap: int, train: int = 0, tp: int = 4, util: float | None = None) -> Candidate:
    place = "disaggregated" if train else "colocated"
    return Candidate(policy, 32, place, train, tp, f"h100-qwen2.5-32b-tp{tp}", None, util, cap)


@pytest.fixture(scope="module")
def placements() -> dict[tuple[str, int], dict[str, float]]:
    """Per (policy, cap): colocated epoch hours, the best disaggregated split's (8 or 16 of the 32
    GPUs training), and the colocated rollout share."""
    cands = [_c(p, cap, t) for p in ("one_step_off", "sync") for cap in CAPS for t in (0, 8, 16)]
    rows = iter(_run(cands))
    out = {}
    for p in ("one_step_off", "sync"):
        for cap in CAPS:
            col, d8, d16 = next(rows), next(rows), next(rows)
            best = min(d8["epoch_hours"], d16["epoch_hours"])
            share = col["rollout_share"]
            out[(p, cap)] = {"colocated": col["epoch_hours"], "disaggregated": best, "rollout_share": share}
    return out


def test_disaggregation_pays_more_for_one_step_off_as_the_rollout_share_grows(placements) -> None:  # noqa: ANN001
    """One-step-off overlaps step k's training with step k+1's rollout only when they run on
    different GPUs. Raising the response cap 4k -> 8k -> 20k raises the colocated rollout share
    0.36 -> 0.47 -> 0.55, and the advantage of the best disaggregated split (colocated epoch /
    disaggregated epoch) 0.80 -> 0.96 -> 1.18: a loss while training dominates, a gain once
    rollout does."""
    share = [placements[("one_step_off", c)]["rollout_share"] for c in CAPS]
    osf = [placements[("one_step_off", c)] for c in CAPS]
    adv = [p["colocated"] / p["disaggregated"] for p in osf]
    assert share == sorted(share) and adv == sorted(adv), (share, adv)
    assert adv[0] < 1 < adv[-1], adv


def test_sync_prefers_colocated_across_the_sweep(placements) -> None:  # noqa: ANN001
    """Sync never overlaps rollout and training, so a training pool is GPUs idle during rollout:
    colocated beats the best disaggregated split at every cap (colocated / disaggregated epoch
    0.56, 0.61, 0.66)."""
    for cap in CAPS:
        p = placements[("sync", cap)]
        assert p["colocated"] < p["disaggregated"], (cap, p)


def test_larger_rollout_tp_gains_more_as_kv_gets_tighter_or_the_tail_longer() -> None:
    """TP 4 over TP 2 (same 32 GPUs: 8 instances against 16) gives each instance twice the KV
    room. Sync epoch TP 2 / TP 4, as gpu_memory_utilization falls 0.9 -> 0.7 -> 0.5 (TP 2
    preemptions 0 -> 829 -> 56,810 in 4 steps): 1.162 -> 1.163 -> 1.244; as the cap grows 4k -> 8k
    -> 20k at 0.9: 1.058 -> 1.111 -> 1.162."""
    utils = (0.9, 0.7, 0.5)
    rows = _run([_c("sync", 20480, tp=tp, util=u) for u in utils for tp in (2, 4)]
                + [_c("sync", cap, tp=tp, util=0.9) for cap in CAPS for tp in (2, 4)])  # fmt: skip
    by_util, by_cap = rows[:6], rows[6:]
    gain_kv = [by_util[2 * i]["epoch_hours"] / by_util[2 * i + 1]["epoch_hours"] for i in range(3)]
    pre = [by_util[2 * i]["preemptions"] for i in range(3)]
    assert pre == sorted(pre) and pre[0] < pre[-1] and pre[-1] > 0, pre  # the sweep does tighten KV
    assert gain_kv == sorted(gain_kv) and gain_kv[-1] > gain_kv[0], gain_kv
    gain_tail = [by_cap[2 * i]["epoch_hours"] / by_cap[2 * i + 1]["epoch_hours"] for i in range(3)]
    assert gain_tail == sorted(gain_tail) and gain_tail[-1] > gain_tail[0], gain_tail
