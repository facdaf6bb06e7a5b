"""The HistoSpec drafter (RhymeRL, arXiv 2508.18588): draft tokens from a prompt's earlier responses.

Pure Python with no simulator or vLLM import, so the same class serves the simulator (replayed
against a trace's `output_token_ids`) and a real vLLM engine (behind its `custom_class`
speculative hook). Per prompt it indexes the responses of the prompt's most recent visit. At each
verify step the pattern is the request's last 7 tokens; suffix lengths 7, 6, 5, 4 are tried
longest first. From the matching positions it follows the most frequent continuation token by
token (a walk down the suffix tree of the history) while the running probability of the path
stays >= 0.1, stopping at a stop token or at the request's current draft length.

The draft length adapts per request (`AdaptiveDraftLength`): it starts at 2, stays in 2..16,
doubles when every draft token was accepted and halves otherwise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DrafterConfig:
    """HistoSpec's drafting knobs, with the released code's values as defaults."""

    min_match: int = 4
    max_match: int = 7
    min_prob: float = 0.1
    min_draft: int = 2
    max_draft: int = 16
    init_draft: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.min_match <= self.max_match:
            raise ValueError("need 1 <= min_match <= max_match")
        if not 1 <= self.min_draft <= self.init_draft <= self.max_draft:
            raise ValueError("need 1 <= min_draft <= init_draft <= max_draft")
        if not 0.0 <= self.min_prob <= 1.0:
            raise ValueError("min_prob must lie in [0, 1]")


class SuffixDrafter:
    """Drafts continuations of a token context from one prompt's earlier responses."""

    def __init__(
        self,
        responses: Iterable[Sequence[int]],
        config: DrafterConfig | None = None,
        stop_tokens: Iterable[int] = (),
    ) -> None:
        self.config = config or DrafterConfig()
        self.stop_tokens = frozenset(stop_tokens)
        self.seqs = [list(r) for r in responses]
        # n-gram -> positions (sequence, index of the token that follows the n-gram)
        self.index: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        lo, hi = self.config.min_match, self.config.max_match
        for i, seq in enumerate(self.seqs):
            for end in range(lo, len(seq) + 1):
                for n in range(lo, min(hi, end) + 1):
                    self.index.setdefault(tuple(seq[end - n : end]), []).append((i, end))

    def propose(self, context: Sequence[int], max_draft: int) -> list[int]:
        """Up to `max_draft` draft tokens continuing `context` (possibly none)."""
        cfg = self.config
        cands: list[tuple[int, int]] | None = None
        for n in range(cfg.max_match, cfg.min_match - 1, -1):
            if len(context) >= n:
                cands = self.index.get(tuple(context[len(context) - n :]))
                if cands:
                    break
        if not cands:
            return []
        draft: list[int] = []
        prob = 1.0
        seqs = self.seqs
        while len(draft) < max_draft and cands:
            counts = Counter(seqs[i][j] for i, j in cands if j < len(seqs[i]))
            if not counts:
                break
            tok, c = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))  # most frequent, then smallest id
            prob *= c / len(cands)
            if prob < cfg.min_prob:
                break
            draft.append(tok)
            if tok in self.stop_tokens:
                break
            cands = [(i, j + 1) for i, j in cands if j < len(seqs[i]) and seqs[i][j] == tok]
        return draft


class AdaptiveDraftLength:
    """HistoSpec's per-request draft length: double on full acceptance, halve otherwise."""

    def __init__(self, config: DrafterConfig | None = None) -> None:
        self.config = config or DrafterConfig()
        self.k = self.config.init_draft

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        cfg = self.config
        self.k = min(2 * self.k, cfg.max_draft) if accepted == proposed else max(self.k // 2, cfg.min_draft)


def replay(response: Sequence[int], drafter: SuffixDrafter | None, start: int = 1) -> tuple[int, int]:
    """Verify steps and verified tokens to generate `response[start:]` with HistoSpec drafting.

    Greedy view of lossless verification: a draft token is accepted while it equals the realised
    next token; every verify step also yields one token from the target model (the bonus or the
    correction). Returns (verify steps, tokens processed by the target model over those steps).
    """
    steps = verified = 0
    pos = start
    length = AdaptiveDraftLength(drafter.config if drafter else None)
    hi = drafter.config.max_match if drafter else 0
    while pos < len(response):
        draft = drafter.propose(response[max(0, pos - hi) : pos], length.k) if drafter else []
        acc = 0
        while acc < len(draft) and pos + acc < len(response) and draft[acc] == response[pos + acc]:
            acc += 1
        steps += 1
        verified += 1 + len(draft)
        pos += acc + 1
        length.update(len(draft), acc)
    return steps, verified
