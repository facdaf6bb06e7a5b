"""View: what a policy may see of the run (`rlsim.protocol.PolicyView`), and nothing more."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from rlsim.errors import RlsimError
from rlsim.protocol import Policy, RequestInfo

if TYPE_CHECKING:
    from rlsim.driver.driver import Driver


_new_info = partial(tuple.__new__, RequestInfo)  # a RequestInfo from its fields' tuple, in C (a policy asks often)


class View:
    """The policy's read-only window (`rlsim.protocol.PolicyView`).

    It answers only what a real system could know at that moment. Asking it for anything else
    (a target length, the trace, the driver) raises `RlsimError` naming the attribute; only a
    policy whose class sets `oracle = True` may call `oracle_lengths`.
    """

    __slots__ = (
        "_drv", "_oracle", "_policy", "step", "version", "now", "prompts_per_step", "samples_per_prompt",
        "max_response_len", "num_instances", "profile",
    )  # fmt: skip

    def __init__(self, drv: Driver, policy: Policy) -> None:
        self._drv = drv
        self._policy = getattr(policy, "name", type(policy).__name__)
        self._oracle = getattr(policy, "oracle", False) is True
        self.step, self.version, self.now = 0, 0, 0.0
        self.prompts_per_step = drv.rl.prompts_per_step
        self.samples_per_prompt = drv.rl.samples_per_prompt
        self.max_response_len = drv.rl.max_response_len
        self.num_instances = drv.engine.num_instances
        self.profile = drv.profile

    def __getattr__(self, name: str):  # noqa: ANN204 - only reached for names the view lacks
        raise RlsimError(
            f"policy {self._policy} asked the view for {name!r}: a policy sees prompts, finished "
            "samples and earlier visits only (docs/architecture.md)"
        )

    def take_prompts(self, n: int) -> list[int]:
        return self._drv.take_prompts(n)

    def epoch_of(self, prompt_id: int) -> int:
        return self._drv.taken_epoch[prompt_id]

    def prompt_tokens(self, prompt_id: int) -> int:
        return self._drv.index.length(self._drv.taken_epoch[prompt_id], prompt_id, 0)[1]

    def finished_lengths(self, prompt_id: int) -> list[int]:
        drv = self._drv
        return list(drv.finished.get((drv.taken_epoch.get(prompt_id), prompt_id), ()))

    def history(self, prompt_id: int) -> list[int]:
        return list(self._drv.history.get(prompt_id, ()))

    def in_flight(self, prompt_id: int) -> list[int]:
        return sorted(self._drv.in_flight.get(prompt_id, ()))

    def request(self, request_id: int) -> RequestInfo:
        q = self._drv.requests  # (columns)
        if not 0 <= request_id < len(q.epoch):
            raise RlsimError(f"policy {self._policy} asked for request {request_id}, which was never launched")
        r = request_id
        return _new_info((
            r, q.prompt_id[r], q.sample_idx[r], q.epoch[r], q.num_prompt_tokens[r], q.instance[r], q.policy_version[r],
            q.kept_tokens[r],
        ))  # fmt: skip

    def oracle_lengths(self, prompt_id: int) -> list[int]:
        if not self._oracle:
            raise RlsimError(
                f"policy {self._policy} read response lengths before they finished; only a policy "
                "marked oracle = True (a lower bound, not a real system) may"
            )
        drv = self._drv
        epoch = drv.taken_epoch[prompt_id]
        return [drv.index.length(epoch, prompt_id, s)[0] for s in range(drv.index.samples)]
