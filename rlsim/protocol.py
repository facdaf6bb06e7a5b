"""The boundary types between driver, engines and policies: plain immutable data.

Requests and events are `NamedTuple`s (one is made per sample, so they must be cheap to create);
actions are frozen dataclasses.

An `Engine` (simulated or real vLLM) accepts `Request`s and answers each `step()` with an
`EventBatch`: what ended at one instant (an iteration or a jump of the simulator, an
`LLMEngine.step()` of vLLM), in the order it happened, readable as columns; a `Policy` reads a
`PolicyView` and answers `Action`s, for a whole batch (`on_events`) or event by event
(`on_event`, through the driver's adapter). Nothing here imports simpy or vllm, so policies stay plain
Python and the same policy object drives both engines (docs/architecture.md maps every policy
onto these calls).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
    # a turn of a multi-turn trajectory (`rlsim.trace.turns`): its prompt is the context so far, of
    # which the first `prompt_len` tokens are the prompt its siblings share (0: all of it); a turn
    # with `more_turns` keeps its KV hittable when it ends, for the next turn's prefix-cache hit
    prompt_len: int = 0
    more_turns: bool = False


class RequestBatch(Sequence[Request]):
    """Requests as columns: one list per `Request` field, in `Request._fields` order.

    What the driver submits when a policy launches many samples at once. It is a sequence of
    `Request`s (indexing or iterating builds the tuples), so every engine takes it as any other;
    an engine that reads requests as columns (the compiled simulator) reads `columns` instead
    and no tuple is ever built. `add` appends one request, `extend` whole columns.
    """

    __slots__ = ("columns",)

    def __init__(self) -> None:
        self.columns: tuple[list, ...] = tuple([] for _ in Request._fields)

    def add(self, req: Request) -> None:
        for col, value in zip(self.columns, req, strict=True):
            col.append(value)

    def extend(self, columns: Sequence[Iterable]) -> None:
        """Append requests given as one iterable per `Request` field."""
        for col, values in zip(self.columns, columns, strict=True):
            col.extend(values)

    def __len__(self) -> int:
        return len(self.columns[0])

    def __getitem__(self, i):  # noqa: ANN001, ANN204 - an index (a Request) or a slice (a list)
        if isinstance(i, slice):
            return list(map(Request, *(col[i] for col in self.columns)))
        return Request(*(col[i] for col in self.columns))

    def __iter__(self):  # noqa: ANN204
        return map(Request, *self.columns)


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
    finish_reason: str  # "stop" or "length"; or the engine's own abort's reason (`Aborted.reason`)


class Aborted(NamedTuple):
    """A request ended without its response: the policy aborted it ("abort"), or the engine did of
    its own accord and went on (SGLang: "prompt_too_long", a prompt its KV pool cannot hold)."""

    request_id: int
    time: float
    instance: int
    num_output_tokens: int  # tokens generated before the abort (wasted)
    reason: str = "abort"


class Preempted(NamedTuple):
    request_id: int
    time: float
    instance: int
    num_output_tokens: int  # generated so far; its KV is dropped and recomputed on readmission


class Timer(NamedTuple):
    tag: str
    time: float


Event = Finished | Aborted | Preempted | Timer

FINISHED, ABORTED, PREEMPTED, TIMER = 0, 1, 2, 3  # `EventBatch.kind` codes, in `Event`'s order
_CODE = {Finished: FINISHED, Aborted: ABORTED, Preempted: PREEMPTED, Timer: TIMER}


class EventBatch(list):
    """What an engine step reports: the events in the order they happened, readable as columns.

    The batch is the list of its per-event tuples (`Finished`, `Aborted`, `Preempted`, `Timer`):
    iterating it gives them, and a per-event policy is told them, at no cost. Its columns (`kind`,
    `request_id`, `time`, `instance`, `num_output_tokens`, `finish_reason`, `tag`) are built from
    them once, when first read. `kind` holds `FINISHED`, `ABORTED`, `PREEMPTED` or `TIMER`;
    `finish_reason` is "stop" or "length" on a finish and "" otherwise; a timer's row has request
    id and instance -1, 0 tokens and its tag in `tag` (None on other rows). Engines append the
    tuples, or call `finished`, `aborted`, `preempted` and `timer`.
    """

    __slots__ = ("_cols",)

    @classmethod
    def of(cls, events: Iterable[Event]) -> EventBatch:
        """A batch of these events (a batch stays itself)."""
        return events if isinstance(events, EventBatch) else cls(events)

    def finished(self, request_id: int, time: float, instance: int, num_output_tokens: int, reason: str) -> None:
        self.append(Finished(request_id, time, instance, num_output_tokens, reason))

    def aborted(
        self, request_id: int, time: float, instance: int, num_output_tokens: int, reason: str = "abort"
    ) -> None:
        self.append(Aborted(request_id, time, instance, num_output_tokens, reason))

    def preempted(self, request_id: int, time: float, instance: int, num_output_tokens: int) -> None:
        self.append(Preempted(request_id, time, instance, num_output_tokens))

    def timer(self, tag: str, time: float) -> None:
        self.append(Timer(tag, time))

    def set_reason(self, i: int, reason: str) -> None:
        """Tell row `i` (a finish) with another finish reason."""
        self[i] = self[i]._replace(finish_reason=reason)
        cols = getattr(self, "_cols", None)
        if cols is not None and len(cols[0]) == len(self):
            cols[5][i] = reason

    def _columns(self) -> tuple:
        cols = getattr(self, "_cols", None)
        if cols is None or len(cols[0]) != len(self):  # (rows appended since: built again)
            kind = [_CODE[type(e)] for e in self]
            timer = [k == TIMER for k in kind]
            cols = self._cols = (
                kind,
                [-1 if t else e[0] for t, e in zip(timer, self, strict=True)],
                [e[1] for e in self],  # (a timer's time is its second field too)
                [-1 if t else e[2] for t, e in zip(timer, self, strict=True)],
                [0 if t else e[3] for t, e in zip(timer, self, strict=True)],
                [e[4] if k == FINISHED else "" for k, e in zip(kind, self, strict=True)],
                [e[0] if t else None for t, e in zip(timer, self, strict=True)],
            )
        return cols

    @property
    def kind(self) -> list[int]:
        return self._columns()[0]

    @property
    def request_id(self) -> list[int]:
        return self._columns()[1]

    @property
    def time(self) -> list[float]:
        return self._columns()[2]

    @property
    def instance(self) -> list[int]:
        return self._columns()[3]

    @property
    def num_output_tokens(self) -> list[int]:
        return self._columns()[4]

    @property
    def finish_reason(self) -> list[str]:
        return self._columns()[5]

    @property
    def tag(self) -> list[str | None]:
        return self._columns()[6]

    def select(self, rows: Iterable[int]) -> EventBatch:
        """A batch of these rows, in the order given."""
        return EventBatch(self[i] for i in rows)

    def timers(self) -> list[str]:
        """The tags of the batch's timers, in order."""
        return [e.tag for e in self if type(e) is Timer]


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


SYNC_MODES = ("step", "none", "drain", "interrupt")


@dataclass(frozen=True, slots=True)
class Train:
    """Train on these finished samples; this ends the step (the trainer's weights advance one
    version). `sync` says how the new weights reach the rollout:

    - "step": the weight sync is a phase of the step and launches after it use the new weights;
      under `disaggregated` placement the engines run on through it (every built-in step policy);
    - "none": no sync after this update (a local update of veRL's fully-async trainer): the
      rollout keeps generating with the weights it has, so staleness grows by one version;
    - "drain": after the update, new launches are held, the requests in flight finish, then the
      engines stop while the weights transfer (veRL's fully-async sync without partial rollout);
    - "interrupt": after the update, the engines stop at once and free their KV cache while the
      weights transfer; the requests in flight keep their tokens and continue under the new
      weights, prompt and kept tokens prefilled again (veRL's partial rollout).

    Launches a policy asks for while the rollout stops for a "drain" or "interrupt" sync are held
    and submitted when it resumes.
    """

    request_ids: tuple[int, ...]
    sync: str = "step"


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

    def step(
        self, until_idle: bool = False, finishes: int = 1, prompts: Mapping[int, int] | None = None
    ) -> EventBatch:
        """Advance to the next instant at which something ends and return what did (empty:
        nothing can happen). `until_idle`: go on, instant after instant, until no request is
        left in the engine or a timer fired, and return all of it as one batch (for a policy
        that acts on nothing before then: `Policy.quiet`). `finishes`: go on likewise until that
        many requests have finished (`Policy.quiet_for`). `prompts` (prompt id -> count): ... or
        until, for one of these prompts, that many of its requests have finished (prompts not in
        it are not counted). Each stops at the end of the instant it is met at. An engine may
        ignore any of them and answer instant by instant: the driver then asks again."""

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
    """A rollout scheduling policy: told when a step starts and every event, answers actions.

    A policy implements `on_events(batch, view)`, told each `EventBatch` whole (its actions are
    applied after the batch), or `on_event(event, view)`: then the driver's adapter tells it the
    batch's events one by one and applies the actions each answers before handling the next,
    so a policy reacting to one finish (aborting its siblings) acts before the next is handled.
    A class attribute `quiet = True` (with `on_events`) says the policy acts on no event while
    a request is still in the engine, except on a timer: the engine may then run to that point
    in one step (`Engine.step(until_idle=True)`) and the driver books the batch in bulk.
    A method `quiet_for(view) -> int` says, before each engine step, that the policy answers
    nothing to any event until that many requests have finished (or a timer fired), and that
    it reads nothing of the view but the requests while told them: the engine may then run to
    the instant of that finish in one step (`Engine.step(finishes=k)`); 1 asks nothing. It may
    answer a mapping instead, prompt id -> count: nothing until, for one of these prompts, that
    many of its requests have finished; a prompt not in it may finish any number (RollPacker:
    each round prompt's samples short of R0). The engine runs to the first such instant
    (`Engine.step(prompts=...)`); an empty mapping asks nothing.
    A per-event policy with `quiet_for` may also define `on_quiet_events(batch, view)`: the
    driver then books the events a promise covers (those before the finish it runs to, and
    before any timer) together and tells them as one batch, which must leave the policy as
    telling them one by one would, and answer nothing (an answer is an error); the rest are
    told one by one. A subclass that overrides `on_event` alone is told every event by it.
    """

    name: str

    def on_step_start(self, view: PolicyView) -> list[Action]: ...

    def on_event(self, event: Event, view: PolicyView) -> list[Action]: ...
