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


class QueueQueries:
    """What the engine asks of a scheduler's queues, for rules that keep them as both ports do
    (`waiting`, `running` by request id, `finishing`, `spec`): a mixin of `RolloutScheduler`'s
    questions, so that the engine reads no scheduler's fields."""

    def has_work(self) -> bool:
        """Whether any request runs or waits."""
        return bool(self.running or self.waiting)

    def running_seq(self, rid: int) -> Seq | None:
        """The running request of this id, or None."""
        return self.running.get(rid)

    def find(self, rid: int) -> Seq | None:
        """The running or waiting request of this id, or None."""
        seq = self.running.get(rid)
        return seq if seq is not None else next((q for q in self.waiting if q.req.request_id == rid), None)

    def holds_finished(self) -> bool:
        """Whether finished requests still hold their place (async scheduling, the overlap loop)."""
        return bool(self.finishing)

    @property
    def num_speculating(self) -> int:
        """Decoding requests under speculation (each pays the drafter's time an iteration)."""
        return len(self.spec)
