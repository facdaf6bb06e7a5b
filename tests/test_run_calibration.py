"""`rlsim run --real --calibrate`'s grid, fit and drift (`rlsim.real.run_calibration`), without vLLM.

The passes themselves run on real engines in tests/test_real_run.py; here the cells, the fit of
a known iteration model, the engines' own limits and the drift between passes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlsim.calibration.grid import GRIDS, cell_lengths
from rlsim.errors import RlsimError
from rlsim.profile import load_profile
from rlsim.real.run_calibration import (
    cell_requests,
    check_grid_fits,
    fit_profile,
    grid_cells,
    pass_drift,
    pending_cells,
)

FACTS = {
    "model": "/models/tiny-llama", "hardware": "CPU x86_64 x2", "tensor_parallel_size": 1, "kv_capacity_tokens": 65_520,
    "block_size": 16, "max_num_seqs": 256, "max_num_batched_tokens": 8192, "max_model_len": 4096, "vocab_size": 512,
}  # fmt: skip
TRUE = {"t_w_s": 2e-3, "beta_s": 4e-7, "gamma_s": 1.5e-4, "prefill_s_per_token": 2e-6}


def test_each_pass_measures_every_cell_once_in_its_own_seeded_order() -> None:
    b, p, _ = GRIDS["small"]
    before, after = grid_cells("small", 0, 0), grid_cells("small", 0, 1)
    assert sorted(before) == sorted(after) == sorted((x, y) for x in b for y in p)
    assert before != after and before == grid_cells("small", 0, 0)
    reqs = cell_requests("small", 8, 256, 512, np.random.default_rng(0), "t")
    plens, outs = cell_lengths(8, 256, GRIDS["small"][2])
    assert [len(r["prompt_token_ids"]) for r in reqs] == plens
    assert [r["max_tokens"] for r in reqs] == [r["min_tokens"] for r in reqs] == outs
    assert all(r["ignore_eos"] for r in reqs) and len({r["request_id"] for r in reqs}) == 8


def test_a_grid_the_engine_cannot_hold_is_refused_naming_the_option() -> None:
    check_grid_fits("small", [FACTS])
    with pytest.raises(RlsimError, match="--calibrate small: batch size 48 exceeds the engine's max_num_seqs 16"):
        check_grid_fits("small", [FACTS, FACTS | {"max_num_seqs": 16}])


def _rows(which: str, slower: float, rng: np.random.Generator, first_cell: int) -> pd.DataFrame:
    """Iterations of every cell with times from TRUE (times `slower`) and 2% noise."""
    rows = []
    for k, (b, p) in enumerate(grid_cells("small", 0, 0 if which == "before" else 1)):
        plens, outs = cell_lengths(b, p, GRIDS["small"][2])
        gen = np.zeros(b, int)
        first = True
        while (gen < outs).any():
            live = gen < outs
            ctx = int(sum(pl + g for pl, g, lv in zip(plens, gen, live, strict=True) if lv and g > 0))
            pre = int(sum(pl for pl, g in zip(plens, gen, strict=True) if g == 0)) if first else 0
            n_dec = int((live & (gen > 0)).sum())
            t = TRUE["t_w_s"] + TRUE["beta_s"] * (ctx + pre) + TRUE["gamma_s"] * n_dec
            t += TRUE["prefill_s_per_token"] * pre
            rows.append({"phase": "grid", "step_s": t * slower * (1 + 0.02 * rng.standard_normal()),
                         "num_generation_requests": n_dec, "num_ctx_requests": b if first else 0,
                         "context_tokens": ctx, "num_ctx_tokens": pre, "num_generation_tokens": n_dec,
                         "cell": first_cell + k, "cell_batch": b, "cell_prompt_len": p, "instance": 0,
                         "pass": which})  # fmt: skip
            gen = np.where(live, gen + 1, gen)
            first = False
    return pd.DataFrame(rows)


def test_the_fit_recovers_the_model_and_takes_the_engines_limits() -> None:
    rng = np.random.default_rng(1)
    before = _rows("before", 1.0, rng, 0)
    during = _rows("during", 1.10, rng, 18)
    both = pd.concat([before, during], ignore_index=True)
    base = load_profile("h100-qwen2.5-7b-tp1")
    facts = [FACTS, FACTS | {"kv_capacity_tokens": 50_000}]
    prof = fit_profile(base, before, facts, "small", {"host/others_cpus": 0.1})
    for k in ("t_w_s", "gamma_s"):
        assert getattr(prof, k) == pytest.approx(TRUE[k], rel=0.1), k
    assert prof.kv_capacity_tokens == 50_000 and prof.engine.max_num_seqs == 256 and prof.engine.block_size == 16
    assert prof.name == "run-calibrated-tiny-llama-tp1" and prof.hardware == FACTS["hardware"]
    assert prof.train == base.train and prof.model_facts == {}  # another model's facts cost nothing here
    assert prof.provenance["passes"] == ["before"] and "drift_pct" not in prof.provenance
    assert prof.fit_error["heldout_mape"] < 0.05 and prof.fit_error["grid_repeat_noise"] is None
    assert pass_drift(before) is None and pass_drift(both) == pytest.approx(0.10, abs=0.01)
    window = fit_profile(base, during, facts, "small", None, both)
    assert window.provenance["passes"] == ["during"] and window.provenance["drift_pct"] == pytest.approx(10, abs=1)
    assert window.gamma_s == pytest.approx(1.10 * TRUE["gamma_s"], rel=0.05)  # the speed of the run's window
    assert window.fit_error["grid_repeat_noise"] > 0.05  # the passes differ by more than their 2% noise


def test_the_second_pass_resumes_where_it_stopped() -> None:
    rows = _rows("during", 1.0, np.random.default_rng(2), 18)
    assert pending_cells(None, "small", 1) == list(range(18))
    first = rows[rows["cell"] < 18 + 5]
    assert pending_cells(first, "small", 1) == list(range(5, 18))
    assert pending_cells(rows, "small", 1) == []
