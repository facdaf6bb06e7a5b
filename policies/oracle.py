"""Oracle packing: a lower bound for a synchronous step, NOT a real policy (docs/policies.md).

The only policy allowed to read response lengths before they are generated (`oracle = True`
unlocks `view.oracle_lengths`). Each step it takes the same P0 prompts as `sync`, launches the
same P0 x R0 samples and trains on all of them, but places every sample on an instance by
longest-processing-time first (LPT) with the profile's cost model: samples in decreasing length,
each to the instance with the least predicted time so far. An instance's predicted time for
samples of lengths L_j with prompts P_j is

    t_w * max(max_j L_j, sum_j L_j / c) + (alpha + gamma) * sum_j L_j + beta * sum_j (P_j L_j + L_j^2 / 2)

(the iteration model summed over the iterations of a batch that shrinks as samples finish), with
c the concurrency the instance can hold (`max_num_seqs`, or how many samples' final KV fit). Longer
samples are also launched first so FCFS admission starts them first. It bounds what knowing
lengths buys a synchronous step; asynchronous policies can beat it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from rlsim.protocol import Action, EventBatch, Finished, Launch, PolicyView, Train


@dataclass
class _Load:
    """One instance's assigned samples, summarised for the predicted-time formula."""

    longest: float = 0.0
    tokens: float = 0.0
    ctx: float = 0.0  # sum of P*L + L^2/2
    kv: float = 0.0  # sum of final KV (P + L)
    count: int = 0

    def add(self, length: int, prompt: int, prof) -> float:  # noqa: ANN001 - a Profile
        self.longest = max(self.longest, length)
        self.tokens += length
        self.ctx += prompt * length + length * length / 2
        self.kv += prompt + length
        self.count += 1
        conc = max(1.0, min(prof.engine.max_num_seqs, prof.kv_capacity_tokens * self.count / self.kv))
        return (
            prof.t_w_s * max(self.longest, self.tokens / conc)
            + (prof.alpha_s + prof.gamma_s) * self.tokens
            + prof.beta_s * self.ctx
        )


class OraclePolicy:
    """Synchronous steps with perfect length knowledge and LPT placement."""

    name = "oracle"
    quiet = True  # acts only once nothing of the batch it trains is in flight
    on_policy = True
    oracle = True

    def __init__(self) -> None:
        self.done: list[int] = []
        self.expected = 0

    def on_step_start(self, view: PolicyView) -> list[Action]:
        r0 = view.samples_per_prompt
        prompts = view.take_prompts(view.prompts_per_step)
        self.done, self.expected = [], len(prompts) * r0
        lengths = {p: [min(x, view.max_response_len) for x in view.oracle_lengths(p)[:r0]] for p in prompts}
        work = sorted(((n, p, s) for p in prompts for s, n in enumerate(lengths[p])), key=lambda x: (-x[0], x[1], x[2]))
        prof = view.profile
        loads = [_Load() for _ in range(view.num_instances)]
        heap = [(0.0, i) for i in range(view.num_instances)]
        where: dict[tuple[int, int], int] = {}
        for length, p, s in work:  # LPT: next longest sample to the least loaded instance
            _, i = heapq.heappop(heap)
            where[(p, s)] = i
            heapq.heappush(heap, (loads[i].add(length, view.prompt_tokens(p), prof), i))
        # The driver numbers a prompt's samples in launch order, so each prompt launches its
        # samples in order; prompts go longest first so FCFS admission starts long work first.
        order = sorted(prompts, key=lambda p: (-max(lengths[p], default=0), p))
        actions: list[Action] = [
            Launch(p, len(lengths[p]), instance=tuple(where[(p, s)] for s in range(len(lengths[p])))) for p in order
        ]
        return actions

    def on_events(self, batch: EventBatch, view: PolicyView) -> list[Action]:
        before = len(self.done)
        self.done.extend(ev.request_id for ev in batch if type(ev) is Finished)
        if before < self.expected == len(self.done):
            return [Train(tuple(self.done))]
        return []
