"""k-step off-policy pipelining (NeMo RL async GRPO's `max_trajectory_age_steps`; veRL's
`one_step_off_policy` recipe at k = 1; docs/policies.md).

Batches of P0 prompts are trained in order, batch j at step j. Batch j is launched as soon as
batch j - k has finished generating (at the start for j < k), with the weights of that moment, so
no sample trains more than k versions after its launch. At k = 1 this is veRL's one-step-off
recipe (and NeMo RL's default, whose refit waits for the generations in flight): the moment step
t's P0 x R0 samples are done, the next P0 prompts are launched with the current (not yet updated)
weights, and training starts; every sample after the first step trains one version after it was
generated (staleness 1). `one_step_off` is `k_step_off(k=1)`, not a second implementation.

The overlap needs rollout and training on different GPUs: under `--placement disaggregated` the
next batches generate during training; under the default `colocated` placement the engines are
paused while training, so the policy behaves like `sync` with staleness k (which is what these
recipes would give on a shared pool).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlsim.errors import RlsimError
from rlsim.protocol import Action, EventBatch, Finished, Launch, PolicyView, Train


@dataclass(frozen=True, slots=True)
class KStepOffConfig:
    k: int = 1  # max_trajectory_age_steps

    def __post_init__(self) -> None:
        if self.k < 1:
            raise RlsimError("k_step_off k (max_trajectory_age_steps) must be >= 1")


class KStepOffPolicy:
    """Launch batch j once batch j - k is done; train the batches in order."""

    name = "k_step_off"
    on_policy = False
    Config = KStepOffConfig

    def __init__(self, **knobs: object) -> None:
        self.config = KStepOffConfig(**knobs)
        # k = 1 acts only once nothing of the batch it trains is in flight (a quiet policy: the
        # engine may run the whole batch in one step); with k > 1 later batches are in flight
        # when the current one completes
        self.quiet = self.config.k == 1
        self.current: set[int] = set()  # prompts of the batch this step trains
        self.ahead: list[list[int]] = []  # prompts of the batches launched after it, in order
        self.done: list[int] = []
        self.carry: list[tuple[int, int]] = []  # (prompt, request) finished for a later batch, in order
        self.expected = 0
        self.trained = False

    def on_step_start(self, view: PolicyView) -> list[Action]:
        actions: list[Action] = []
        if self.ahead:
            prompts = self.ahead.pop(0)
        else:
            prompts = view.take_prompts(view.prompts_per_step)
            actions = [Launch(p, view.samples_per_prompt) for p in prompts]
        while len(self.ahead) < self.config.k - 1:  # batches j < k launch at the start
            more = view.take_prompts(view.prompts_per_step)
            if not more:
                break
            self.ahead.append(more)
            actions += [Launch(p, view.samples_per_prompt) for p in more]
        self.current = set(prompts)
        self.done = [r for p, r in self.carry if p in self.current]  # in finish order
        self.carry = [(p, r) for p, r in self.carry if p not in self.current]
        self.expected = len(prompts) * view.samples_per_prompt
        self.trained = False
        return actions + self._maybe_train(view)

    def on_events(self, batch: EventBatch, view: PolicyView) -> list[Action]:
        actions: list[Action] = []
        for ev in batch:
            if type(ev) is not Finished:
                continue
            rid = ev.request_id
            prompt = view.request(rid).prompt_id
            if not self.trained and prompt in self.current:
                self.done.append(rid)
                actions += self._maybe_train(view)
            else:
                self.carry.append((prompt, rid))  # a sample of a later batch
        return actions

    def _maybe_train(self, view: PolicyView) -> list[Action]:
        if self.trained or not self.expected or len(self.done) < self.expected:
            return []
        self.trained = True
        nxt = view.take_prompts(view.prompts_per_step)
        launches: list[Action] = [Launch(p, view.samples_per_prompt) for p in nxt]
        if nxt:
            self.ahead.append(nxt)
        return [*launches, Train(tuple(self.done))]


class OneStepOffPolicy(KStepOffPolicy):
    """veRL's one_step_off_policy recipe: the next batch generates while this one trains."""

    name = "one_step_off"
    quiet = True  # k = 1
    same_as = "k_step_off(k=1)"  # `rlsim policies` says so
    Config = None  # (k is fixed: use k_step_off(k=...) for more)

    def __init__(self) -> None:
        super().__init__(k=1)
