"""run_loop: the one RL loop, for simulated and real engines alike.

Each step the policy is told the step started, its actions are applied, and engine events are fed
to it until it asks to train; with dynamic sampling, further generation batches run under the same
weights until enough groups are valid. Then the step's rewards and training phases run
(`Driver.train`) and the version moves on.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from rlsim.config import ClusterConfig, DynamicSamplingConfig, RLConfig
from rlsim.driver.driver import Driver
from rlsim.errors import RlsimError
from rlsim.profile import Profile
from rlsim.protocol import Engine, EventBatch, Policy, Train
from rlsim.records import Records, StepWindow
from rlsim.trace.format import Trace


def run_loop(
    engine: Engine,
    policy: Policy,
    trace: Trace,
    profile: Profile,
    cluster: ClusterConfig,
    rl: RLConfig,
    progress=None,  # noqa: ANN001 - optional callable(step, now)
    driver: Driver | None = None,
    on_step=None,  # noqa: ANN001 - optional callable(driver) after every step
    dynamic_sampling: DynamicSamplingConfig | None = None,
    tools=None,  # noqa: ANN001 - rlsim.driver.turns.ToolConfig (a multi-turn trace's tool workers)
) -> Records:
    """Run the RL loop until every epoch is trained (or `max_steps`); return the records.
    `driver` continues a restored run (`Driver.restore`); `on_step` sees the driver after each
    step (a real run checkpoints there). `profile` is the one under the run's engine
    (`rlsim.step_costs.with_engine`), whose `engine` the driver follows."""
    drv = driver or Driver(engine, policy, trace, profile, cluster, rl, dynamic_sampling, tools)
    policy, view = drv.policy, drv.view
    while rl.max_steps is None or view.step < rl.max_steps:
        view.now = engine.now
        window = StepWindow(view.step, engine.now, engine)
        train = drv.apply(policy.on_step_start(view))
        if not any(drv.in_flight.values()) and train is None:
            if view.step == 0:  # (a policy's first step always has data: the trace is never empty)
                raise RlsimError(
                    f"policy {drv.policy_name} launched nothing at its first step: on_step_start must return "
                    "the step's Launch actions (rlsim/protocol.py)"
                )
            break  # data exhausted and nothing running
        train = _until_train(drv, train)
        while drv.groups is not None and (train := drv.filter_groups(train, window)) is None:
            # another generation batch of the same step (weights unchanged)
            train = _until_train(drv, drv.apply(policy.on_step_start(view)))
        drv.train(train, window)
        view.step += 1
        if on_step is not None:
            on_step(drv)
        if progress is not None:
            progress(view.step, engine.now)
    if drv.turns is not None:
        drv.records.multi_turn = drv.turns.summary(engine, engine.now)
    drv.records.finalize()
    drv.records.reused_samples = drv.reused_samples
    return drv.records


def _until_train(drv: Driver, train: Train | None) -> Train:
    """Feed events to the policy until it asks to train. A dynamic-sampling batch whose prompts
    ran out with nothing in flight trains on what it has (an empty Train)."""
    engine, policy, view, quiet, quiet_for = drv.engine, drv.policy, drv.view, drv.quiet, drv.quiet_for
    step, by_prompt = engine.step, drv.quiet_prompts
    on_event, book = (None if drv.batched else policy.on_event), drv._book_events
    while train is None:
        k = None
        if quiet:
            batch = step(until_idle=True)
        elif quiet_for is None or (k := quiet_for(view)) == 1:
            batch = step()
        elif not isinstance(k, Mapping):
            batch = step(finishes=k) if k > 1 else step()  # nothing answered before the k-th finish: run on to it
        elif k and by_prompt:  # ... before the k[p]-th finish of a prompt p
            batch = step(finishes=sys.maxsize, prompts=k)
        else:
            batch = step()
        if not batch:
            if drv.groups is not None and not any(drv.in_flight.values()):
                return Train(())
            raise RlsimError(f"policy {drv.policy_name} stalled: nothing in flight and no Train action")
        view.now = engine.now
        if on_event is None:
            train = drv.react(EventBatch.of(batch))
            continue
        train = book(batch, on_event, k) or train  # the adapter (`Driver.react`): event by event
    return train
