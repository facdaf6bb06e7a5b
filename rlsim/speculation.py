"""HistoSpec as an engine feature: each request's tokens per verify step and verification cost.

Speculation is orthogonal to scheduling (`--policy rollpacker+histospec`). A request of a
prompt's first visit gets no drafts. Later visits decode in verify steps that each yield
`rate` tokens on average and put `verify` tokens per sequence under verification, so the
iteration model charges `gamma * N` with N the verified tokens (DESIGN.md, model of time).

Two acceptance sources:
- `parametric`: a per-token acceptance probability `p` (the profile's `spec.acceptance_prob`,
  else 0.75) drives HistoSpec's adaptive draft length (2..16, double on full acceptance, halve
  otherwise) as a Markov chain; its stationary mean gives `rate` and `verify`. The default 0.75
  is the low end of RhymeRL's 75-95% reusable tokens and gives a mean acceptance length of 2.81
  tokens per step, beside Seer's 2.85 for grouped suffix drafting (arXiv 2511.14617).
- `tokens`: when the trace carries `output_token_ids`, the real drafter (`rlsim.drafter`) is
  replayed against each realised response, drafting from the first R0 responses of the same
  prompt's previous visit; the request then runs at its own measured mean rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlsim.drafter import DrafterConfig, SuffixDrafter, replay
from rlsim.errors import RlsimError

DEFAULT_ACCEPTANCE = 0.75
SOURCES = ("auto", "parametric", "tokens")


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """HistoSpec knobs (`--policy sync+histospec(source=parametric,acceptance_prob=0.8)`)."""

    source: str = "auto"  # tokens when the trace has token ids, else parametric
    acceptance_prob: float | None = None  # parametric only; default: profile, else 0.75
    min_draft: int = 2
    max_draft: int = 16
    init_draft: int = 2

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise RlsimError(f"histospec source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.acceptance_prob is not None and not 0.0 <= self.acceptance_prob < 1.0:
            raise RlsimError(f"histospec acceptance_prob must lie in [0, 1), got {self.acceptance_prob}")
        if not 1 <= self.min_draft <= self.init_draft <= self.max_draft:
            raise RlsimError("histospec needs 1 <= min_draft <= init_draft <= max_draft")


def stationary_rate(p: float, min_draft: int = 2, max_draft: int = 16) -> tuple[float, float]:
    """(tokens per verify step, verified tokens per step) of the adaptive draft length at
    per-token acceptance probability p, averaged over the chain's stationary distribution."""
    ks = [min_draft]
    while ks[-1] * 2 <= max_draft:
        ks.append(ks[-1] * 2)
    n = len(ks)
    trans = np.zeros((n, n))
    for i, k in enumerate(ks):
        full = p**k
        trans[i, min(i + 1, n - 1)] += full
        trans[i, max(i - 1, 0)] += 1 - full
    w, v = np.linalg.eig(trans.T)
    pi = np.real(v[:, np.argmin(np.abs(w - 1))])
    pi = pi / pi.sum()
    gain = sum(pi[i] * (k + 1 if p == 1 else (1 - p ** (k + 1)) / (1 - p)) for i, k in enumerate(ks))
    return float(gain), float(sum(pi[i] * (1 + k) for i, k in enumerate(ks)))


class SpecModel:
    """Per-request (rate, verify) for the simulated engine; (1, 1) means no speculation."""

    def __init__(self, config: SpecConfig, profile, trace, samples_per_prompt: int) -> None:  # noqa: ANN001
        self.config = config
        self.first_epoch = trace.epochs[0]
        has_tokens = "output_token_ids" in trace.table.columns
        source = config.source
        if source == "auto":
            source = "tokens" if has_tokens else "parametric"
        if source == "tokens" and not has_tokens:
            raise RlsimError("histospec source=tokens needs a trace with output_token_ids")
        self.source = source
        p = config.acceptance_prob
        if p is None:
            p = float(profile.spec.get("acceptance_prob", DEFAULT_ACCEPTANCE))
        self.acceptance_prob = p
        self.rate, self.verify = stationary_rate(p, config.min_draft, config.max_draft)
        self.drafter_config = DrafterConfig(
            min_draft=config.min_draft, max_draft=config.max_draft, init_draft=config.init_draft
        )
        self.r0 = samples_per_prompt
        if source == "tokens":
            df = trace.table
            keys = zip(df["epoch"].to_numpy(), df["prompt_id"].to_numpy(), df["sample_idx"].to_numpy(), strict=True)
            self.tokens = dict(zip(keys, df["output_token_ids"], strict=True))
            self.drafters: dict[tuple[int, int], SuffixDrafter] = {}

    def _drafter(self, epoch: int, prompt_id: int) -> SuffixDrafter:
        key = (epoch, prompt_id)
        if key not in self.drafters:
            prev = [self.tokens[(epoch - 1, prompt_id, s)] for s in range(self.r0)]
            self.drafters[key] = SuffixDrafter(prev, self.drafter_config)
        return self.drafters[key]

    def plan(self, epoch: int, prompt_id: int, sample_idx: int, target: int) -> tuple[float, float]:
        """(tokens per iteration, verified tokens per iteration) of one request's decode."""
        if epoch == self.first_epoch:
            return 1.0, 1.0
        if self.source == "parametric":
            return self.rate, self.verify
        response = list(self.tokens[(epoch, prompt_id, sample_idx)][:target])
        steps, verified = replay(response, self._drafter(epoch, prompt_id))
        if steps == 0:
            return 1.0, 1.0
        return (len(response) - 1) / steps, verified / steps
