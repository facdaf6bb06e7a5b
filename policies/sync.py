"""Synchronous baseline (veRL-style, on-policy; docs/policies.md).

Each step takes the next `prompts_per_step` (P0) prompts of the epoch order (shuffled once per
epoch, seeded by the driver), launches `samples_per_prompt` (R0) samples of each, spreads them
over the rollout instances by the driver's dispatch rule (each sample to the least-loaded
instance by default, as veRL's agent loop sends it), waits for all
P0 x R0 to finish (EOS or `max_response_len`), then trains on all of them. Nothing is aborted,
nothing is stale: its rollout bubble is the reference every other policy is measured against.
The last step of an epoch takes whatever prompts remain, so every prompt trains once per epoch.

It acts on nothing before its last sample finishes (`quiet`), so the engine runs a step's
rollout to its end in one `step(until_idle=True)` and the policy counts the batch's finishes.
"""

from __future__ import annotations

from rlsim.protocol import Action, EventBatch, Finished, Launch, PolicyView, Train


class SyncPolicy:
    """Launch P0 x R0, wait for all, train on all."""

    name = "sync"
    on_policy = True
    quiet = True  # acts only once nothing it launched is in flight

    def __init__(self) -> None:
        self._pending: set[int] = set()
        self._done: list[int] = []
        self._expected = 0

    def on_step_start(self, view: PolicyView) -> list[Action]:
        prompts = view.take_prompts(view.prompts_per_step)
        self._done = []
        self._expected = len(prompts) * view.samples_per_prompt
        return [Launch(p, view.samples_per_prompt) for p in prompts]

    def on_events(self, batch: EventBatch, view: PolicyView) -> list[Action]:
        before = len(self._done)
        self._done.extend(ev.request_id for ev in batch if type(ev) is Finished)
        if before < self._expected == len(self._done):
            return [Train(tuple(self._done))]
        return []
