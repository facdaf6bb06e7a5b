"""RollPacker tail batching (arXiv 2509.21009, NSDI'26; github.com/Farrrrland/RollPacker).

docs/policies.md. Short rounds speculate on prompts and responses and keep only the fastest;
prompts that lose the race queue up and run together in a long round.

    long_queue = insertion-ordered set of prompts that lost a race
    step start:
      if len(long_queue) >= P0:                 LONG ROUND
          oldest P0 of long_queue (shuffled); R0 samples each, restarted from scratch; wait for all
      else:                                     SHORT ROUND
          next int(eta_p * P0) dataset prompts, all added to long_queue; ceil(eta_r * R0) samples each
          when a prompt has R0 finished samples: if fewer than P0 prompts are complete, mark it
              complete (its first R0 samples) and take it off long_queue; abort its other samples
          when P0 prompts are complete: abort every in-flight request; the rest stay queued
      train on exactly P0 x R0 samples, all from the current weights (on-policy)

Parameters: `eta_p` and `eta_r`, both 1.25 as in the paper (the artifact runs 10 responses for
R0 = 8), `seed` for the long round's shuffle. With eta_p = 1.25 a short round queues at most
0.25 x P0 prompts, so the period is 4 short rounds then 1 long round. Aborted prompts restart
from scratch in the long round (their partial tokens count as `wasted_tokens`); a short round
keeps a prompt's fastest R0 of its eta_r x R0 samples, which shows as `trained_length_bias` < 1.
When the epoch's data runs out, its last new prompts join the queue and everything drains in
long rounds of at most P0 prompts (the next epoch starts once every prompt has trained).
Not modelled: reward scheduling, the parallelism planner, the stream trainer, and the optional
DAPO dynamic-sampling filter (paper section 7).
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass

from rlsim.errors import RlsimError
from rlsim.protocol import Abort, Action, Event, EventBatch, Finished, Launch, PolicyView, Train


@dataclass(frozen=True, slots=True)
class RollPackerConfig:
    eta_p: float = 1.25
    eta_r: float = 1.25
    seed: int = 0

    def __post_init__(self) -> None:
        if self.eta_p < 1 or self.eta_r < 1:
            raise RlsimError(f"rollpacker eta_p and eta_r must be >= 1, got {self.eta_p}, {self.eta_r}")


class RollPackerPolicy:
    """Short rounds race eta_p*P0 prompts x eta_r*R0 samples; losers batch into long rounds."""

    name = "rollpacker"
    on_policy = True
    Config = RollPackerConfig

    def __init__(self, **knobs: object) -> None:
        self.config = RollPackerConfig(**knobs)
        self.rng = random.Random(self.config.seed)
        self.long_queue: dict[int, None] = {}  # insertion-ordered set
        self.round_prompts: set[int] = set()
        self.finished: dict[int, list[int]] = {}
        self.complete: dict[int, list[int]] = {}
        self.target = 0
        self.long_round = False
        self.trained = False
        self.short: dict[int, int] = {}  # round prompts: finished samples short of R0 (`quiet_for`)

    def on_step_start(self, view: PolicyView) -> list[Action]:
        p0, r0 = view.prompts_per_step, view.samples_per_prompt
        self.finished, self.complete, self.trained, self.short = {}, {}, False, {}
        if len(self.long_queue) >= p0:
            return self._long_round(list(self.long_queue)[:p0], r0)
        want = int(self.config.eta_p * p0)
        prompts = view.take_prompts(want)
        if len(prompts) < want:  # the epoch's data runs out: drain new and queued prompts in long rounds
            self.long_queue.update(dict.fromkeys(prompts))
            return self._long_round(list(self.long_queue)[:p0], r0) if self.long_queue else []
        self.long_round = False
        self.long_queue.update(dict.fromkeys(prompts))
        self.round_prompts = set(prompts)
        self.short = dict.fromkeys(prompts, r0)
        self.target = min(p0, len(prompts))
        n = math.ceil(self.config.eta_r * r0)
        return [Launch(p, n) for p in prompts]

    def _long_round(self, prompts: list[int], r0: int) -> list[Action]:
        for p in prompts:
            del self.long_queue[p]
        self.rng.shuffle(prompts)
        self.long_round = True
        self.round_prompts = set(prompts)
        self.short = dict.fromkeys(prompts, r0)
        self.target = len(prompts)
        return [Launch(p, r0, restart=True) for p in prompts]

    def on_event(self, event: Event, view: PolicyView) -> list[Action]:
        if not isinstance(event, Finished) or self.trained:
            return []
        self.on_quiet_events((event,), view)  # booked as a batch's events are
        p, r0 = view.request(event.request_id).prompt_id, view.samples_per_prompt
        done = self.finished.get(p)
        if not done or done[-1] != event.request_id or len(done) != r0:
            return []  # a sample of an earlier round, or one before (or past) its prompt's R0-th
        del self.short[p]
        actions: list[Action] = []
        if len(self.complete) < self.target:
            self.complete[p] = done[:r0]
            self.long_queue.pop(p, None)
        rest = view.in_flight(p)
        if rest:
            actions.append(Abort(tuple(rest)))
        if len(self.complete) == self.target:
            self.trained = True
            others = [r for q in self.round_prompts for r in view.in_flight(q) if q != p]
            if others:
                actions.append(Abort(tuple(others)))
            actions.append(Train(tuple(r for ids in self.complete.values() for r in ids)))
        return actions

    def on_quiet_events(self, batch: EventBatch, view: PolicyView) -> None:
        """Book these finishes (`on_event` books each one here, then decides): a round prompt's
        sample of this round joins its finished samples, and the prompt's count short of R0
        moves. Told as one batch, they are the finishes `quiet_for` covers: none is a round
        prompt's R0-th."""
        if self.trained:
            return
        rounds, finished, short, request, version = (
            self.round_prompts, self.finished, self.short, view.request, view.version
        )
        r0 = view.samples_per_prompt
        for ev in batch:
            if type(ev) is not Finished:
                continue
            info = request(ev[0])
            p = info.prompt_id
            if p not in rounds or info.policy_version != version:
                continue  # a sample of an earlier round
            done = finished.setdefault(p, [])
            done.append(ev[0])
            if len(done) < r0:
                short[p] = r0 - len(done)

    def quiet_for(self, view: PolicyView) -> dict[int, int] | int:
        """Finishes this policy answers nothing to (`Policy.quiet_for`), prompt by prompt: it acts
        only when a round prompt's R0-th sample finishes, so on none of a prompt's finishes before
        as many as it is short of; until then a finish only books its sample. Once trained it
        answers nothing at all. (The engine reads the mapping while it steps; it is this policy's
        own, not a copy.)"""
        return sys.maxsize if self.trained else self.short
