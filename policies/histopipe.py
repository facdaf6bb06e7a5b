"""RhymeRL HistoPipe (arXiv 2508.18588, ASPLOS'26): history-guided placement (docs/policies.md).

A prompt's responses look alike from one epoch to the next, so its previous visit predicts how
long this visit will run. Tier 1 (confirmed in outline) balances instances within a step and is
the default (on-policy, so it compares fairly with the per-sample least-loaded `sync`); tier 2
(**[reconstructed]**, no source, knob `cross_step`, off by default) pipelines the long tail into
the next step; `one_step_off` is the configuration RhymeRL ran (papers citing it, RLBoost and
RollPacker, describe it as one-step off-policy): step t+1's prompts are placed and launched when
step t's rollout ends, so with rollout and training on separate GPUs
(`--placement disaggregated`) the next rollout overlaps this training. Its published speedups
(about 1.43x from HistoPipe, 1.56x with the second tier; secondhand) are against veRL v0.4.1
on separate rollout and training GPUs, i.e. `sync` under the same disaggregated placement.

    tier 1, each step (on-policy):
      predicted_len[p] = mean length of p's samples at its previous visit; on a first visit the
          running mean of lengths seen so far (`first_visit=mean`) or max_response_len (`long`)
      sort the step's prompts by predicted_len; split them into `num_groups` ranking groups
      give each group k_g instances so that all groups finish together: the smallest makespan T
          with sum_g k_g(T) <= instances, k_g(T) the fewest instances on which the profile's
          cost model predicts group g finishes by T (binary search on T); spare instances go to
          the slowest group; a group's samples are spread round-robin over its instances
    one_step_off: at step t's update, take and place step t+1's prompts (tier 1) and launch
      them before training; every sample trains one version after its launch (staleness 1)
    tier 2, across steps (`cross_step`, default off; one-step off-policy; reconstructed):
      train once the previous step's carried groups are complete and a share
          1 - tail_fraction of this step's groups is complete; the unfinished groups keep
          running and train in the next step (staleness 1); the next step places its longest
          groups on the instances with the least carried work, so an instance pairs long and
          short load over two steps

Parameters: `num_groups` 4, `first_visit` mean, `cross_step` False, `tail_fraction` 0.1 (the
paper's tail share is not public: an assumption), `one_step_off` False (exclusive with
`cross_step`). Not modelled: migrating a request that runs past its prediction to another
instance (sources say only that outliers are re-prefilled elsewhere).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from rlsim.errors import RlsimError
from rlsim.protocol import Action, Event, EventBatch, Finished, Launch, PolicyView, Train


@dataclass(frozen=True, slots=True)
class HistoPipeConfig:
    num_groups: int = 4
    first_visit: str = "mean"
    cross_step: bool = False
    tail_fraction: float = 0.1
    one_step_off: bool = False

    def __post_init__(self) -> None:
        if self.num_groups < 1:
            raise RlsimError("histopipe num_groups must be >= 1")
        if self.first_visit not in ("mean", "long"):
            raise RlsimError(f"histopipe first_visit must be mean or long, got {self.first_visit!r}")
        if not 0 <= self.tail_fraction < 1:
            raise RlsimError("histopipe tail_fraction must lie in [0, 1)")
        if self.cross_step and self.one_step_off:
            raise RlsimError("histopipe cross_step and one_step_off are two ways to overlap steps: pick one")


def group_cost(profile, lengths: list[float], prompt_tokens: list[int]):  # noqa: ANN001, ANN201
    """k -> predicted time of samples with these lengths spread over k instances (the iteration
    model summed over a batch that shrinks as samples finish; concurrency capped by
    max_num_seqs and by how many samples' final KV the capacity holds)."""
    tokens = sum(lengths)
    ctx = sum(p * n + n * n / 2 for p, n in zip(prompt_tokens, lengths, strict=True))
    mean_kv = (sum(prompt_tokens) + tokens) / max(len(lengths), 1)
    conc = max(1.0, min(profile.engine.max_num_seqs, profile.kv_capacity_tokens / max(mean_kv, 1.0)))
    longest = max(lengths, default=0.0)
    per_token = (profile.alpha_s + profile.gamma_s) * tokens + profile.beta_s * ctx

    def cost(k: int) -> float:
        return profile.t_w_s * max(longest, tokens / (k * conc)) + per_token / k

    return cost


def allocate(costs: list, n: int) -> list[int]:  # noqa: ANN001 - callables k -> predicted time
    """Instances per group minimising the predicted makespan, summing to n (n >= len(costs))."""

    def need(f, bound: float) -> int:  # noqa: ANN001
        lo, hi = 1, n
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if f(mid) <= bound else (mid + 1, hi)
        return lo

    lo, hi = 0.0, max(f(1) for f in costs)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if sum(need(f, mid) for f in costs) <= n else (mid, hi)
    ks = [need(f, hi) for f in costs]
    while sum(ks) > n:  # rounding at the bound: take from the group that suffers least
        i = min((j for j in range(len(ks)) if ks[j] > 1), key=lambda j: costs[j](ks[j] - 1))
        ks[i] -= 1
    while sum(ks) < n:
        i = max(range(len(ks)), key=lambda j: costs[j](ks[j]))
        ks[i] += 1
    return ks


class HistoPipePolicy:
    """Place ranking groups of predicted length so they finish together; pipeline the tail."""

    name = "histopipe"
    Config = HistoPipeConfig

    def __init__(self, **knobs: object) -> None:
        self.config = HistoPipeConfig(**knobs)
        self.on_policy = not (self.config.cross_step or self.config.one_step_off)
        self.next: list[int] = []  # one_step_off: prompts launched for the next step
        self.current: set[int] = set()
        self.carried: set[int] = set()
        self.done: dict[int, list[int]] = {}
        self.need_current = 0
        self.complete: list[int] = []  # prompts of this step whose group finished, in order
        self.seen_tokens = self.seen_samples = 0
        self.trained = False

    def _predict(self, view: PolicyView, p: int) -> float:
        hist = view.history(p)
        if hist:
            return sum(hist) / len(hist)
        if self.config.first_visit == "mean" and self.seen_samples:
            return self.seen_tokens / self.seen_samples
        return float(view.max_response_len)

    def on_step_start(self, view: PolicyView) -> list[Action]:
        self.trained = False
        if self.next:  # one_step_off: launched during the previous step's training
            prompts, self.next = self.next, []
            actions: list[Action] = []
        else:
            prompts = view.take_prompts(view.prompts_per_step)
            actions = self._place(view, prompts)
        r0 = view.samples_per_prompt
        self.current = set(prompts)
        self.complete = [p for p in prompts if len(self.done[p]) >= r0]
        tail = self.config.tail_fraction if self.config.cross_step and len(prompts) == view.prompts_per_step else 0
        self.need_current = len(prompts) - math.floor(tail * len(prompts))
        return actions + (self._maybe_train(view) if not prompts or self.complete else [])

    def _place(self, view: PolicyView, prompts: list[int]) -> list[Action]:
        """Tier 1: ranking groups of predicted length, each on as many instances as make all
        groups finish together."""
        r0, n = view.samples_per_prompt, view.num_instances
        for p in prompts:
            self.done[p] = []
        if not prompts:
            return []
        pred = {p: min(self._predict(view, p), view.max_response_len) for p in prompts}
        ranked = sorted(prompts, key=lambda p: (-pred[p], p))
        g = min(self.config.num_groups, n, len(ranked))
        groups = [ranked[i * len(ranked) // g : (i + 1) * len(ranked) // g] for i in range(g)]
        costs = [
            group_cost(
                view.profile,
                [pred[p] for p in grp for _ in range(r0)],
                [view.prompt_tokens(p) for p in grp for _ in range(r0)],
            )
            for grp in groups
        ]
        ks = allocate(costs, n)
        # Longest groups on the instances with the least carried work (tier 2 pairs loads).
        carried_load = [0] * n
        for p in self.carried | self.current:
            for r in view.in_flight(p):
                carried_load[view.request(r).instance] += 1
        instances = sorted(range(n), key=lambda i: (carried_load[i], i))
        actions: list[Action] = []
        start = 0
        for grp, k in zip(groups, ks, strict=True):
            mine = instances[start : start + k]
            start += k
            for j, p in enumerate(grp):
                actions.append(Launch(p, r0, instance=tuple(mine[(j * r0 + s) % k] for s in range(r0))))
        return actions

    def on_event(self, event: Event, view: PolicyView) -> list[Action]:
        if not isinstance(event, Finished):
            return []
        self.on_quiet_events((event,), view)  # booked as a batch's events are
        return [] if self.trained else self._maybe_train(view)

    def on_quiet_events(self, batch: EventBatch, view: PolicyView) -> None:
        """Book these finishes (`on_event` books each one here, then decides): each counts, and
        joins its group where it is one of this step's, a carried one's or (one_step_off) the
        next step's. Told as one batch, they are the finishes `quiet_for` covers: none makes an
        update due."""
        done, current, complete, request = self.done, self.current, self.complete, view.request
        r0, trained = view.samples_per_prompt, self.trained
        for ev in batch:
            if type(ev) is not Finished:
                continue
            self.seen_tokens += ev[3]
            self.seen_samples += 1
            p = request(ev[0]).prompt_id
            got = done.get(p)
            if got is not None:  # this step's, a carried one's, or (one_step_off) the next step's
                got.append(ev[0])
                if p in current and len(got) == r0 and not trained:
                    complete.append(p)

    def quiet_for(self, view: PolicyView) -> int:
        """Finishes this policy answers nothing to (`Policy.quiet_for`): it trains once
        `need_current` of this step's groups are complete and every carried group is, and a
        finish completes at most one group and adds one sample to one group, so neither comes
        sooner than the groups still needed, or the carried groups' missing samples. Once
        trained it answers nothing at all."""
        if self.trained:
            return sys.maxsize
        need = self.need_current - len(self.complete)
        if need > 1:
            return need
        r0, done = view.samples_per_prompt, self.done
        return max(1, need, sum(max(0, r0 - len(done[p])) for p in self.carried))

    def _maybe_train(self, view: PolicyView) -> list[Action]:
        r0 = view.samples_per_prompt
        if any(len(self.done[p]) < r0 for p in self.carried):
            return []
        complete = self.complete
        if len(complete) < self.need_current or not (complete or self.carried):
            return []
        self.trained = True
        batch = [*self.carried, *complete]
        ids = tuple(r for p in batch for r in self.done.pop(p)[:r0])
        self.carried = self.current - set(complete)
        self.current = set()
        if self.config.one_step_off:  # the next batch generates while this one trains
            self.next = view.take_prompts(view.prompts_per_step)
            return [*self._place(view, self.next), Train(ids)]
        return [Train(ids)]
