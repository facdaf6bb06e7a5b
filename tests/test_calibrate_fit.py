"""The profile fit on iterations generated from known coefficients (no vLLM needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from rlsim.calibration.fit import COEFFS, acceptance_prob, fit_iterations, load_records
from rlsim.cli.app import app
from rlsim.errors import RlsimError

TRUE = {"t_w_s": 2e-3, "alpha_s": 5e-5, "beta_s": 4e-8, "gamma_s": 2e-5, "prefill_s_per_token": 3e-5,
        "prefill_request_s": 4e-4}  # fmt: skip


def _iterations(n: int, spec: bool, noise: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    b = rng.integers(1, 128, n)
    drafts = rng.integers(0, 8, n) * b if spec else np.zeros(n, dtype=int)
    pre_req = (rng.random(n) < 0.1) * rng.integers(1, 9, n)
    pre_tok = pre_req * rng.integers(16, 2048, n)
    ctx = b * rng.integers(32, 4096, n)
    t = TRUE["t_w_s"] + TRUE["alpha_s"] * (b + pre_req) + TRUE["beta_s"] * (ctx + pre_tok)
    t = t + TRUE["gamma_s"] * (b + drafts) + TRUE["prefill_s_per_token"] * pre_tok
    t = t + TRUE["prefill_request_s"] * pre_req
    return pd.DataFrame(
        {
            "phase": "spec" if spec else "grid",
            "method": "histospec" if spec else None,
            "visit": 2,
            "step_s": t * rng.lognormal(0.0, noise, n),
            "context_tokens": ctx,
            "num_ctx_requests": pre_req,
            "num_ctx_tokens": pre_tok,
            "num_generation_requests": b,
            "num_generation_tokens": b + drafts,
        }
    )


def test_fit_recovers_known_coefficients_with_spec_rows() -> None:
    """With verify steps (N_dec > B) all six coefficients come back within 5%, the per-request
    term apart from the tokens those requests prefill."""
    df = pd.concat([_iterations(3000, False, 0.01), _iterations(3000, True, 0.01, seed=1)], ignore_index=True)
    fit = fit_iterations(df)
    assert fit.alpha_identified
    for k in COEFFS:
        assert fit.coeffs[k] == pytest.approx(TRUE[k], rel=0.05), k
    assert fit.mape < 0.02


def test_without_spec_rows_alpha_folds_into_gamma() -> None:
    """Decode-only data cannot tell alpha from gamma: alpha is 0 and gamma takes their sum."""
    fit = fit_iterations(_iterations(3000, False, 0.01))
    assert not fit.alpha_identified and fit.coeffs["alpha_s"] == 0.0
    assert fit.coeffs["gamma_s"] == pytest.approx(TRUE["alpha_s"] + TRUE["gamma_s"], rel=0.05)
    assert any("alpha" in n for n in fit.notes)


def test_noisy_iterations_raise_the_heldout_mape() -> None:
    """The held-out MAPE measures noise the model cannot explain."""
    quiet = fit_iterations(_iterations(2000, False, 0.01)).mape
    loud = fit_iterations(_iterations(2000, False, 0.4)).mape
    assert quiet < 0.02 < 0.2 < loud


def test_summed_time_by_batch_sees_a_missing_term_through_noise() -> None:
    """Decode iterations under 10% per-iteration noise: each batch bucket's held-out summed time
    is within 2% of its prediction (a sum of hundreds averages the noise out). A cost the model
    lacks (3 ms more per iteration over 64 sequences) raises the MAPE by 1.5 points only, but
    moves bucket sums by 10% (the fit bends its terms toward those iterations)."""
    df = _iterations(4000, False, 0.1)
    df = df[df["num_ctx_requests"] == 0].reset_index(drop=True)
    fit = fit_iterations(df)
    assert len(fit.total_error_by_batch) == 5 and max(abs(v) for v in fit.total_error_by_batch.values()) < 0.02
    df.loc[df["num_generation_requests"] > 64, "step_s"] += 3e-3
    lacking = fit_iterations(df)
    assert lacking.mape - fit.mape < 0.02
    assert max(abs(v) for v in lacking.total_error_by_batch.values()) > 0.075


def test_acceptance_prob_from_per_position_counters() -> None:
    """A geometric chain with p = 0.8 gives back 0.8 from vLLM-style per-position counts."""
    p, drafts, k = 0.8, 10_000, 8
    counts = [[round(drafts * p ** (i + 1)), drafts] for i in range(k)]
    assert acceptance_prob({"per_pos_counts": counts}) == pytest.approx(0.8, abs=1e-3)
    assert acceptance_prob({"per_pos_counts": []}) is None


def _records(tmp: Path, model: str = "m") -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    facts = {"model": model, "hardware": "test", "tensor_parallel_size": 1, "kv_capacity_tokens": 900,
             "num_gpu_blocks": 10, "block_size": 100, "max_num_seqs": 8, "max_num_batched_tokens": 512}  # fmt: skip
    (tmp / "facts.json").write_text(json.dumps(facts))
    _iterations(400, False, 0.3).to_parquet(tmp / "iterations.parquet")
    train = {"model": model, "flops_per_token": 6.0, "achieved_flops_per_device": 1e9, "fixed_s": 0.1,
             "weight_sync_s": 0.01, "seconds_per_token": 6e-9, "hardware": "test"}  # fmt: skip
    (tmp / "train.json").write_text(json.dumps(train))
    return tmp


def test_records_from_another_model_are_refused(tmp_path: Path) -> None:
    """train.json measured on another model than facts.json: one sentence, exit code 2."""
    rec = _records(tmp_path / "r")
    train = json.loads((rec / "train.json").read_text())
    (rec / "train.json").write_text(json.dumps(train | {"model": "other"}))
    with pytest.raises(RlsimError, match="records from another model"):
        load_records(rec)
    result = CliRunner().invoke(app, ["calibrate", "fit", str(rec), "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "another model" in result.stderr and "Traceback" not in result.output


def test_fit_refuses_a_noisy_profile_unless_forced(tmp_path: Path) -> None:
    """Held-out MAPE above --max-mape: no file, exit 2; --force writes it, with its error inside."""
    rec = _records(tmp_path / "r")
    out = tmp_path / "p.json"
    runner = CliRunner()
    refused = runner.invoke(app, ["calibrate", "fit", str(rec), "-o", str(out), "--max-mape", "0.05"])
    assert refused.exit_code == 2 and "exceeds --max-mape" in refused.stderr and not out.exists()
    forced = runner.invoke(app, ["calibrate", "fit", str(rec), "-o", str(out), "--max-mape", "0.05", "--force"])
    assert forced.exit_code == 0, forced.output
    prof = json.loads(out.read_text())
    assert prof["fit_error"]["heldout_mape"] > 0.05
    assert prof["kv_capacity_tokens"] == 900 and prof["block_size"] == 100
    assert prof["provenance"]["kind"] == "calibrated"


def test_fit_of_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["calibrate", "fit", str(tmp_path / "nope"), "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and result.stderr.strip().startswith("error: ") and "Traceback" not in result.output


def test_histospec_proposer_drafts_the_previous_visit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The vLLM proposer, driven as vLLM drives it: no history, no drafts; with history, the
    previous response is drafted and the draft length doubles while every token is accepted."""
    from types import SimpleNamespace

    from rlsim.real.histospec_proposer import HISTORY_ENV, HistoSpecProposer

    prompt, response = list(range(100, 120)), list(range(200, 260))
    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=16))
    monkeypatch.setenv(HISTORY_ENV, str(tmp_path / "none.jsonl"))
    assert HistoSpecProposer(cfg).propose([[1]], np.array([25]), np.array([prompt + response[:5]])) == [[]]

    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps({"prompt_token_ids": prompt, "responses": [response]}) + "\n")
    monkeypatch.setenv(HISTORY_ENV, str(history))
    proposer = HistoSpecProposer(cfg)
    n, lengths = 5, []
    while n < 40:
        row = np.array([prompt + response + [0] * 20])
        (draft,) = proposer.propose([[1]], np.array([len(prompt) + n]), row)
        assert draft == response[n : n + len(draft)]
        lengths.append(len(draft))
        n += len(draft) + 1  # all accepted, plus the bonus token
    assert lengths[:4] == [2, 4, 8, 16]
