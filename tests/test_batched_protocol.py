"""The batched event protocol: `EventBatch`, policies told batches or events, and quiet policies.

An engine answers each `step()` with an `EventBatch` (columns, in the order things ended). A
policy with `on_events` is told each batch whole; one with `on_event` is told its events one by one
through the driver's adapter, each event's actions applied before the next event is handled. A
quiet policy (`quiet = True`: acts on nothing while a request is in the engine) lets the engine run
a whole rollout in one `step(until_idle=True)`; its run must equal, request by request, the same
policy told every event at its instant. Each case asserts it exercises what it claims (batches of
several events, preemptions inside the bulk-booked batches, an action taken mid-batch).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from policies.async_partial import AsyncPartialPolicy
from policies.histopipe import HistoPipePolicy
from policies.one_step_off import OneStepOffPolicy
from policies.rollpacker import RollPackerPolicy
from policies.sortedrl import SortedRLPolicy
from policies.sync import SyncPolicy
from rlsim.config import ClusterConfig, EngineConfig, RLConfig
from rlsim.driver.driver import told_batches
from rlsim.driver.loop import run_loop
from rlsim.errors import RlsimError
from rlsim.paths import default_trace
from rlsim.profile import load_profile
from rlsim.protocol import (
    ABORTED,
    FINISHED,
    PREEMPTED,
    TIMER,
    Aborted,
    EventBatch,
    Finished,
    Launch,
    Preempted,
    Timer,
    Train,
)
from rlsim.sim.compiled.sim_engine import CompiledEngine
from rlsim.sim.engine import SimEngine
from rlsim.step_costs import with_engine
from rlsim.trace.format import Trace, load
from tests.fake_engine import FakeEngine
from tests.test_policies import make_trace


def test_event_batch_holds_events_as_columns_in_order() -> None:
    events = [Finished(3, 1.5, 0, 40, "stop"), Timer("train_done", 1.5), Aborted(4, 1.5, 1, 7), Preempted(5, 1.5, 1, 9)]
    batch = EventBatch.of(events)
    assert list(batch) == events
    assert len(batch) == 4 and batch
    assert batch.kind == [FINISHED, TIMER, 1, PREEMPTED]
    assert batch.request_id == [3, -1, 4, 5]
    assert batch.timers() == ["train_done"]
    assert list(batch.select([2, 0])) == [events[2], events[0]]
    assert EventBatch.of(batch) is batch
    assert not EventBatch()


class _Both:
    name = "both"

    def on_step_start(self, view):  # noqa: ANN001, ANN201
        return []

    def on_events(self, batch, view):  # noqa: ANN001, ANN201
        return []

    def on_event(self, event, view):  # noqa: ANN001, ANN201
        return []


class _EventsOfBoth(_Both):
    def on_event(self, event, view):  # noqa: ANN001, ANN201
        return []


def test_the_most_derived_definition_decides_how_a_policy_is_told() -> None:
    """A class defining on_events is told batches; a subclass overriding on_event (a user's
    change to a built-in batch policy) is told events, so its override is what runs."""
    assert told_batches(SyncPolicy())
    assert told_batches(_Both())
    assert not told_batches(_EventsOfBoth())

    class MySync(SyncPolicy):
        def on_event(self, event, view):  # noqa: ANN001, ANN201
            return []

    assert not told_batches(MySync())


class _BatchSizes(FakeEngine):
    """The fake engine, counting the size of every batch it answers."""

    def __init__(self, *args, **kw) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kw)
        self.sizes: list[int] = []

    def step(self, until_idle: bool = False) -> EventBatch:
        out = super().step(until_idle)
        self.sizes.append(len(out))
        return out


class _LaunchOnFirst:
    """Two samples finish at one instant; on the first, launch one more sample of the prompt.
    When told the second, the driver must already have applied that launch."""

    name = "launch_on_first"

    def __init__(self) -> None:
        self.told: list[tuple[int, list[int]]] = []
        self.trained = False

    def on_step_start(self, view):  # noqa: ANN001, ANN201
        if self.trained:
            return []
        (self.prompt,) = view.take_prompts(1)
        return [Launch(self.prompt, 2, instance=0)]

    def on_event(self, event, view):  # noqa: ANN001, ANN201
        if not isinstance(event, Finished):
            return []
        self.told.append((event.request_id, view.in_flight(self.prompt)))
        if len(self.told) == 1:
            return [Launch(self.prompt, 1, instance=0)]
        if len(self.told) == 3:
            self.trained = True
            return [Train(tuple(r for r, _ in self.told))]
        return []


def test_the_adapter_applies_each_events_actions_before_the_next_event() -> None:
    trace = make_trace(np.array([[[5, 5, 5, 5]]]))  # one epoch, one prompt, four samples of 5 tokens
    engine = _BatchSizes(1, dt=1.0)
    policy = _LaunchOnFirst()
    rl = RLConfig(prompts_per_step=1, samples_per_prompt=3, epochs=1, max_steps=1, reward_latency_s=0.0)
    run_loop(engine, policy, trace, load_profile(ClusterConfig().profile), ClusterConfig(num_gpus=4), rl)
    assert engine.sizes[0] == 2, "both samples end at one instant, in one batch"
    (first, _), (second, flying), _ = policy.told
    assert flying == [2], "the sample launched on the first finish is in flight when the second is told"
    assert {first, second} == {0, 1}


# ---- quiet policies: one step per rollout, booked in bulk, the same run ----------------------


class _PerEventSync(SyncPolicy):
    """`sync` told every event at its instant (its old per-event form)."""

    def on_event(self, event, view):  # noqa: ANN001, ANN201
        if isinstance(event, Finished):
            self._done.append(event.request_id)
            if len(self._done) == self._expected:
                return [Train(tuple(self._done))]
        return []


class _PerEventOneStepOff(OneStepOffPolicy):
    """`one_step_off` told every event at its instant (its old per-event form)."""

    def on_event(self, event, view):  # noqa: ANN001, ANN201
        if not isinstance(event, Finished):
            return []
        prompt = view.request(event.request_id).prompt_id
        if prompt in self.current and not self.trained:
            self.done.append(event.request_id)
            return self._maybe_train(view)
        self.carry.append((prompt, event.request_id))
        return []


class _Counting(SimEngine):
    """The simulated engine, counting its batches and the events and preemptions in them."""

    def __init__(self, *args, **kw) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kw)
        self.batches = self.events = self.preempted_rows = 0

    def step(self, until_idle: bool = False) -> EventBatch:
        out = super().step(until_idle)
        self.batches += 1
        self.events += len(out)
        self.preempted_rows += out.kind.count(PREEMPTED)
        return out


def _slice() -> Trace:
    tr = load(default_trace(), columns=[])
    keep = np.sort(tr.table["prompt_id"].unique())[:128]
    return Trace(tr.table[tr.table["prompt_id"].isin(keep)].reset_index(drop=True), tr.meta)


CASES = {
    "sync": (SyncPolicy, _PerEventSync, ClusterConfig(num_gpus=16, profile="h100-qwen2.5-32b-tp2")),
    "one_step_off": (
        OneStepOffPolicy,
        _PerEventOneStepOff,
        ClusterConfig(num_gpus=24, profile="h100-qwen2.5-32b-tp2", placement="disaggregated", train_gpus=8),
    ),
}


def _run(policy_cls, cluster: ClusterConfig, trace: Trace):  # noqa: ANN001, ANN202
    prof = with_engine(load_profile(cluster.profile), EngineConfig(gpu_memory_utilization=0.45))
    engine = _Counting(prof, cluster.num_instances(prof.tensor_parallel_size))
    rl = RLConfig(prompts_per_step=64, samples_per_prompt=16, epochs=2)
    records = run_loop(engine, policy_cls(), trace, prof, cluster, rl)
    return records, engine


@pytest.mark.parametrize("name", list(CASES))
def test_a_quiet_policy_runs_as_it_would_told_every_event(name: str) -> None:
    quiet_cls, per_event_cls, cluster = CASES[name]
    assert quiet_cls.quiet and told_batches(quiet_cls()) and not told_batches(per_event_cls())
    trace = _slice()
    quiet, qe = _run(quiet_cls, cluster, trace)
    told, te = _run(per_event_cls, cluster, trace)
    pd.testing.assert_frame_equal(quiet.requests_frame(), told.requests_frame())
    pd.testing.assert_frame_equal(quiet.steps_frame(), told.steps_frame())
    # what it exercises: whole rollouts in few batches, preemptions booked inside them
    assert qe.events == te.events > 0
    assert qe.batches * 20 < te.batches, (qe.batches, te.batches)
    assert qe.preempted_rows > 0, "the KV-tight engine preempts inside the bulk-booked batches"


# ---- quiet_for: a per-event policy that answers nothing to the next k finishes ------------------


class _CountingFinishes:
    """An engine (`SimEngine` or `CompiledEngine`) counting its steps and the aborts and preemptions
    they report, passing `finishes` and `prompts` on."""

    def __init__(self, *args, **kw) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kw)
        self.batches = self.events = self.aborted_rows = self.preempted_rows = self.counted = 0

    def step(self, until_idle: bool = False, finishes: int = 1, prompts: dict | None = None) -> EventBatch:
        out = super().step(until_idle, finishes, prompts)
        self.batches += 1
        self.counted += finishes > 1 or bool(prompts)
        self.events += len(out)
        self.aborted_rows += out.kind.count(ABORTED)
        self.preempted_rows += out.kind.count(PREEMPTED)
        return out


class _CountingSim(_CountingFinishes, SimEngine):
    pass


class _CountingCompiled(_CountingFinishes, CompiledEngine):
    pass


QUIET_FOR = {  # (policy class, knobs)
    "sortedrl": (SortedRLPolicy, {}),
    "histopipe": (HistoPipePolicy, {}),
    "histopipe_cross_step": (HistoPipePolicy, {"cross_step": True}),  # a tail carried into the next step
    "histopipe_one_step_off": (HistoPipePolicy, {"one_step_off": True}),
    "async_partial": (AsyncPartialPolicy, {}),
    "rollpacker": (RollPackerPolicy, {}),  # prompt by prompt; its races abort the losing samples
}


def _counting(cls: type) -> type:
    """The policy class, counting the events the driver tells it as batches by `on_quiet_events`
    (an EventBatch; its own `on_event` books each event through it too, as a tuple)."""

    def on_quiet_events(self, batch, view) -> None:  # noqa: ANN001
        if isinstance(batch, EventBatch):
            self.told_quiet += len(batch)
        return cls.on_quiet_events(self, batch, view)

    return type(f"Counting{cls.__name__}", (cls,), {"told_quiet": 0, "on_quiet_events": on_quiet_events})


@pytest.mark.parametrize("engine_cls", [_CountingSim, _CountingCompiled], ids=["simpy", "compiled"])
@pytest.mark.parametrize("name", list(QUIET_FOR))
def test_a_policy_quiet_for_k_finishes_runs_as_it_would_told_every_instant(name: str, engine_cls) -> None:  # noqa: ANN001
    """A per-event policy that says before each step how many finishes it answers nothing to
    (SortedRL on-policy, whose updates abort what flies; HistoPipe, also carrying a step's tail
    into the next or launching the next step's prompts at the update; async_partial): the engine
    runs on to the instant of that finish. The run equals the same policy told every instant's
    events (`quiet_for` None), request by request, on a KV-tight engine whose preemptions (and
    SortedRL's aborts) land inside the longer batches."""
    cls, knobs = QUIET_FOR[name]
    cluster = ClusterConfig(num_gpus=16, profile="h100-qwen2.5-32b-tp2")
    prof = with_engine(load_profile(cluster.profile), EngineConfig(gpu_memory_utilization=0.43))
    rl = RLConfig(prompts_per_step=16, samples_per_prompt=16, epochs=2)
    trace, runs = _slice(), []
    counting = _counting(cls)
    policies = (counting(**knobs), type(f"EveryInstant{cls.__name__}", (counting,), {"quiet_for": None})(**knobs))
    for policy in policies:
        engine = engine_cls(prof, cluster.num_instances(prof.tensor_parallel_size))
        runs.append((run_loop(engine, policy, trace, prof, cluster, rl), engine))
    (quiet, qe), (told, te) = runs
    pd.testing.assert_frame_equal(quiet.requests_frame(), told.requests_frame())
    pd.testing.assert_frame_equal(quiet.steps_frame(), told.steps_frame())
    assert qe.events == te.events > 0 and te.counted == 0 < qe.counted
    assert qe.batches * 5 < te.batches, (qe.batches, te.batches)
    # the events its promises cover were told as batches (`on_quiet_events`): most of them
    assert policies[1].told_quiet == 0 < qe.events < 2 * policies[0].told_quiet, (policies[0].told_quiet, qe.events)
    aborts = name in ("sortedrl", "rollpacker")
    assert qe.preempted_rows > 0 and (qe.aborted_rows > 0 or not aborts), (qe.aborted_rows, qe.preempted_rows)


def _quiet_run(policy) -> None:  # noqa: ANN001
    cluster = ClusterConfig(num_gpus=16, profile="h100-qwen2.5-32b-tp2")
    prof = load_profile(cluster.profile)
    engine = CompiledEngine(prof, cluster.num_instances(prof.tensor_parallel_size))
    run_loop(engine, policy, _slice(), prof, cluster, RLConfig(prompts_per_step=16, samples_per_prompt=16, max_steps=2))


def test_a_subclass_overriding_on_event_alone_is_told_every_event_by_it() -> None:
    """A user's subclass of a policy with `on_quiet_events` that overrides `on_event` is told
    every event by its own `on_event`, never by the parent's batch method it did not write."""

    class Heard(SortedRLPolicy):
        heard = 0

        def on_event(self, event, view):  # noqa: ANN001, ANN201
            self.heard += 1
            return super().on_event(event, view)

    policy, plain = Heard(), _counting(SortedRLPolicy)()
    _quiet_run(policy)
    _quiet_run(plain)
    assert plain.told_quiet > 0 and policy.heard >= plain.told_quiet, (policy.heard, plain.told_quiet)


def test_a_policy_answering_events_it_promised_quiet_is_an_error() -> None:
    class Loud(SortedRLPolicy):
        def on_quiet_events(self, batch, view):  # noqa: ANN001, ANN202
            super().on_quiet_events(batch, view)
            return [Train(())]

    with pytest.raises(RlsimError, match="answered events its quiet_for said it answers nothing to"):
        _quiet_run(Loud())
