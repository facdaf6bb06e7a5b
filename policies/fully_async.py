"""veRL's fully-async policy: a streaming rollouter and a trainer of local updates (docs/policies.md).

veRL `recipe/fully_async_policy` (https://github.com/volcengine/verl/tree/main/recipe/fully_async_policy,
after AReaL arXiv 2505.24298, StreamRL arXiv 2504.15930, AsyncFlow arXiv 2507.01663), with its knob
names. Rollout and training run on separate GPUs (`--placement disaggregated --train-gpus N`).
A "sample" is one prompt with its R0 responses (a GRPO group), the unit veRL streams.

    required_samples     = ppo_mini_batch_size * require_batches
    max_required_samples = required_samples * (1 + staleness_threshold) * trigger_parameter_sync_step
    rollouter: take prompts one at a time while fewer than max_concurrent_samples are in flight
               and staleness_samples < max_required_samples; each taken prompt adds one to
               staleness_samples; a group whose R0 responses finished goes to the queue
    trainer:   each local update takes the first required_samples groups of the queue (an rlsim
               step); every trigger_parameter_sync_step-th update syncs the weights:
               partial_rollout (and staleness_threshold > 0): the engines stop at once, requests in
               flight keep their tokens and continue under the new weights (prompt and kept tokens
               prefilled again); otherwise new work is held until the requests in flight finish
    at a sync:  staleness_samples = groups in flight + groups in the queue

`max_concurrent_samples` defaults to 16 per rollout instance (veRL: 16 per server), capped at
max_required_samples; `ppo_mini_batch_size` defaults to P0 / (require_batches x
trigger_parameter_sync_step), rounded up, so that one sync consumes P0 prompts (veRL's rule for a fair
comparison with a synchronous run). `use_rollout_log_probs` (veRL's default in this mode) trains
on the engine's log-probs, so no old log-prob pass runs; `checkpoint_engine` moves the weights in
`device_buffer_size_M` buckets (`rlsim.step_costs.weight_sync_s`). An epoch's prompts are handed
out only once every prompt of the previous epoch trained (rlsim's data order), and the last groups
of the data train as a short update.

Metrics (veRL's names), per local update: `fully_async/param_version` (syncs done),
`fully_async/count/stale_samples_processed` and `.../stale_trajectory_processed` (running totals
of groups and responses trained whose first token came from weights older than the trainer's last
sync), `fully_async/partial/total_partial_num`, `.../partial_ratio` and `.../max_partial_span`
(responses of this update whose generation spanned a sync, their share, the most syncs one
spanned), `fully_async/count/staleness_samples` (the rollouter's counter when the update
started). `trainer/idle_ratio` and `rollouter/idle_ratio` are recorded for every policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlsim.errors import RlsimError
from rlsim.protocol import Action, EventBatch, Finished, Launch, PolicyView, Train

SAMPLES_PER_SERVER = 16  # veRL: max_concurrent_samples = servers x 16


@dataclass(frozen=True, slots=True)
class FullyAsyncConfig:
    staleness_threshold: float = 0.5
    require_batches: int = 1
    trigger_parameter_sync_step: int = 4
    ppo_mini_batch_size: int | None = None  # prompts; None: P0 / (require_batches x trigger_parameter_sync_step)
    partial_rollout: bool = True
    use_rollout_log_probs: bool = True
    checkpoint_engine: bool = True
    device_buffer_size_M: int = 4096
    max_concurrent_samples: int | None = None  # None: 16 per rollout instance

    def __post_init__(self) -> None:
        if self.staleness_threshold < 0:
            raise RlsimError("fully_async staleness_threshold must be >= 0")
        if self.require_batches < 1 or self.trigger_parameter_sync_step < 1:
            raise RlsimError("fully_async require_batches and trigger_parameter_sync_step must be >= 1")
        if self.ppo_mini_batch_size is not None and self.ppo_mini_batch_size < 1:
            raise RlsimError("fully_async ppo_mini_batch_size must be >= 1")
        if self.device_buffer_size_M < 1:
            raise RlsimError("fully_async device_buffer_size_M must be >= 1")
        if self.max_concurrent_samples is not None and self.max_concurrent_samples < 1:
            raise RlsimError("fully_async max_concurrent_samples must be >= 1")


class FullyAsyncPolicy:
    """Stream prompts under veRL's staleness threshold; train local updates; sync every N."""

    name = "fully_async"
    on_policy = False
    placement = "disaggregated"
    Config = FullyAsyncConfig

    def __init__(self, **knobs: object) -> None:
        self.config = c = FullyAsyncConfig(**knobs)
        self.use_rollout_log_probs = c.use_rollout_log_probs
        self.sync_bucket_bytes = c.device_buffer_size_M * 2**20 if c.checkpoint_engine else None
        self.required = self.max_required = self.max_concurrent = 0
        self.active: dict[int, list[int]] = {}  # prompt in flight -> its finished request ids
        self.queue: dict[int, list[int]] = {}  # complete groups not yet consumed, in completion order
        self.staleness_samples = 0
        self.updates = 0  # local updates since the last sync
        self.param_version = 0  # syncs done
        self.sync_of: dict[int, int] = {0: 0}  # trainer version the rollout synced to -> param version
        self.finish_version: dict[int, int] = {}  # request id -> param version it finished under
        self.synced = False  # the last update synced: the rollout runs the new weights from this step
        self.training = False
        self.starved = False
        self.stale_samples = self.stale_trajectories = 0
        self.counter_at_update = 0

    def _setup(self, view: PolicyView) -> None:
        c, p0 = self.config, view.prompts_per_step
        per_sync = c.require_batches * c.trigger_parameter_sync_step
        mini = c.ppo_mini_batch_size
        if mini is None:
            mini = -(-p0 // per_sync)  # (rounded up where P0 does not divide)
        self.required = mini * c.require_batches
        self.max_required = int(self.required * (c.staleness_threshold + 1) * c.trigger_parameter_sync_step)
        cap = c.max_concurrent_samples or SAMPLES_PER_SERVER * view.num_instances
        self.max_concurrent = min(cap, self.max_required)

    def updates_per_step(self, prompts_per_step: int) -> float:
        """Local updates (rlsim steps of this policy) per P0 prompts: the planner's epoch has
        this many times the steps of a policy that trains P0 prompts a step."""
        c = self.config
        mini = c.ppo_mini_batch_size or -(-prompts_per_step // (c.require_batches * c.trigger_parameter_sync_step))
        return prompts_per_step / (mini * c.require_batches)

    def on_step_start(self, view: PolicyView) -> list[Action]:
        if not self.required:
            self._setup(view)
        if self.synced:  # the sync ended: the rollouter counts what it still owes the trainer
            self.synced = False
            self.param_version += 1
            self.sync_of[view.version] = self.param_version
            self.staleness_samples = len(self.active) + len(self.queue)
        self.training = False
        return self._produce(view) + self._maybe_train(view)

    def on_events(self, batch: EventBatch, view: PolicyView) -> list[Action]:
        r0 = view.samples_per_prompt
        for ev in batch:
            if type(ev) is not Finished:
                continue
            rid = ev.request_id
            self.finish_version[rid] = self.param_version
            prompt = view.request(rid).prompt_id
            done = self.active.get(prompt)
            if done is None:
                continue
            done.append(rid)
            if len(done) == r0:
                self.queue[prompt] = self.active.pop(prompt)
        return self._produce(view) + ([] if self.training else self._maybe_train(view))

    def _produce(self, view: PolicyView) -> list[Action]:
        """Take prompts one at a time while the concurrency and staleness bounds allow."""
        actions: list[Action] = []
        r0 = view.samples_per_prompt
        while len(self.active) < self.max_concurrent and self.staleness_samples < self.max_required:
            got = view.take_prompts(1)
            if not got:
                self.starved = True
                break
            self.starved = False
            self.active[got[0]] = []
            self.staleness_samples += 1
            actions.append(Launch(got[0], r0))
        return actions

    def _maybe_train(self, view: PolicyView) -> list[Action]:
        last = self.starved and not self.active and self.queue  # the data's last groups
        if len(self.queue) < self.required and not last:
            return []
        self.training = True
        self.counter_at_update = self.staleness_samples
        prompts = list(self.queue)[: self.required]
        ids = tuple(r for p in prompts for r in self.queue.pop(p))
        self.updates += 1
        c = self.config
        if self.updates < c.trigger_parameter_sync_step and not last:
            sync = "none"
        else:
            self.updates, self.synced = 0, True
            sync = "interrupt" if c.partial_rollout and c.staleness_threshold > 0 else "drain"
        return [Train(ids, sync=sync)]

    def step_metrics(self, view: PolicyView, ids: tuple[int, ...]) -> dict[str, float]:
        """veRL's fully_async/* metrics of the update just trained (`view.version` not yet moved)."""
        current = self.param_version  # the trainer's weights since its last sync
        starts, groups = [], {}
        for r in ids:
            info = view.request(r)
            start = self.sync_of[info.policy_version]
            starts.append(start)
            groups[info.prompt_id] = min(groups.get(info.prompt_id, start), start)
        spans = [self.finish_version.pop(r, s) - s for r, s in zip(ids, starts, strict=True)]
        self.stale_trajectories += sum(s < current for s in starts)
        self.stale_samples += sum(s < current for s in groups.values())
        partial = sum(x > 0 for x in spans)
        return {
            "fully_async/param_version": current,
            "fully_async/count/staleness_samples": self.counter_at_update,
            "fully_async/count/stale_samples_processed": self.stale_samples,
            "fully_async/count/stale_trajectory_processed": self.stale_trajectories,
            "fully_async/partial/total_partial_num": partial,
            "fully_async/partial/partial_ratio": partial / len(ids) if ids else 0.0,
            "fully_async/partial/max_partial_span": max(spans, default=0),
        }


@dataclass(frozen=True, slots=True)
class AReaLConfig:
    max_head_offpolicyness: int = 4  # AReaL's examples (its default 0 is synchronous)
    max_concurrent_rollouts: int | None = None  # None: 16 per rollout instance

    def __post_init__(self) -> None:
        if self.max_head_offpolicyness < 0:
            raise RlsimError("areal max_head_offpolicyness must be >= 0")
        if self.max_concurrent_rollouts is not None and self.max_concurrent_rollouts < 1:
            raise RlsimError("areal max_concurrent_rollouts must be >= 1")


class AReaLPolicy(FullyAsyncPolicy):
    """AReaL's staleness-bounded asynchrony (arXiv 2505.24298): `fully_async` with one update per
    sync and a threshold of eta, not a second implementation.

    AReaL admits a new rollout only while the groups produced stay under (i + eta + 1) x B at
    trainer version i (B the consumer batch, P0 here), and interrupts generations in flight at
    each weight update, which continue under the new weights. That is veRL's bound with
    `trigger_parameter_sync_step=1` (its counter resets at every sync to what is still owed, so
    it owes at most (1 + eta) x B beyond what was consumed) and `partial_rollout=true`; AReaL's
    decoupled PPO recomputes the proximal log-probs with the trainer (`use_rollout_log_probs=false`)
    and moves the weights tensor by tensor (`checkpoint_engine=false`).
    """

    name = "areal"
    Config = AReaLConfig

    def __init__(self, **knobs: object) -> None:
        c = AReaLConfig(**knobs)
        self.same_as = (
            f"fully_async(staleness_threshold={c.max_head_offpolicyness},trigger_parameter_sync_step=1,"
            "require_batches=1,partial_rollout=true,use_rollout_log_probs=false,checkpoint_engine=false"
            + (f",max_concurrent_samples={c.max_concurrent_rollouts})" if c.max_concurrent_rollouts else ")")
        )
        super().__init__(
            staleness_threshold=float(c.max_head_offpolicyness), trigger_parameter_sync_step=1, require_batches=1,
            partial_rollout=True, use_rollout_log_probs=False, checkpoint_engine=False,
            max_concurrent_samples=c.max_concurrent_rollouts,
        )  # fmt: skip
        self.areal = c
