"""The trace generator: determinism, presets fitted to real data, rho, synthetic token ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlsim.cli.trace import PRESET_NAMES
from rlsim.errors import RlsimError
from rlsim.trace.format import load, save
from rlsim.trace.importers import import_polytrace
from rlsim.trace.presets import DAPO_QWEN25_32B, PRESETS, fit_prompt_share, fit_quantile_knots
from rlsim.trace.stats import compare_stats, trace_stats
from rlsim.trace.synth import SynthConfig, synthesize

from .conftest import POLYTRACE_DIR


def _real_lengths() -> np.ndarray:
    rows = [
        json.loads(line)
        for f in sorted(POLYTRACE_DIR.glob("packed_lengths_step_*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    return np.array([r["output"] for r in rows])


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    """Two runs with the same seed write identical files; another seed differs."""
    cfg = SynthConfig(num_prompts=50, samples_per_prompt=4, epochs=2, seed=3, token_ids=True)
    a = save(synthesize(cfg), tmp_path / "a.parquet").read_bytes()
    b = save(synthesize(cfg), tmp_path / "b.parquet").read_bytes()
    other = SynthConfig(num_prompts=50, samples_per_prompt=4, epochs=2, seed=4, token_ids=True)
    c = save(synthesize(other), tmp_path / "c.parquet").read_bytes()
    assert a == b
    assert a != c


def test_preset_constants_rederive_from_real_logs() -> None:
    """The dapo preset's knots and prompt share are what the fitting functions give on the logs."""
    lengths = _real_lengths()
    z, lk = fit_quantile_knots(lengths.ravel())
    assert z == DAPO_QWEN25_32B.z_knots
    assert lk == DAPO_QWEN25_32B.log_len_knots
    assert fit_prompt_share(lengths) == DAPO_QWEN25_32B.prompt_share


def test_dapo_preset_matches_real_verl_logs_within_10_percent() -> None:
    """At the logs' scale (576 prompts x 8), mean, p50, p90, p99 and median CV are within 10%."""
    real = trace_stats(import_polytrace(POLYTRACE_DIR))
    cfg = SynthConfig(num_prompts=576, samples_per_prompt=8, epochs=1, prompts_per_step=96, seed=0)
    synth = trace_stats(synthesize(cfg))
    rows = {r["metric"]: r for r in compare_stats(real, synth) if r["scope"] == "all"}
    for metric in ("mean", "p50", "p90", "p99", "within_prompt_cv"):
        assert abs(rows[metric]["rel_diff"]) < 0.10, (metric, rows[metric])


def test_rho_controls_cross_epoch_rank_correlation() -> None:
    """Higher rho gives a higher Spearman correlation of prompt mean length across epochs."""

    def spearman(rho: float) -> float:
        cfg = SynthConfig(preset="reasoning-32k", num_prompts=600, samples_per_prompt=8, epochs=2, rho=rho, seed=1)
        return trace_stats(synthesize(cfg)).epochs[1].cross_epoch_spearman

    s0, s5, s1 = spearman(0.0), spearman(0.5), spearman(1.0)
    assert abs(s0) < 0.1
    assert s0 < s5 < s1
    assert s1 > 0.8


def test_reasoning_preset_is_long_and_prompt_dominated() -> None:
    """reasoning-32k: mean near 9.6k tokens, cap 32,768, the prompt explains most variance."""
    trace = synthesize(SynthConfig(preset="reasoning-32k", num_prompts=1500, samples_per_prompt=8, epochs=1, seed=2))
    out = trace.table["num_output_tokens"]
    assert trace.meta.max_response_len == 32768 and out.max() <= 32768
    assert 9000 < out.mean() < 10200
    assert fit_prompt_share(out.to_numpy().reshape(1500, 8)) > 0.6


def test_growth_follows_dapo_curve() -> None:
    """Later epochs scale lengths by the DAPO mean-length curve (it dips before step 100)."""
    trace = synthesize(SynthConfig(num_prompts=2048, samples_per_prompt=4, epochs=3, seed=0))
    growth = trace.meta.source_params["epoch_growth"]
    assert growth[0] > growth[1] > growth[2]  # steps 0-11, 12-23, 24-35: 734 -> 592 region
    means = [trace.visit(e)["num_output_tokens"].mean() for e in range(3)]
    assert means[0] > means[2]


def test_start_step_moves_along_the_growth_curve() -> None:
    """start_step=2000 scales lengths by DAPO's mean at step 2000 over step 0 (2,648 / 734)."""
    cfg = dict(num_prompts=512, samples_per_prompt=4, epochs=1, seed=0, prompts_per_step=512)
    early = synthesize(SynthConfig(**cfg)).table["num_output_tokens"]
    late = synthesize(SynthConfig(**cfg, start_step=2000, max_response_len=10**6)).table["num_output_tokens"]
    assert late.median() / early.median() == pytest.approx(2648 / 734, rel=0.02)


def test_prompt_share_override_sets_the_between_prompt_share() -> None:
    """A prompt_share override is what fit_prompt_share measures back (within sampling error)."""
    for share in (0.2, 0.9):
        trace = synthesize(SynthConfig(num_prompts=1500, samples_per_prompt=8, epochs=1, seed=1, prompt_share=share))
        measured = fit_prompt_share(trace.table["num_output_tokens"].to_numpy().reshape(1500, 8))
        assert measured == pytest.approx(share, abs=0.06)
        assert trace.meta.source_params["prompt_share"] == share


def test_clip_ratio_raises_only_the_tail() -> None:
    """clip_ratio=0.01 caps about 1% of responses; the body of the distribution is unchanged."""
    cfg = dict(num_prompts=2000, samples_per_prompt=8, epochs=1, seed=4, max_response_len=32768)
    plain = synthesize(SynthConfig(**cfg)).table["num_output_tokens"].to_numpy()
    tail = synthesize(SynthConfig(**cfg, clip_ratio=0.01)).table["num_output_tokens"].to_numpy()
    assert (plain >= 32768).mean() < 0.001
    assert 0.008 < (tail >= 32768).mean() < 0.012
    assert (tail >= plain).all()
    body = plain <= np.quantile(plain, 0.94)  # the stretch starts at the 95th percentile
    assert (tail[body] == plain[body]).all()


def test_cap_sets_finish_reason_length() -> None:
    """Responses reaching max_response_len are marked 'length', all others 'stop'."""
    trace = synthesize(SynthConfig(num_prompts=300, samples_per_prompt=8, epochs=1, max_response_len=600, seed=0))
    df = trace.table
    assert (df.loc[df.finish_reason == "length", "num_output_tokens"] == 600).all()
    assert (df.loc[df.finish_reason == "stop", "num_output_tokens"] < 600).all()
    assert 0.2 < (df.finish_reason == "length").mean() < 0.5


def test_token_ids_reuse_previous_visit() -> None:
    """Synthetic token ids: none reused on the first visit, about reuse_fraction afterwards."""
    cfg = SynthConfig(
        num_prompts=30,
        samples_per_prompt=4,
        epochs=2,
        seed=0,
        token_ids=True,
        reuse_fraction=0.85,
        max_response_len=4000,
    )
    trace = synthesize(cfg)
    assert trace.meta.output_token_ids == "synthetic"
    realised = trace.meta.source_params["token_ids"]["reuse_fraction_realised"]
    assert 0.7 < realised <= 0.85
    df = trace.table
    for pid in df.prompt_id.unique()[:5]:
        prev = df[(df.epoch == 0) & (df.prompt_id == pid)]
        cur = df[(df.epoch == 1) & (df.prompt_id == pid)]
        prev_8grams = {tuple(t[i : i + 8]) for t in prev.output_token_ids for i in range(len(t) - 7)}
        t = cur.output_token_ids.iloc[0]
        hits = sum(tuple(t[i : i + 8]) in prev_8grams for i in range(len(t) - 7))
        assert hits / max(1, len(t) - 7) > 0.4
    assert all(len(t) == n for t, n in zip(df.output_token_ids, df.num_output_tokens, strict=True))


def test_token_ids_refused_for_large_traces() -> None:
    """Token ids on a full-size trace are refused with a sentence, not an out-of-memory."""
    with pytest.raises(RlsimError, match="synthetic token ids are for small traces"):
        synthesize(SynthConfig(num_prompts=17917, samples_per_prompt=16, epochs=3, token_ids=True))


def test_prompt_table_sets_ids_lengths_and_text(tmp_path: Path) -> None:
    """A prompt table fixes prompt ids, prompt lengths and text."""
    import pandas as pd

    from rlsim.trace.synth import load_prompts

    table = pd.DataFrame(
        {
            "prompt_id": [5, 9, 2],
            "num_prompt_tokens": [100, 200, 150],
            "prompt_text": ["a", "b", "c"],
        }
    )
    path = tmp_path / "p.parquet"
    table.to_parquet(path)
    trace = synthesize(SynthConfig(samples_per_prompt=2, epochs=1), load_prompts(path))
    assert sorted(trace.table.prompt_id.unique()) == [2, 5, 9]
    row = trace.table[trace.table.prompt_id == 9].iloc[0]
    assert row.num_prompt_tokens == 200 and row.prompt_text == "b"


def test_bad_config_is_a_clear_error() -> None:
    """Impossible knobs raise RlsimError naming the knob."""
    with pytest.raises(RlsimError, match="rho must be between 0 and 1"):
        SynthConfig(rho=1.5)
    with pytest.raises(RlsimError, match="clip_ratio must be between 0 and 0.5"):
        SynthConfig(clip_ratio=0.7)
    with pytest.raises(RlsimError, match="prompt_share must be between 0 and 1"):
        SynthConfig(prompt_share=-0.1)
    with pytest.raises(RlsimError, match="start_step must be >= 0"):
        SynthConfig(start_step=-1)
    with pytest.raises(RlsimError, match="unknown preset"):
        SynthConfig(preset="nope")
    with pytest.raises(RlsimError, match="give --num-prompts"):
        synthesize(SynthConfig())


def test_cli_preset_choices_match_registry() -> None:
    """The CLI's preset enum lists exactly the registered presets."""
    assert set(PRESET_NAMES) == set(PRESETS)


def test_loaded_synthetic_trace_is_valid(small_trace_path: Path) -> None:
    """A generated trace passes the loader's validation."""
    trace = load(small_trace_path)
    assert trace.meta.source == "synthetic:dapo-qwen2.5-32b"
    assert trace.meta.source_params["seed"] == 7
