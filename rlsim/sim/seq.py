"""Seq and Scheduled: one request's scheduling state, and one iteration's batch.

A decoding `Seq` keeps its token counts as of `start_iter` and advances by `rate` a step without
being touched (`RunningList.computed`, `.generated`); `finish_iter` is when it samples its last token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsim.protocol import Request


@dataclass(slots=True)
class Seq:
    req: Request
    target: int  # tokens to generate: min(trace length, max_tokens)
    generated: int = 0  # output tokens (decoding: at start_iter)
    computed: int = 0  # tokens whose KV is computed (decoding: at start_iter)
    start_iter: int = 0
    finish_iter: int = 0
    decoding: bool = False
    rate: float = 1.0  # tokens per decode iteration (> 1 under speculative decoding)
    verify: float = 1.0  # tokens computed per decode iteration
    hashed: list = field(default_factory=list)  # cached slabs heading its block table
    num_hashed_blocks: int = 0  # blocks they cover
    order: int = 0  # position in the running list (admission order)
    prompt_blocks: int = 0  # full prompt blocks (its prompt's hash chain)
    lookahead: int = 0  # KV slots reserved past its tokens while it speculates (vLLM's lookahead)
    held_lookahead: int = 0  # lookahead slots it holds now (from the end of its prefill)
    transfer: bool = False  # its KV arrives from elsewhere at admission (a continued chunk)
    reported: bool = False  # async scheduling: finished and reported, its slot held until the next schedule


def count_hits(sched, seq: Seq) -> None:  # noqa: ANN001 - a RolloutScheduler
    """A request admitted with `seq.computed` tokens from the prefix cache: the counters a run
    reports (prompt tokens saved; a later turn's context and how much of it hit)."""
    sched.ctx += seq.computed
    sched.prefix_hit_tokens += seq.computed
    if seq.req.prompt_len and not seq.transfer:
        sched.turn_tokens += seq.req.num_prompt_tokens + seq.generated
        sched.turn_hit_tokens += seq.computed


@dataclass(slots=True)
class Scheduled:
    """One iteration's batch."""

    decode_tokens: float = 0.0
    prefill_tokens: int = 0
    num_decodes: int = 0
    chunks: list = field(default_factory=list)  # (seq, tokens) of prefill chunks
    preempted: list = field(default_factory=list)
    blocked_by_kv: bool = False  # a waiting request did not fit
