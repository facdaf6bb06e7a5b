"""One-step off-policy pipelining (veRL `one_step_off_policy` recipe): POLICIES.md section 5.

Rollout of step t+1 overlaps training of step t: the moment step t's P0 x R0 samples are done,
the next P0 prompts are launched with the current (not yet updated) weights, and training starts.
Every sample after the first step therefore trains one version after it was generated
(staleness 1). The overlap needs rollout and training on different GPUs: under
`--placement disaggregated` the next batch generates during training; under the default
`colocated` placement the engines are paused while training, so the policy behaves like `sync`
with staleness 1 (which is what veRL's recipe would give on a shared pool).
"""

from __future__ import annotations

from rlsim.protocol import Action, EventBatch, Finished, Launch, PolicyView, Train


class OneStepOffPolicy:
    """Launch the next batch when the current one is done, then train the current one."""

    name = "one_step_off"
    quiet = True  # acts only once nothing of the batch it trains is in flight
    on_policy = False

    def __init__(self) -> None:
        self.current: set[int] = set()  # prompts of the batch this step trains
        self.next: list[int] = []  # prompts already launched for the next step
        self.done: list[int] = []
        self.carry: list[int] = []  # finished samples of the next batch
        self.expected = 0
        self.trained = False

    def on_step_start(self, view: PolicyView) -> list[Action]:
        actions: list[Action] = []
        if self.next:
            prompts, self.next = self.next, []
        else:
            prompts = view.take_prompts(view.prompts_per_step)
            actions = [Launch(p, view.samples_per_prompt) for p in prompts]
        self.current = set(prompts)
        self.done, self.carry = self.carry, []
        self.expected = len(prompts) * view.samples_per_prompt
        self.trained = False
        return actions + self._maybe_train(view)

    def on_events(self, batch: EventBatch, view: PolicyView) -> list[Action]:
        actions: list[Action] = []
        for ev in batch:
            if type(ev) is not Finished:
                continue
            rid = ev.request_id
            if not self.trained and view.request(rid).prompt_id in self.current:
                self.done.append(rid)
                actions += self._maybe_train(view)
            else:
                self.carry.append(rid)  # a sample of the next batch
        return actions

    def _maybe_train(self, view: PolicyView) -> list[Action]:
        if self.trained or not self.expected or len(self.done) < self.expected:
            return []
        self.trained = True
        self.next = view.take_prompts(view.prompts_per_step)
        launches: list[Action] = [Launch(p, view.samples_per_prompt) for p in self.next]
        return [*launches, Train(tuple(self.done))]
