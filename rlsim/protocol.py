"""The boundary types between driver, engines and policies: plain immutable data.

Requests and events are `NamedTuple`s (one is made per sample, so they must be cheap to create);
actions are frozen dataclasses.

An `Engine` (simulated or real vLLM) accepts `Request`s and returns `Event`s; a `Policy` reads a
`PolicyView` and answers `Action`s. Nothing here imports simpy or vllm, so policies stay plain
Python and the same policy object drives both engines (docs/architecture.md maps every policy
onto these calls).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable


class Request(NamedTuple):
    """One sample to generate. `target_tokens` is the engine's secret: policies never see it.
    `kept_tokens` > 0 continues a response whose first tokens an earlier request generated
    (divided rollout): the engine prefills prompt plus kept tokens and generates from there, up
    to `max_tokens` in all."""

    request_id: int
    prompt_id: int
    sample_idx: int
    epoch: int
    num_prompt_tokens: int
    max_tokens: int
    target_tokens: int
    instance: int
    policy_version: int
    kept_tokens: int = 0


class RequestInfo(NamedTuple):
    """What a policy may know about a launched request (no `target_tokens`)."""

    request_id: int
    prompt_id: int
    sample_idx: int
    epoch: int
    num_prompt_tokens: int
    instance: int
    policy_version: int
    kept_tokens: int = 0  # tokens it continues from an ended chunk of the same response


# ---- events (engine -> driver -> policy) -------------------------------------------------


class Finished(NamedTuple):
    """A request ended: its response is done, or (`finish_reason` "length" below the run's cap,
    at a `max_tokens` the policy set) a chunk of it is, and the policy may `Launch(resume=...)`."""

    request_id: int
    time: float
    instance: int
    num_output_tokens: int
    finish_reason: str  # "stop" or "length"


class Aborted(NamedTuple):
    request_id: int
    time: float
    instance: int
    num_output_tokens: int  # tokens generated before the abort (wasted)


class Preempted(NamedTuple):
    request_id: int
    time: float
    instance: int
    num_output_tokens: int  # generated so far; its KV is dropped and recomputed on readmission


class Timer(NamedTuple):
    tag: str
    time: float


Event = Finished | Aborted | Preempted | Timer


# ---- actions (policy -> driver) -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Launch:
    """Generate `num_samples` more samples of a prompt's current visit."""

    prompt_id: int
    num_samples: int
    max_tokens: int | None = None  # default: the run's max_response_len
    instance: int | tuple[int, ...] | None = None  # one for all samples, one per sample, or dispatch
    restart: bool = False  # forget the visit's earlier samples and draw again from its first sample
    resume: int | None = None  # continue this ended chunk's response (divided rollout; one sample)
    redraw: tuple[int, ...] | None = None  # draw these samples of the visit again (num_samples of them)


@dataclass(frozen=True, slots=True)
class Abort:
    request_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Train:
    """Train on these finished samples; this ends the step (weights advance one version)."""

    request_ids: tuple[int, ...]


Action = Launch | Abort | Train


@runtime_checkable
class Engine(Protocol):
    """What the driver needs from a rollout cluster, simulated or real."""

    num_instances: int

    @property
    def now(self) -> float: ...

    def submit(self, requests: Sequence[Request]) -> None: ...

    def abort(self, request_ids: Iterable[int]) -> None: ...

    def call_at(self, when: float, tag: str) -> None:
        """Deliver `Timer(tag)` at time `when` (training, weight sync, reward latency)."""

    def pause(self, sleep: bool = False) -> None:
        """Stop starting iterations (colocated training holds the GPUs); `sleep` also frees the
        KV cache, so requests still running re-prefill after `resume` (veRL's free_cache_engine)."""

    def resume(self) -> None: ...

    def step(self) -> list[Event]:
        """Advance to the next event(s) and return them (empty: nothing can happen)."""

    def busy_time(self, instance: int) -> float:
        """Seconds this instance has spent running at least one request so far."""


class PolicyView(Protocol):
    """What a policy may read: never a response length before that response finished.

    `profile` is the calibrated cost model (a policy may plan with it); `version` is the number
    of training steps done. Only a policy whose class sets `oracle = True` may call
    `oracle_lengths`; for any other it raises.
    """

    step: int
    version: int
    prompts_per_step: int
    samples_per_prompt: int
    max_response_len: int
    num_instances: int
    now: float
    profile: object

    def take_prompts(self, n: int) -> list[int]: ...

    def prompt_tokens(self, prompt_id: int) -> int: ...

    def request(self, request_id: int) -> RequestInfo: ...

    def oracle_lengths(self, prompt_id: int) -> list[int]: ...

    def epoch_of(self, prompt_id: int) -> int: ...

    def finished_lengths(self, prompt_id: int) -> list[int]: ...

    def history(self, prompt_id: int) -> list[int]: ...

    def in_flight(self, prompt_id: int) -> list[int]: ...


class Policy(Protocol):
    """A rollout scheduling policy: told when a step starts and every event, answers actions."""

    name: str

    def on_step_start(self, view: PolicyView) -> list[Action]: ...

    def on_event(self, event: Event, view: PolicyView) -> list[Action]: ...
