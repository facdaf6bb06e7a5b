"""A fake engine for policy unit tests: no SimPy, no batching, every token costs `dt` seconds.

Each request starts on submit (unlimited concurrency) and finishes `target * dt` seconds of
unpaused time later (a request continuing `kept_tokens` of an ended chunk: the rest of them);
an abort answers the tokens generated so far. Like vLLM's scheduler tests,
it lets a test drive a policy through the real driver with hand-predictable timings.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence

from rlsim.protocol import Aborted, Event, EventBatch, Finished, Request, Timer


class FakeEngine:
    """The `Engine` protocol over a heap of finish times."""

    def __init__(self, num_instances: int, dt: float = 1.0) -> None:
        self.num_instances = num_instances
        self.dt = dt
        self._now = 0.0
        self._heap: list[tuple[float, int, int, object]] = []  # (time, order, kind, payload)
        self._order = 0
        self._running: dict[int, tuple[Request, float]] = {}  # rid -> (request, start in work time)
        self._work = 0.0  # unpaused time elapsed
        self._paused = False
        self._outbox: list[Event] = []
        self.submitted: list[Request] = []
        self._busy_since: dict[int, float] = {}
        self._busy = [0.0] * num_instances

    @property
    def now(self) -> float:
        return self._now

    def _push(self, when: float, kind: int, payload: object) -> None:
        self._order += 1
        heapq.heappush(self._heap, (when, self._order, kind, payload))

    def submit(self, requests: Sequence[Request]) -> None:
        for req in requests:
            self.submitted.append(req)
            self._running[req.request_id] = (req, self._work)
            self._mark(req.instance)

    def _mark(self, inst: int) -> None:
        busy = any(r.instance == inst for r, _ in self._running.values())
        if busy and inst not in self._busy_since and not self._paused:
            self._busy_since[inst] = self._now
        elif (not busy or self._paused) and inst in self._busy_since:
            self._busy[inst] += self._now - self._busy_since.pop(inst)

    def abort(self, request_ids: Iterable[int]) -> None:
        for rid in request_ids:
            if rid in self._running:
                req, start = self._running.pop(rid)
                done = req.kept_tokens + min(math.floor((self._work - start) / self.dt + 1e-9), self._todo(req))
                self._outbox.append(Aborted(rid, self._now, req.instance, done))
                self._mark(req.instance)

    def call_at(self, when: float, tag: str) -> None:
        self._push(max(when, self._now), 0, tag)

    def pause(self, sleep: bool = False) -> None:
        self._paused = True
        for i in range(self.num_instances):
            self._mark(i)

    def resume(self) -> None:
        self._paused = False
        for i in range(self.num_instances):
            self._mark(i)

    @staticmethod
    def _todo(req: Request) -> int:
        return min(req.target_tokens, req.max_tokens) - req.kept_tokens

    def _next_finish(self) -> tuple[float, int] | None:
        if self._paused or not self._running:
            return None
        rid, (req, start) = min(
            self._running.items(), key=lambda kv: (kv[1][1] + self._todo(kv[1][0]) * self.dt, kv[0])
        )
        return self._now + max(start + self._todo(req) * self.dt - self._work, 0.0), rid

    def step(self, until_idle: bool = False) -> EventBatch:
        """The next instant's events (`until_idle` is not taken up: one instant at a time)."""
        return EventBatch.of(self._step())

    def _step(self) -> list[Event]:
        if self._outbox:
            out, self._outbox = self._outbox, []
            return out
        fin = self._next_finish()
        timer = self._heap[0][0] if self._heap else math.inf
        if fin is None and timer == math.inf:
            return []
        when = min(fin[0] if fin else math.inf, timer)
        if not self._paused:
            self._work += when - self._now
        self._now = when
        out: list[Event] = []
        while self._heap and self._heap[0][0] <= when:
            out.append(Timer(heapq.heappop(self._heap)[3], when))
        while (fin := self._next_finish()) is not None and fin[0] <= when + 1e-12:
            req, _ = self._running.pop(fin[1])
            n = min(req.target_tokens, req.max_tokens)
            out.append(Finished(req.request_id, when, req.instance, n, "length" if n >= req.max_tokens else "stop"))
            self._mark(req.instance)
        return out

    def busy_time(self, instance: int) -> float:
        extra = self._now - self._busy_since[instance] if instance in self._busy_since else 0.0
        return self._busy[instance] + extra
