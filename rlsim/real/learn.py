"""Learning in a real run (`--train grpo`): the trainer on the run's model, one GRPO/DAPO update per
step on the trained samples, the weights pushed into every engine through vLLM's reload path, sleep
and wake around the update where the engines support it, and the actor checkpoints.

Colocated, the trainer runs in the driver's process between rollouts. Disaggregated, it runs in
its own process (`rlsim.real.trainer_process`) beside the rollout: the driver hands it an
update's samples and steps the engines until it is done (`BesideLearner`), so `fully_async`'s
local updates and one-step-off's overlap run for real.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from pathlib import Path

import numpy as np

from rlsim.errors import RlsimError
from rlsim.real.engine import RealEngine
from rlsim.real.trainer import Sample, Trainer
from rlsim.real.trainer_process import TrainerProcess
from rlsim.step_costs import StepCost


def weights_dir(out: Path) -> Path:
    """Where a run's weights pushed into the engines are written: memory where there is some. Named
    after the run directory, so a resumed run reuses, and at its end removes, the folder of the run
    that was killed."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else out
    return base / f"rlsim-weights-{hashlib.sha1(str(out.resolve()).encode()).hexdigest()[:12]}"


class Learning:
    """`RealRun`'s training side (a mixin over its state)."""

    def _start_trainer(self, engine: RealEngine, backend, version: int) -> None:  # noqa: ANN001
        """The trainer on the run's model; a resumed run loads the actor checkpoint of the
        driver's weight version and pushes it into the fresh engines."""
        if not self.targets and not self.answers and self.agent is None:
            raise RlsimError(
                "--train grpo needs rewards: a task trace (rlsim trace task) or DAPO-Math-17k prompts with answers"
            )
        cfg = dataclasses.replace(self.real.trainer_config(), use_kl_loss=self.rl.use_kl_loss, seed=self.rl.seed)
        beside = self.cluster.placement == "disaggregated"
        self.trainer = TrainerProcess(self.real.model, cfg) if beside else Trainer(self.real.model, cfg)
        if version:
            ckpt = self.out / "actor" / f"v{version}"
            if not (ckpt / "optimizer.pt").exists():
                raise RlsimError(f"{ckpt} is missing: the run's actor checkpoint for weight version {version}")
            self._trainer_call("load_checkpoint", ckpt)
            self._push_weights(backend)
        if beside:
            engine.async_learner = BesideLearner(self, engine, backend)
        else:
            engine.learner = lambda reqs, v: self._learn(engine, backend, reqs, v)

    def _trainer_call(self, name: str, *args):  # noqa: ANN002, ANN202
        """A trainer method, in this process or the trainer's."""
        if isinstance(self.trainer, TrainerProcess):
            return self.trainer.call(name, *(str(a) if isinstance(a, Path) else a for a in args))
        return getattr(self.trainer, name)(*args)

    def _weights_dir(self) -> Path:
        return weights_dir(self.out)

    def _push_weights(self, backend) -> float:  # noqa: ANN001
        t0 = time.perf_counter()
        folder = self._trainer_call("save_weights", self._weights_dir())
        backend.call_all("update_weights", [str(folder)] * self.n)  # every instance at once
        return time.perf_counter() - t0

    def _samples(self, engine: RealEngine, reqs: list, version: int) -> list[Sample]:
        """The trained requests' tokens, rewards and behaviour log-probs (the control's rewards
        permuted within the batch)."""
        samples = []
        for q in reqs:
            d = engine.samples.pop(q.request_id, None)
            if d is None:
                continue
            row = self.engine_rows.get(q.request_id, {})
            samples.append(Sample(
                group=(q.epoch, q.prompt_id), prompt_token_ids=tuple(d["prompt_token_ids"] or ()),
                response_token_ids=tuple(d["output_token_ids"]), reward=float(row.get("reward", 0.0)),
                rollout_log_probs=tuple(d["logprobs"]) if d.get("logprobs") else None,
                staleness=version - q.policy_version,
                loss_mask=tuple(d["loss_mask"]) if d.get("loss_mask") is not None else None,
            ))  # fmt: skip
        if self.real.shuffle_rewards and len(samples) > 1:  # the control: rewards permuted within the batch
            rng = np.random.default_rng((self.rl.seed, version))
            rewards = rng.permutation([s.reward for s in samples])
            samples = [dataclasses.replace(s, reward=float(r)) for s, r in zip(samples, rewards, strict=True)]
        return samples

    def _checkpoint_actor(self, version: int) -> float | None:
        """The actor checkpoint of this weight version, where the driver's checkpoint of the step
        will point at it; its seconds (None: not due)."""
        if not self._checkpoints(version):
            return None
        t0 = time.perf_counter()
        self._trainer_call("save_checkpoint", self.out / "actor" / f"v{version}", Path(self.real.model))
        return time.perf_counter() - t0

    def _learn(self, engine: RealEngine, backend, reqs: list, version: int):  # noqa: ANN001, ANN202
        """One real update on the trained samples, the weights into every engine, the actor
        checkpoint; the measured phases (veRL's timing names) and the trainer's metrics."""
        samples = self._samples(engine, reqs, version)
        # Colocated GPU engines sleep through the update when none holds a request (veRL's
        # free_cache_engine); a request kept across the update (a partial policy's) needs its KV.
        sleep = self.sleeps and all(backend.call(i, "idle") for i in range(self.n))
        slept = woke = 0.0
        if sleep:
            t0 = time.perf_counter()
            backend.call_all("sleep", [1] * self.n)
            slept = time.perf_counter() - t0
        metrics = self.trainer.update(samples)
        if sleep:
            t0 = time.perf_counter()
            backend.call_all("wake_up", [None] * self.n)
            woke = time.perf_counter() - t0
        upd = self._push_weights(backend)
        saved = self._checkpoint_actor(self.trainer.version)
        if saved is not None:
            metrics["timing_s/save_checkpoint"] = saved  # veRL's name; not simulated
        cost = StepCost(
            old_log_prob=metrics.pop("timing_s/old_log_prob", 0.0),
            ref=metrics.pop("timing_s/ref", 0.0),
            update_actor=metrics.pop("timing_s/update_actor", 0.0),
            update_weights=upd,
            rollout_sleep=slept,
            rollout_wake_up=woke,
        )
        if not sleep:  # the engines did not sleep (no sleep mode here, or requests kept): not measured, never 0
            metrics |= {"timing_s/rollout_sleep": np.nan, "timing_s/rollout_wake_up": np.nan}
        return cost, metrics


class BesideLearner:
    """A disaggregated run's learner: each update runs in the trainer process while the driver
    steps the engines (`Driver._train_beside`); the weights go into the engines at a sync."""

    def __init__(self, run, engine: RealEngine, backend) -> None:  # noqa: ANN001
        self.run, self.engine, self.backend = run, engine, backend

    def start(self, reqs: list, version: int) -> None:
        self.run.trainer.start(self.run._samples(self.engine, reqs, version))

    def done(self) -> bool:
        return self.run.trainer.done()

    def finish(self) -> tuple[StepCost, dict]:
        """The update's measured phases (no weight sync yet) and the trainer's metrics."""
        metrics, _ = self.run.trainer.result()
        saved = self.run._checkpoint_actor(self.run.trainer.version)
        if saved is not None:
            metrics["timing_s/save_checkpoint"] = saved
        cost = StepCost(
            old_log_prob=metrics.pop("timing_s/old_log_prob", 0.0),
            ref=metrics.pop("timing_s/ref", 0.0),
            update_actor=metrics.pop("timing_s/update_actor", 0.0),
        )
        # the engines never sleep beside a trainer of their own: not measured, never 0
        return cost, metrics | {"timing_s/rollout_sleep": np.nan, "timing_s/rollout_wake_up": np.nan}

    def push(self) -> float:
        """The new weights into every engine; its seconds."""
        return self.run._push_weights(self.backend)
