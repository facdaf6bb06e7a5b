"""Seeded generator of step traces from a named preset (`rlsim trace synth`).

The generative model is in `rlsim.trace.presets`. Prompts either come from a prompt table (real
prompt ids, token counts and text, such as the DAPO-Math-17k table under traces/sources/) or are
drawn from the preset's prompt-length distribution. Growth of the mean length over training maps
epoch e to training steps [e*S, (e+1)*S) with S = ceil(num_prompts / prompts_per_step), and
scales every length of the epoch by the curve's mean over those steps relative to step 0.

One `numpy.random.Generator` per call, draws in a fixed order: same config and prompts, same
table, and `rlsim.trace.format.save` then writes the same bytes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import special

from rlsim.errors import RlsimError
from rlsim.trace.format import Trace, TraceMeta
from rlsim.trace.presets import PRESETS, Preset, load_preset
from rlsim.trace.tokens import synth_token_ids

QWEN25_VOCAB = 151_643


MAX_SAMPLES = 100_000_000  # rows of a synthetic trace: what this machine's memory builds (DAPO-17k x 20 x 2: 717k)


@dataclass(frozen=True, slots=True)
class SynthConfig:
    """Knobs of `rlsim trace synth`; None means "the preset's value"."""

    preset: str = "dapo-qwen2.5-32b"
    num_prompts: int | None = None
    samples_per_prompt: int = 16
    epochs: int = 3
    prompts_per_step: int = 512
    max_response_len: int | None = None
    rho: float | None = None
    prompt_share: float | None = None
    start_step: int = 0
    clip_ratio: float | None = None
    length_scale: float = 1.0  # multiplies response lengths and the preset's cap (small real runs)
    seed: int = 0
    token_ids: bool = False
    reuse_fraction: float = 0.85
    vocab_size: int = QWEN25_VOCAB
    model: str | None = None

    def __post_init__(self) -> None:
        if self.preset not in PRESETS and not str(self.preset).endswith(".json"):
            raise RlsimError(
                f"unknown preset {self.preset!r}; choose one of {', '.join(sorted(PRESETS))} "
                "or a preset JSON file written by `rlsim trace fit`"
            )
        for name in ("samples_per_prompt", "epochs", "prompts_per_step", "vocab_size"):
            if getattr(self, name) <= 0:
                raise RlsimError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_prompts is not None and self.num_prompts <= 0:
            raise RlsimError(f"num_prompts must be positive, got {self.num_prompts}")
        rows = (self.num_prompts or 1) * self.samples_per_prompt * self.epochs
        if rows > MAX_SAMPLES:
            raise RlsimError(
                f"{self.num_prompts or 'the preset'} prompts x {self.samples_per_prompt} samples x {self.epochs} "
                f"epochs is too large: a synthetic trace holds at most {MAX_SAMPLES:,} samples (about 10 GB while "
                "generated)"
            )
        if self.max_response_len is not None and self.max_response_len <= 0:
            raise RlsimError(f"max_response_len must be positive, got {self.max_response_len}")
        if self.rho is not None and not 0.0 <= self.rho <= 1.0:
            raise RlsimError(f"rho must be between 0 and 1, got {self.rho}")
        if self.prompt_share is not None and not 0.0 <= self.prompt_share <= 1.0:
            raise RlsimError(f"prompt_share must be between 0 and 1, got {self.prompt_share}")
        if self.clip_ratio is not None and not 0.0 < self.clip_ratio < 0.5:
            raise RlsimError(f"clip_ratio must be between 0 and 0.5, got {self.clip_ratio}")
        if not (math.isfinite(self.length_scale) and self.length_scale > 0.0):
            raise RlsimError(f"length_scale must be positive, got {self.length_scale}")
        if self.start_step < 0:
            raise RlsimError(f"start_step must be >= 0, got {self.start_step}")
        if not 0.0 <= self.reuse_fraction <= 1.0:
            raise RlsimError(f"reuse_fraction must be between 0 and 1, got {self.reuse_fraction}")


def load_prompts(path: str | Path) -> pd.DataFrame:
    """A prompt table: Parquet with `prompt_id`, `num_prompt_tokens` and optional `prompt_text`."""
    path = Path(path)
    try:
        df = pd.read_parquet(path)
    except FileNotFoundError:
        raise RlsimError(f"{path}: no such prompt table") from None
    except Exception as exc:  # pyarrow raises several types for non-Parquet input
        raise RlsimError(f"{path} is not a Parquet prompt table ({exc})") from None
    for col in ("prompt_id", "num_prompt_tokens"):
        if col not in df.columns:
            raise RlsimError(f"prompt table {path} is missing column '{col}'")
    if df["prompt_id"].duplicated().any():
        raise RlsimError(f"prompt table {path} has duplicate prompt_id values")
    if (df["num_prompt_tokens"] <= 0).any():
        raise RlsimError(f"prompt table {path} has num_prompt_tokens <= 0")
    keep = [c for c in ("prompt_id", "num_prompt_tokens", "prompt_text") if c in df.columns]
    return df[keep].sort_values("prompt_id").reset_index(drop=True)


def epoch_growth(
    preset: Preset, num_prompts: int, prompts_per_step: int, epochs: int, start_step: int = 0
) -> list[float]:
    """Mean-length multiplier per epoch: the growth curve averaged over the epoch's steps, the
    first epoch starting `start_step` training steps into the run."""
    steps = math.ceil(num_prompts / prompts_per_step)
    first = start_step
    return [
        float(np.mean([preset.growth(s) for s in range(first + e * steps, first + (e + 1) * steps)]))
        for e in range(epochs)
    ]


def _normal_scores(values: np.ndarray) -> np.ndarray:
    """Rank-based standard-normal scores (ties broken by position, deterministic)."""
    ranks = np.argsort(np.argsort(values, kind="stable"), kind="stable")
    return special.ndtri((ranks + 0.5) / len(values))


def stretch_tail(preset: Preset, z: np.ndarray, clip_ratio: float, log_cap: float) -> np.ndarray:
    """Raise the upper tail so that at least `clip_ratio` of responses reach the cap.

    Between the quantile levels 1 - 5 * clip_ratio (z_a) and 1 - clip_ratio (z_c) the log length
    rises linearly from the preset's value at z_a to the cap; above z_c it is at the cap. Below
    z_a the preset is unchanged, and nothing is ever made shorter. This is how RL runs look when a
    share of responses run away (repetition loops) until truncated, veRL's
    `response_length/clip_ratio`."""
    z_c = float(special.ndtri(1.0 - clip_ratio))
    z_a = float(special.ndtri(1.0 - min(5.0 * clip_ratio, 0.5)))
    log_len = preset.log_length(z)
    base_a = float(preset.log_length(np.array([z_a]))[0])
    stretched = base_a + (z - z_a) / (z_c - z_a) * (log_cap - base_a)
    return np.where(z > z_a, np.maximum(log_len, stretched), log_len)


def resolve_preset(name: str) -> Preset:
    """A shipped preset by name, or a preset JSON file written by `rlsim trace fit`."""
    if name in PRESETS:
        return PRESETS[name]
    return load_preset(Path(name))


def synthesize(config: SynthConfig, prompts: pd.DataFrame | None = None, preset: Preset | None = None) -> Trace:
    """Generate a trace; `prompts` (see `load_prompts`) fixes prompt ids, lengths and text;
    `preset` (a fitted one in memory) replaces `config.preset`."""
    preset = preset or resolve_preset(config.preset)
    if preset.hierarchical and (config.clip_ratio is not None or config.prompt_share is not None):
        raise RlsimError(
            f"preset {preset.name} is fitted to a log in the hierarchical form, which carries the log's own clip "
            "mass and prompt share: --clip-ratio and --prompt-share apply to the shipped presets"
        )
    if config.start_step and not preset.growth_steps:
        raise RlsimError(
            f"preset {preset.name} has no growth curve over training steps, so --start-step cannot change "
            "its lengths; leave it at 0"
        )
    rng = np.random.default_rng(config.seed)
    scale = config.length_scale
    max_len = config.max_response_len or max(1, round(preset.max_response_len * scale))
    rho = preset.rho if config.rho is None else config.rho

    if prompts is not None:
        if config.num_prompts is not None:
            if config.num_prompts > len(prompts):
                raise RlsimError(f"num_prompts={config.num_prompts} but the prompt table holds {len(prompts)}")
            prompts = prompts.iloc[: config.num_prompts]
        prompt_ids = prompts["prompt_id"].to_numpy(np.int64)
        prompt_tokens = prompts["num_prompt_tokens"].to_numpy(np.int64)
        z_prompt = _normal_scores(np.log(prompt_tokens))
    else:
        if config.num_prompts is None:
            raise RlsimError("give --num-prompts or a --prompts table")
        prompt_ids = np.arange(config.num_prompts, dtype=np.int64)
        z_prompt = rng.standard_normal(config.num_prompts)
        prompt_tokens = np.maximum(
            1, np.rint(preset.prompt_len_median * np.exp(preset.prompt_len_sigma * z_prompt))
        ).astype(np.int64)

    n_p, n_s, n_e = len(prompt_ids), config.samples_per_prompt, config.epochs
    c = preset.prompt_len_corr
    latent = c * z_prompt + math.sqrt(1.0 - c * c) * rng.standard_normal(n_p)
    growth = epoch_growth(preset, n_p, config.prompts_per_step, n_e, config.start_step)
    share = preset.prompt_share if config.prompt_share is None else config.prompt_share
    shaped = preset if share == preset.prompt_share else replace(preset, prompt_share=share)
    lengths = np.empty((n_e, n_p, n_s), dtype=np.int64)
    latents = []
    for e in range(n_e):
        if e > 0:
            latent = rho * latent + math.sqrt(1.0 - rho * rho) * rng.standard_normal(n_p)
        latents.append(latent)
        eps = rng.standard_normal((n_p, n_s))
        if config.clip_ratio is None:
            log_len = shaped.log_lengths(latent, eps)
        else:  # copula presets only (refused above for hierarchical ones)
            z = math.sqrt(share) * latent[:, None] + math.sqrt(1.0 - share) * eps
            log_len = stretch_tail(preset, z, config.clip_ratio, math.log(max_len / growth[e] / scale))
        raw = np.exp(log_len) * growth[e] * scale
        lengths[e] = np.clip(np.rint(raw), 1, max_len).astype(np.int64)

    table = pd.DataFrame(
        {
            "epoch": np.repeat(np.arange(n_e, dtype=np.int32), n_p * n_s),
            "prompt_id": np.tile(np.repeat(prompt_ids, n_s), n_e),
            "sample_idx": np.tile(np.arange(n_s, dtype=np.int32), n_e * n_p),
            "num_prompt_tokens": np.tile(np.repeat(prompt_tokens, n_s), n_e).astype(np.int32),
            "num_output_tokens": lengths.reshape(-1).astype(np.int32),
        }
    )
    table["finish_reason"] = np.where(table["num_output_tokens"] >= max_len, "length", "stop")
    if prompts is not None and "prompt_text" in prompts.columns:
        table["prompt_text"] = np.tile(np.repeat(prompts["prompt_text"].to_numpy(), n_s), n_e)

    # Knobs left at "off" are not recorded, so traces made before they existed keep their bytes.
    params = {
        k: v
        for k, v in asdict(config).items()
        if k not in ("token_ids", "reuse_fraction")
        and not (k in ("start_step", "clip_ratio") and not v)
        and not (k == "length_scale" and v == 1.0)
    }
    params.update(
        num_prompts=n_p,
        rho=rho,
        max_response_len=max_len,
        prompt_share=share,
        epoch_growth=[round(g, 6) for g in growth],
        prompts="table" if prompts is not None else "synthetic",
        fitted_to=preset.fitted_to,
    )
    if config.clip_ratio is not None:
        params["clip_ratio_realised"] = round(float((lengths >= max_len).mean()), 5)
    token_kind = None
    if config.token_ids:
        try:
            ids, realised = synth_token_ids(lengths, config.reuse_fraction, config.vocab_size, rng)
        except ValueError as exc:
            raise RlsimError(str(exc)) from None
        table["output_token_ids"] = ids
        token_kind = "synthetic"
        params["token_ids"] = {
            "reuse_fraction": config.reuse_fraction,
            "reuse_fraction_realised": round(realised, 4),
            "vocab_size": config.vocab_size,
            "note": "synthetic tokens: random ids with controlled reuse of the previous visit",
        }
    if preset.reward_model is not None:
        # Drawn last, so lengths and token ids are those of a trace made without rewards.
        mu, tau, kappa = preset.reward_model
        difficulty = rng.standard_normal(n_p)
        solve = special.expit(mu + tau * difficulty[None, :] - kappa * np.stack(latents))  # (epochs, prompts)
        right = rng.random((n_e, n_p, n_s)) < solve[:, :, None]
        table["reward"] = np.where(right.reshape(-1), 1.0, -1.0).astype(np.float32)
        params["reward_model"] = {"mu": mu, "tau": tau, "kappa": kappa, "solve_rate": round(float(solve.mean()), 4)}
    meta = TraceMeta(
        model=config.model or preset.model,
        max_response_len=max_len,
        samples_per_prompt=n_s,
        source=f"synthetic:{preset.name}",
        source_params=params,
        output_token_ids=token_kind,
    )
    return Trace(table, meta)


# the highest mean a stand-in is built for, as a share of its cap: above it nearly every response
# sits at the cap, and the preset's shape no longer says anything about the run
STAND_IN_REACH = 0.95
STAND_IN_TOLERANCE = 0.01  # a stand-in's capped mean is within 1% of its target, or it is refused


def synthesize_to_mean(
    preset: str,
    prompts_per_step: int,
    samples: int,
    steps: int,
    cap: int,
    mean: float,
    prompts: pd.DataFrame | None = None,
    clip_share: float | None = None,
    bracket: tuple[float, float, int] | None = None,
) -> Trace:
    """`preset` rescaled (`length_scale`) so that its mean response, capped at `cap`, is `mean`
    within 1%: a stand-in for a run that publishes its mean length alone. The scale has no upper
    bound: it doubles until the capped mean passes the target, then bisects. Any mean up to 0.95
    of the cap is reached; above it the call is refused (the stand-in would be the cap itself).

    `clip_share` (veRL's `response_length/clip_ratio`) also matches the share of responses at the
    cap, by raising the preset's upper tail (`SynthConfig.clip_ratio`); where the mean leaves more
    responses at the cap than the log's share, the stand-in keeps the mean and says the share it
    reached. The trace's `source_params["stand_in"]` says what it is: its target, the capped mean
    it reached, its scale and its share of responses at the cap (`describe_stand_in`).

    `bracket` (lo, hi, iterations): bisect the scale that many times inside [lo, hi] instead of
    doubling (a setup of record that states its own search, as the paper checks do); the mean it
    reaches is held to the same 1%, and a bracket that cannot reach it is refused."""
    if not (math.isfinite(mean) and 0 < mean <= STAND_IN_REACH * cap):
        raise RlsimError(
            f"a stand-in cannot reach a mean response of {mean:,.0f} tokens under a cap of {cap:,}: above "
            f"{STAND_IN_REACH:.0%} of the cap ({STAND_IN_REACH * cap:,.0f}) nearly every response sits at the cap; "
            "give the run's own lengths (a trace)"
        )
    if clip_share is not None and not (math.isfinite(clip_share) and 0 <= clip_share < 0.5):
        raise RlsimError(f"a stand-in's share of responses at the cap must be in [0, 0.5), got {clip_share}")

    def make(scale: float, clip: float | None) -> Trace:
        cfg = SynthConfig(preset=preset, num_prompts=prompts_per_step * steps, samples_per_prompt=samples, epochs=1,
                          prompts_per_step=prompts_per_step, max_response_len=cap, length_scale=scale,
                          clip_ratio=clip)  # fmt: skip
        return synthesize(cfg, prompts)

    def capped(t: Trace) -> np.ndarray:
        return t.table["num_output_tokens"].clip(upper=cap).to_numpy()

    def to_mean(clip: float | None) -> tuple[Trace, float]:
        lo, hi = 0.0, 1.0
        while capped(make(hi, clip)).mean() < mean:  # the capped mean rises to the cap as the scale grows
            lo, hi = hi, hi * 2
            if hi > 2.0**60:
                raise RlsimError(f"the {preset} preset does not reach a mean of {mean:,.0f} under a cap of {cap:,}")
        best = make(hi, clip), hi
        for _ in range(60):
            got = capped(best[0]).mean()
            if abs(got / mean - 1) < STAND_IN_TOLERANCE / 10:
                break
            mid = (lo + hi) / 2
            t = make(mid, clip)
            lo, hi = (mid, hi) if capped(t).mean() < mean else (lo, mid)
            if abs(capped(t).mean() / mean - 1) < abs(got / mean - 1):
                best = t, mid
        return best

    if bracket is not None:
        lo, hi, iters = bracket
        for _ in range(iters):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if capped(make(mid, None)).mean() < mean else (lo, mid)
        trace, scale = make((lo + hi) / 2, None), (lo + hi) / 2
    else:
        trace, scale = to_mean(None)
    clip = None
    share = float((capped(trace) >= cap).mean())
    if clip_share is not None and clip_share > share:  # raise the tail until the share at the cap is the log's
        lo, hi = 1e-4, 0.499
        for _ in range(20):
            mid = (lo + hi) / 2
            t, s = to_mean(mid)
            got = float((capped(t) >= cap).mean())
            lo, hi = (mid, hi) if got < clip_share else (lo, mid)
            if abs(got - clip_share) < abs(share - clip_share):
                trace, scale, clip, share = t, s, mid, got
            if abs(got - clip_share) < 0.002:
                break
    reached = float(capped(trace).mean())
    if abs(reached / mean - 1) > STAND_IN_TOLERANCE:
        raise RlsimError(f"the {preset} preset reaches a mean of {reached:,.0f} tokens, not {mean:,.0f}, under a cap "
                         f"of {cap:,}" + (f" with its scale inside {bracket[:2]}" if bracket else ""))  # fmt: skip
    trace.meta.source_params["stand_in"] = {
        "preset": preset, "target_mean": round(float(mean), 3), "mean": round(reached, 3),
        "length_scale": round(scale, 6), "cap": int(cap), "clip_share": round(share, 5),
        "target_clip_share": None if clip_share is None else round(float(clip_share), 5),
        "tail_clip_ratio": None if clip is None else round(clip, 5),
    }  # fmt: skip
    return trace


def describe_stand_in(trace: Trace) -> str:
    """One line: what a stand-in made by `synthesize_to_mean` is (its target and reached mean, its
    scale, its share of responses at the cap)."""
    s = trace.meta.source_params["stand_in"]
    clip = (f", {s['clip_share']:.1%} of responses at the cap {s['cap']:,}"
            + (f" (the log's {s['target_clip_share']:.1%})" if s.get("target_clip_share") is not None else ""))
    return (f"the {s['preset']} preset rescaled x{s['length_scale']:.3g} to a capped mean of {s['mean']:,.0f} tokens "
            f"(target {s['target_mean']:,.0f}){clip}")  # fmt: skip
