"""SortedRL online length-aware scheduling (arXiv 2603.23414): POLICIES.md section 3.

The full text was not available; the mechanism is **[reconstructed]** from the abstract and
public reviews. The engines are oversubscribed with `rollout_batch` prompts; completions arrive
roughly shortest-first, so the first `prompts_per_step` (P0) groups to complete form the update
batch (selective batching in completion order: a micro-curriculum of short groups first), and
training starts long before the whole rollout batch is done.

    loop:
      fill up to rollout_batch prompts: cached (unfinished) prompts first, then new ones, and
          no new prompts while the cache holds more than rollout_batch - P0
      when P0 groups are ready: train on them, sync weights, then
          mode on_policy: abort the rest, keep their prompts cached, regenerate them from scratch
          mode partial:   keep their samples running; drop and regenerate any sample whose
                          staleness would exceed max_staleness

Parameters (the paper's values are not public; defaults are assumptions):
- `rollout_batch`: prompts kept in flight; default None = 2 x P0.
- `mode`: `on_policy` (default; staleness 0, but every update aborts and regenerates what is in
  flight, which wastes many tokens) or `partial` (the abstract's cache-based control of
  off-policyness; staleness <= max_staleness, far less waste).
- `max_staleness`: 1 (partial mode only).
A group that becomes ready beyond the P0 of an update is, in on-policy mode, regenerated after
the update (it is stale); partial mode keeps it while its staleness allows. At the end of the
data the last groups train once every cached prompt is ready. The bias shows as
`trained_length_bias` (short groups train first) and, in partial mode, as staleness.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.groups import GroupCache
from rlsim.errors import RlsimError
from rlsim.protocol import Action, Event, PolicyView, Train

MODES = ("on_policy", "partial")


@dataclass(frozen=True, slots=True)
class SortedRLConfig:
    rollout_batch: int | None = None  # prompts in flight; None = 2 x prompts_per_step
    mode: str = "on_policy"
    max_staleness: int = 1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise RlsimError(f"sortedrl mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.rollout_batch is not None and self.rollout_batch <= 0:
            raise RlsimError("sortedrl rollout_batch must be positive")
        if self.max_staleness < 1:
            raise RlsimError("sortedrl max_staleness must be >= 1 (on_policy mode is staleness 0)")


class SortedRLPolicy:
    """Oversubscribe, train on the first P0 groups to complete, recycle the rest."""

    name = "sortedrl"
    Config = SortedRLConfig

    def __init__(self, **knobs: object) -> None:
        self.config = SortedRLConfig(**knobs)
        self.on_policy = self.config.mode == "on_policy"
        self.cache: GroupCache | None = None
        self.training = False
        self.starved = False

    def on_step_start(self, view: PolicyView) -> list[Action]:
        if self.cache is None:
            self.cache = GroupCache(view.samples_per_prompt)
        cache, p0 = self.cache, view.prompts_per_step
        batch = self.config.rollout_batch or 2 * p0
        self.training = False
        actions: list[Action] = cache.launches()
        self.starved = False
        if len(cache) <= max(batch - p0, 0):
            want = max(batch, p0) - len(cache)
            new = view.take_prompts(want)
            self.starved = len(new) < want
            actions += cache.add(new)
        return actions + self._maybe_train(view)

    def on_event(self, event: Event, view: PolicyView) -> list[Action]:
        if self.cache is None:
            return []
        self.cache.book(event, view)
        return [] if self.training else self._maybe_train(view)

    def _maybe_train(self, view: PolicyView) -> list[Action]:
        cache, p0 = self.cache, view.prompts_per_step
        if not cache.update_due(p0, self.starved):
            return []
        self.training = True
        ids = cache.take_ready(p0)
        if self.on_policy:
            after = cache.restart_all(view, view.version + 1)
        else:
            after = cache.drop_stale(view, view.version + 1, self.config.max_staleness)
        return [*after, Train(tuple(ids))]
