"""Synthetic response token ids whose later visits reuse earlier visits' tokens.

History-based drafting (RhymeRL HistoSpec) works because a prompt's responses in consecutive
epochs are similar: RhymeRL reports 75-95% of tokens reusable from the previous epoch. For small
traces rlsim can attach `output_token_ids` with that property under control, so a drafter can
be run on tokens rather than on an acceptance rate.

Construction: a response on visit 0 is uniform random tokens. On a later visit it alternates
*copied* runs (mean `mean_copy` tokens, taken from a random response of the same prompt's
previous visit at the proportional position) and *fresh* runs of random tokens, with run lengths
chosen so that a fraction `reuse` of tokens is copied. Copies cut short by the end of their
source make the realised fraction slightly lower; it is measured and stored in the metadata.
These tokens are synthetic: they carry the reuse structure, not language.
"""

from __future__ import annotations

import numpy as np

MAX_SYNTHETIC_TOKENS = 20_000_000


def compose_response(
    length: int,
    sources: list[np.ndarray],
    reuse: float,
    rng: np.random.Generator,
    vocab_size: int,
    mean_copy: float = 48.0,
) -> tuple[np.ndarray, int]:
    """One response of `length` tokens; returns the tokens and how many were copied."""
    out = np.empty(length, dtype=np.int32)
    if not sources or reuse <= 0.0:
        out[:] = rng.integers(0, vocab_size, length)
        return out, 0
    mean_fresh = mean_copy * (1.0 - reuse) / reuse
    copying = bool(rng.random() < reuse)
    pos = copied = 0
    while pos < length:
        n = 0
        if copying:
            src = sources[int(rng.integers(len(sources)))]
            start = int(pos * len(src) / length)
            seg = src[start : start + int(rng.geometric(1.0 / mean_copy))][: length - pos]
            n = len(seg)
            out[pos : pos + n] = seg
            pos += n
            copied += n
        # A fresh run follows each copy; an exhausted source forces at least one fresh token.
        if (not copying and mean_fresh > 0) or (copying and n == 0):
            k = int(rng.geometric(min(1.0, 1.0 / mean_fresh))) if mean_fresh > 0 else 1
            k = min(k, length - pos)
            out[pos : pos + k] = rng.integers(0, vocab_size, k)
            pos += k
        copying = not copying
    return out, copied


def synth_token_ids(
    lengths: np.ndarray, reuse: float, vocab_size: int, rng: np.random.Generator
) -> tuple[list[np.ndarray], float]:
    """Token ids for lengths shaped (epochs, prompts, samples), flattened in that order.

    Returns the list of arrays and the realised reuse fraction over visits after the first.
    """
    epochs, prompts, samples = lengths.shape
    total = int(lengths.sum())
    if total > MAX_SYNTHETIC_TOKENS:
        raise ValueError(
            f"synthetic token ids are for small traces: this one would hold {total:,} tokens "
            f"(limit {MAX_SYNTHETIC_TOKENS:,}); use fewer prompts, samples or epochs"
        )
    out: list[np.ndarray] = []
    previous: list[list[np.ndarray]] = [[] for _ in range(prompts)]
    copied = later = 0
    for e in range(epochs):
        current: list[list[np.ndarray]] = []
        for p in range(prompts):
            row = []
            for s in range(samples):
                toks, n = compose_response(int(lengths[e, p, s]), previous[p], reuse, rng, vocab_size)
                row.append(toks)
                if e > 0:
                    copied += n
                    later += len(toks)
            current.append(row)
            out.extend(row)
        previous = current
    return out, (copied / later if later else 0.0)
