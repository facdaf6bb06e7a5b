"""How well a fitted generator reproduces a log: held-apart prompts and a large synthetic draw.

`rlsim.trace.fit.cross_validate` holds prompts apart fold by fold (whole groups, every visit), fits on the other
folds, and pools the K fitted generators' draws against the whole log: no prompt is judged by a
fit that saw it (a small log's two halves differ by more than a good generator differs from
either, so one held-apart half would mostly measure the log's own noise). `synth_like` draws a
synthetic trace from a preset with the held trace's group size and steps (so growth over steps is
charged as in the log) and many more prompts, so that the comparison measures the generator, not
the synthetic draw's own noise.
`check_fit` compares the two: the quantiles, clip mass, within-prompt spread, prompt share and
the KS distance.
"""

from __future__ import annotations

import math

import pandas as pd

from rlsim.trace.format import Trace
from rlsim.trace.presets import Preset
from rlsim.trace.stats import compare_traces
from rlsim.trace.synth import SynthConfig, synthesize

CHECK_METRICS = (
    "p10", "p25", "p50", "p75", "p90", "mean", "clip_ratio", "clipped_group_share", "within_prompt_cv",
    "prompt_share", "ks_distance",
)  # fmt: skip


def synth_like(preset: Preset, like: Trace, seed: int = 0, min_prompts: int = 4000) -> pd.DataFrame:
    """A synthetic draw from `preset` shaped like `like`: same cap and group size, one epoch over
    as many steps as `like` spans, and at least `min_prompts` prompts."""
    n_prompts = max(min_prompts, 20 * like.num_prompts)
    steps = like.table["step"].nunique() if "step" in like.table.columns else 1
    config = SynthConfig(
        num_prompts=n_prompts,
        samples_per_prompt=like.meta.samples_per_prompt,
        epochs=1,
        prompts_per_step=math.ceil(n_prompts / steps),
        max_response_len=like.meta.max_response_len,
        seed=seed,
    )
    return synthesize(config, preset=preset).table


def check_fit(preset: Preset, against: Trace, seed: int = 0) -> list[dict]:
    """Rows (metric, log value a, fitted value b, diff text) of the fitted generator against a trace."""
    return check_rows(against, Trace(synth_like(preset, against, seed), against.meta))


def check_rows(real: Trace, synthetic: Trace) -> list[dict]:
    rows = {r["metric"]: r for r in compare_traces(real, synthetic) if r["scope"] == "all"}
    out = []
    for m in CHECK_METRICS:
        r = rows[m]
        if m == "ks_distance":
            diff = f"{r['b']:.3f}"
        elif r["a"] is None or r["b"] is None:
            diff = "-"
        elif m in ("clip_ratio", "clipped_group_share", "prompt_share", "within_prompt_cv"):
            diff = f"{r['b'] - r['a']:+.3f}"
        else:
            diff = f"{100 * r['rel_diff']:+.1f}%"
        out.append({"metric": m, "a": r["a"], "b": r["b"], "rel_diff": r["rel_diff"], "diff": diff})
    return out
