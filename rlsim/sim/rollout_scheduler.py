"""The seam between the simulated engine and a rollout engine's scheduling rules: what `SimEngine`
asks of one instance's scheduler, and which scheduler an engine configuration gets.

`SimEngine` (`rlsim.sim.engine`) keeps time, events, submits, aborts and sleep; everything an
engine decides per iteration sits behind `RolloutScheduler`: which requests an iteration runs and
how many tokens each (`schedule`), what the iteration finished (`complete`, `finish_due`), the
KV blocks and prefix cache it holds, and how far a fixed decode batch may run before its next
event (`jump_plan`, `advance`; `rlsim.sim.jump` prices the jump from the batch's sums). Each
engine's rules have one source, the compiled core's (`rlsim.sim.compiled`), which `CompiledEngine`
asks through its own questions (`rlsim.sim.compiled.rules`) and `SimEngine` through this seam:
vLLM's are `VLLMRules` (`rlsim.sim.vllm_rules`; its `Scheduler`, or its `AsyncScheduler` where the
engine schedules asynchronously), SGLang's `SGLangRules` (`rlsim.sim.sglang_rules`).
`InstanceScheduler` (`rlsim.sim.scheduler`) and `SGLangScheduler` (`rlsim.sim.sglang_scheduler`)
are their readable twins, which no run uses and tests hold the compiled rules to.
`make_scheduler` builds the one an engine configuration's rollout engine names
(`EngineConfig.rollout_engine`, its entry in `rlsim.rollout_engines`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from rlsim.rollout_engines import resolve, rollout_engine
from rlsim.sim.seq import Scheduled, Seq

if TYPE_CHECKING:
    from rlsim.config import EngineConfig


class RolloutScheduler(Protocol):
    """One instance's scheduling rules, as the engine drives them each iteration: methods and
    read-only properties only (in the spirit of vLLM's `SchedulerInterface`); the engine reads no
    scheduler's fields, and what differs between engines beyond these (speculation, the weight-update
    flush, the lockstep hold, input lag) the engine asks of the engine's registry entry
    (`rlsim.rollout_engines`)."""

    @property
    def kv_capacity_tokens(self) -> int:
        """KV tokens the instance holds."""

    @property
    def groups_calls(self) -> bool:
        """Whether a call's samples run as one request (`add_call` then takes them together)."""

    # the fixed decode batch a jump prices (`rlsim.sim.jump.jump_cost`)
    @property
    def num_decoding(self) -> int:
        """Requests decoding."""

    @property
    def ctx(self) -> float:
        """KV context tokens of the running requests."""

    @property
    def rate_sum(self) -> float:
        """Tokens the decoding requests add a step (their number, without speculation)."""

    @property
    def verify_sum(self) -> float:
        """Tokens they verify a step."""

    @property
    def num_speculating(self) -> int:
        """Decoding requests under speculation."""

    # counters the run reports
    @property
    def prefix_hit_tokens(self) -> int:
        """Prompt tokens the prefix cache saved."""

    @property
    def turn_tokens(self) -> int:
        """Later turns' context tokens (multi-turn)."""

    @property
    def turn_hit_tokens(self) -> int:
        """Of which the prefix cache held."""

    def has_work(self) -> bool:
        """Whether any request runs or waits."""

    def running_seq(self, rid: int) -> Seq | None:
        """The running request of this id, or None."""

    def find(self, rid: int) -> Seq | None:
        """The running or waiting request of this id, or None."""

    def holds_finished(self) -> bool:
        """Whether finished requests still hold their place for one more schedule."""

    def add_call(self, seqs: list[Seq]) -> None:
        """Queue a call's samples (one request with n > 1 where `groups_calls`)."""

    def add(self, seq: Seq) -> None:
        """Queue a request (at the back of the waiting queue)."""

    def remove_waiting(self, rids: set[int]) -> list[Seq]:
        """Take these requests out of the waiting queue, in order; return them."""

    def schedule(self) -> Scheduled:
        """The next iteration's batch, with its blocks allocated and its preemptions done."""

    def complete(self, out: Scheduled) -> list[Seq]:
        """The iteration `out` ran: apply its tokens; return the requests it finished."""

    def finish_due(self) -> list[Seq]:
        """Finish the requests whose last token the iterations so far produced; return them."""

    def release_finishing(self) -> None:
        """Free the finished requests that held their place for one more schedule."""

    def generated(self, seq: Seq) -> int:
        """Tokens this request has generated so far."""

    def abort(self, seq: Seq) -> int:
        """Take a running request out, its KV freed; return its generated tokens."""

    def own_abort(self, seq: Seq) -> str | None:
        """Why the engine aborted this ended request of its own accord (None: it did not)."""

    def on_idle(self) -> None:
        """A loop pass found nothing to schedule (SGLang resets its new-token ratio when fully idle)."""

    def free_all(self) -> list[Seq]:
        """Sleep: free all KV and the prefix cache; running requests wait again, first, with their
        tokens; return them."""

    def jump_plan(self) -> int:
        """Iterations the fixed decode batch may run before its next event (0: run one)."""

    def advance(self, k: int) -> None:
        """Commit k iterations of the fixed decode batch (`jump_plan` said they fit)."""


def make_scheduler(engine: EngineConfig, kv_tokens: int) -> RolloutScheduler:
    """The scheduler of one instance of this engine, holding `kv_tokens` KV tokens: the rules its
    rollout engine's entry names (`rlsim.rollout_engines`)."""
    return resolve(rollout_engine(engine.rollout_engine).scheduler)(engine, kv_tokens)

