"""Named length presets for `rlsim trace synth`, each fitted to published or logged data.

Every preset is a Gaussian copula over response lengths: sample s of prompt p on visit e has a
standard-normal latent

    z = sqrt(prompt_share) * a[p, e] + sqrt(1 - prompt_share) * eps[p, e, s]
    a[p, e] = rho * a[p, e-1] + sqrt(1 - rho^2) * fresh      (a[p, 0] ~ N(0, 1))

and its length is `exp(Q(z)) * growth(e)`, where Q is a monotone log-length quantile function
(piecewise linear in z between fitted knots, extended linearly beyond them) and growth follows a
published mean-length curve. `prompt_share` is the share of log-length variance the prompt
explains; `rho` carries a prompt's difficulty from one visit to the next (no published value
exists; the default is documented per preset and `rlsim trace inspect` shows its effect as the
cross-epoch rank correlation of prompt mean length).

Rewards (DAPO's accuracy reward, +1 correct, -1 wrong) where a preset has a reward model: each
prompt has a latent solve rate `q = sigmoid(mu + tau * u[p] - kappa * a[p, e])` (u a fixed
difficulty, a the length latent above, so prompts with long responses are solved less often) and
each sample is correct with probability q. DAPO's dynamic sampling drops the groups whose rewards
are all equal, a share of `q^n + (1-q)^n` per prompt. `fit_reward_model` fits (mu, tau, kappa) to
which of the verl DAPO run's prompts survived that filter, by prompt-length quartile.

The knots and shares below are constants so a fresh clone needs no external data; the functions
`fit_quantile_knots` and `fit_prompt_share` re-derive them, and tests check that they do.

Sources:
- dapo-qwen2.5-32b: verl DAPO length logs (PolyTrace, github.com/Zhou-jiecheng/PolyTrace @ 65c0146,
  `verl/profile/packed_length_log/20260614_023133/`: 576 prompts x 8 samples, most likely
  Qwen2.5-32B base on DAPO-Math-17k, Apache-2.0) and the mean response length curve of the DAPO
  paper (arXiv 2503.14476, Fig. 7a, digitised every 100 steps).
- reasoning-32k: the 4-component Gaussian mixture fitted to 385,024 production math samples of
  a reasoning model (PolyTrace @ e336eb2,
  `dataset/workloads/enhanced_task_distribution_parameters.json`).
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

import numpy as np
from scipy import optimize, special, stats

from rlsim.errors import RlsimError
from rlsim.files import atomic_write_text

QUANTILE_LEVELS = (0.001, 0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99, 0.999)


@dataclass(frozen=True, slots=True)
class Preset:
    """A fitted length model; see the module docstring for the generative story."""

    name: str
    model: str
    max_response_len: int
    prompt_share: float
    rho: float
    z_knots: tuple[float, ...]
    log_len_knots: tuple[float, ...]
    prompt_len_median: float
    prompt_len_sigma: float
    prompt_len_corr: float  # correlation of log prompt length with the prompt latent
    growth_steps: tuple[int, ...] = ()
    growth_mean: tuple[float, ...] = ()
    fitted_to: str = ""
    reward_model: tuple[float, float, float] | None = None  # (mu, tau, kappa); None: no rewards
    # Hierarchical form (fitted presets where the prompt sets the length scale): z_knots and
    # log_len_knots then map the prompt latent to the prompt's log centre, and a sample adds a
    # residual Q_w(eps) whose knots depend on the centre's bin (edges in the latent's z).
    resid_z_knots: tuple[float, ...] = ()
    resid_log_knots: tuple[tuple[float, ...], ...] = ()
    resid_bins: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.prompt_share <= 1.0:
            raise ValueError(f"prompt_share must be in [0, 1], got {self.prompt_share}")
        if not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"rho must be in [0, 1], got {self.rho}")
        if len(self.z_knots) != len(self.log_len_knots) or len(self.z_knots) < 2:
            raise ValueError("z_knots and log_len_knots must have the same length >= 2")
        if np.any(np.diff(self.z_knots) <= 0) or np.any(np.diff(self.log_len_knots) < 0):
            raise ValueError("quantile knots must be increasing")
        if self.resid_z_knots:
            if len(self.resid_log_knots) != len(self.resid_bins) + 1:
                raise ValueError("resid_log_knots needs one row per centre bin (len(resid_bins) + 1)")
            if np.any(np.diff(self.resid_z_knots) <= 0) or np.any(np.diff(self.resid_bins) <= 0):
                raise ValueError("residual knots and bin edges must be increasing")
            for row in self.resid_log_knots:
                if len(row) != len(self.resid_z_knots) or np.any(np.diff(row) < 0):
                    raise ValueError("every residual knot row must be increasing and match resid_z_knots")

    @property
    def hierarchical(self) -> bool:
        return bool(self.resid_z_knots)

    def log_length(self, z: np.ndarray) -> np.ndarray:
        """Q(z): log length for standard-normal latents, linear beyond the outer knots."""
        return quantile_curve(z, self.z_knots, self.log_len_knots)

    def log_lengths(self, latent: np.ndarray, eps: np.ndarray) -> np.ndarray:
        """Log lengths of samples (prompts x samples) from the prompt latents and the samples'
        own standard-normal draws, in this preset's form (copula or hierarchical)."""
        if not self.hierarchical:
            share = self.prompt_share
            return self.log_length(math.sqrt(share) * latent[:, None] + math.sqrt(1.0 - share) * eps)
        centre = self.log_length(latent)
        bins = np.digitize(latent, self.resid_bins)
        out = np.empty(eps.shape)
        for b, knots in enumerate(self.resid_log_knots):
            rows = bins == b
            out[rows] = centre[rows, None] + quantile_curve(eps[rows], self.resid_z_knots, knots)
        return out

    def growth(self, step: float) -> float:
        """Mean-length multiplier at a training step, relative to step 0 (1.0 if no curve)."""
        if not self.growth_steps:
            return 1.0
        mean = np.interp(step, self.growth_steps, self.growth_mean)
        return float(mean / self.growth_mean[0])


def quantile_curve(z: np.ndarray, z_knots: tuple[float, ...], values: tuple[float, ...]) -> np.ndarray:
    """Piecewise-linear quantile function through the knots, linear beyond the outer ones."""
    zk, lk = np.asarray(z_knots), np.asarray(values)
    out = np.interp(z, zk, lk)
    lo_slope = (lk[1] - lk[0]) / (zk[1] - zk[0])
    hi_slope = (lk[-1] - lk[-2]) / (zk[-1] - zk[-2])
    out = np.where(z < zk[0], lk[0] + (z - zk[0]) * lo_slope, out)
    return np.where(z > zk[-1], lk[-1] + (z - zk[-1]) * hi_slope, out)


def fit_quantile_knots(lengths: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Knots (z, log length) at `QUANTILE_LEVELS` of pooled response lengths."""
    logs = np.log(np.asarray(lengths, dtype=float))
    z = tuple(round(float(special.ndtri(q)), 4) for q in QUANTILE_LEVELS)
    lk = tuple(round(float(np.quantile(logs, q)), 4) for q in QUANTILE_LEVELS)
    return z, lk


def fit_prompt_share(lengths_by_prompt: np.ndarray) -> float:
    """Between-prompt share of the copula latent: one-way random-effects ANOVA on the normal
    scores of the lengths (prompts x samples). Normal scores are the copula's own scale, so the
    estimate is not dominated by the few very short responses that swamp a log-scale ANOVA."""
    x = np.asarray(lengths_by_prompt, dtype=float)
    ranks = stats.rankdata(x.ravel())
    z = special.ndtri((ranks - 0.5) / ranks.size).reshape(x.shape)
    n = z.shape[1]
    msb = n * z.mean(axis=1).var(ddof=1)
    msw = z.var(axis=1, ddof=1).mean()
    between = max((msb - msw) / n, 0.0)
    return round(float(between / (between + msw)), 4)


def fit_reward_model(
    preset: Preset, kept_by_quartile: np.ndarray, n: int, draws: int = 200_000, seed: int = 0
) -> tuple[float, float, float]:
    """(mu, tau, kappa) whose kept-group share (rewards not all equal, `n` samples) by quartile of
    the prompt's mean log length matches `kept_by_quartile`, with the preset's length model."""
    rng = np.random.default_rng(seed)
    a, u = rng.standard_normal(draws), rng.standard_normal(draws)
    mean_log = preset.log_lengths(a, rng.standard_normal((draws, n))).mean(axis=1)
    quartile = np.digitize(mean_log, np.quantile(mean_log, [0.25, 0.5, 0.75]))
    draw = rng.random((draws, n))

    def loss(x: np.ndarray) -> float:
        q = special.expit(x[0] + x[1] * u - x[2] * a)
        right = draw < q[:, None]
        kept = right.any(axis=1) & ~right.all(axis=1)
        got = np.array([kept[quartile == i].mean() for i in range(4)])
        return float(((got - kept_by_quartile) ** 2).sum())

    starts = ((-3.0, 1.5, 1.0), (-2.0, 1.0, 0.5), (-4.0, 3.0, 2.0))  # the optimum is shallow: take the best
    fits = [optimize.minimize(loss, x0, method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-10}) for x0 in starts]
    best = min(fits, key=lambda r: r.fun)
    return tuple(round(float(v), 3) for v in best.x)


# Which prompts of the verl DAPO run (PolyTrace 20260614_023133, `dapo_filter_indices.jsonl`,
# 6 generation batches x 96 prompts, n = 8) survived dynamic sampling, by quartile of the
# prompt's mean log response length: 31.6% overall, fewer among prompts with long responses.
DAPO_KEPT_BY_LENGTH_QUARTILE = (0.403, 0.347, 0.292, 0.222)

# Digitised DAPO Fig. 7a (Qwen2.5-32B base, 512 prompts x 16 samples per step), +-30 tokens.
DAPO_CURVE_STEPS = tuple(range(0, 5001, 100))
DAPO_CURVE_MEAN = (
    734, 592, 704, 841, 958, 1033, 1171, 1261, 1299, 1377, 1463, 1524, 1525, 1496, 1655, 1808,
    1957, 2042, 2206, 2584, 2648, 2567, 2719, 2847, 2872, 2847, 2956, 3369, 3691, 3804, 3719,
    3844, 3886, 4098, 3985, 4118, 3980, 3879, 3850, 3976, 4412, 4197, 4217, 4307, 4245, 4129,
    3672, 3755, 3831, 3667, 4112,
)  # fmt: skip

DAPO_QWEN25_32B = Preset(
    name="dapo-qwen2.5-32b",
    model="Qwen2.5-32B",
    max_response_len=20480,
    # fit_prompt_share / fit_quantile_knots on the 576 x 8 verl lengths (tests re-derive them).
    prompt_share=0.0842,
    rho=0.9,
    z_knots=(
        -3.0902, -2.3263, -1.6449, -1.2816, -0.6745, 0.0, 0.6745, 1.2816, 1.6449, 2.3263, 3.0902,
    ),
    log_len_knots=(
        0.6931, 2.0794, 4.5951, 5.1281, 5.6904, 6.1442, 6.5439, 6.946, 7.257, 7.9049, 8.6741,
    ),
    # Prompt lengths of the same logs (tokens incl. chat template): median 152, p10 108, p90 224.
    prompt_len_median=152.0,
    prompt_len_sigma=0.289,
    prompt_len_corr=0.156,  # log prompt length vs prompt mean log length in the same logs
    growth_steps=DAPO_CURVE_STEPS,
    growth_mean=DAPO_CURVE_MEAN,
    fitted_to="verl DAPO length logs (PolyTrace 20260614_023133, 4,608 responses) for shape; "
    "DAPO paper Fig. 7a for growth of the mean over training steps; the same run's dynamic-sampling "
    "filter for rewards",
    # fit_reward_model(DAPO_QWEN25_32B, DAPO_KEPT_BY_LENGTH_QUARTILE, 8): mean solve rate 18%,
    # 68% of groups dropped at n = 8 (the run: 68.4%) and 60% at DAPO's n = 16. Held at the start
    # of training: no per-step curve of the dropped share is in the data.
    reward_model=(-3.934, 3.469, 1.692),
)  # fmt: skip


# Production math workload of a reasoning model: GMM over (input, output) tokens.
REASONING_GMM_WEIGHTS = (
    0.358504752818907,
    0.07434340269703671,
    0.3728319533326389,
    0.19431989115141732,
)
REASONING_GMM_OUT_MEAN = (
    4959.099111112346,
    12719.633617453097,
    9174.831640824232,
    17654.857156495706,
)
REASONING_GMM_OUT_VAR = (
    4804084.907877425,
    36813304.20752768,
    11669296.498556865,
    27740124.670528445,
)
REASONING_INPUT_CORR = 0.11418447975551943  # published input/output correlation


def _gmm_log_knots(num: int = 241) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Invert the mixture's output CDF (truncated to >= 1 token) on a dense z grid."""
    w = np.asarray(REASONING_GMM_WEIGHTS)
    mu = np.asarray(REASONING_GMM_OUT_MEAN)
    sd = np.sqrt(np.asarray(REASONING_GMM_OUT_VAR))
    x = np.linspace(1.0, 60000.0, 60000)
    cdf = (w * stats.norm.cdf((x[:, None] - mu) / sd)).sum(axis=1)
    lo = (w * stats.norm.cdf((1.0 - mu) / sd)).sum()
    cdf = (cdf - lo) / (cdf[-1] - lo)
    z = np.linspace(-4.0, 4.0, num)
    q = np.interp(special.ndtr(z), cdf, x)
    return tuple(float(v) for v in z), tuple(float(math.log(max(v, 1.0))) for v in q)


_GMM_Z, _GMM_LOG = _gmm_log_knots()

REASONING_32K = Preset(
    name="reasoning-32k",
    model="reasoning-32B",
    max_response_len=32768,
    # Assumption: for long-reasoning models the prompt explains most length variance (0.7).
    prompt_share=0.7,
    rho=0.9,
    z_knots=_GMM_Z,
    log_len_knots=_GMM_LOG,
    prompt_len_median=141.0,
    prompt_len_sigma=0.35,
    prompt_len_corr=REASONING_INPUT_CORR,
    fitted_to="PolyTrace production math GMM (385,024 samples): output mixture mean 9,575 "
    "tokens; input median about 141 tokens; input/output correlation 0.114",
)


PRESETS: dict[str, Preset] = {p.name: p for p in (DAPO_QWEN25_32B, REASONING_32K)}


PRESET_FORMAT = "rlsim.preset/1"


def save_preset(preset: Preset, path: Path, notes: list[str]) -> Path:
    """Write a preset as JSON (with the fit's notes) for `rlsim trace synth --preset`."""
    body = {"format": PRESET_FORMAT, **asdict(preset), "fit_notes": notes}
    return atomic_write_text(path, json.dumps(body, indent=2) + "\n")


def load_preset(path: Path) -> Preset:
    """A preset JSON written by `save_preset`; one sentence naming what is wrong otherwise."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RlsimError(f"{path}: no such preset file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RlsimError(f"{path} is not a preset JSON file ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != PRESET_FORMAT:
        raise RlsimError(f'{path} is not an rlsim preset (no "format": "{PRESET_FORMAT}")')
    names = {f.name for f in fields(Preset)}
    missing = [f.name for f in fields(Preset) if f.default is MISSING and f.name not in raw]
    try:
        values = {k: v for k, v in raw.items() if k in names}
        for key in ("z_knots", "log_len_knots", "growth_steps", "growth_mean", "reward_model", "resid_z_knots",
                    "resid_bins", "resid_log_knots"):  # fmt: skip
            if isinstance(values.get(key), list):
                values[key] = tuple(tuple(v) if isinstance(v, list) else v for v in values[key])
        return Preset(**values)
    except (TypeError, ValueError) as exc:
        raise RlsimError(f"{path}: invalid preset ({exc}{'; missing ' + missing[0] if missing else ''})") from None
