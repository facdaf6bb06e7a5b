"""SortedRL online length-aware scheduling (arXiv 2603.23414; docs/policies.md).

Written from a digest of the full text and its ICLR 2026 reviews (secondhand; the PDF itself was
not readable). A rollout *group* of G prompts is loaded whole and submitted at once, more
requests than an engine holds (oversubscription), and drained before the dataloader is asked
again. Trajectories come back roughly shortest first; every U finished trajectories trigger an
update on them, sorted by length (a micro-curriculum of short ones first):

    loop:
      if the cache is empty: load the next G prompts, n requests each
      submit every cached request that is not running
      finished trajectories collect in a ready buffer
      when the buffer holds U trajectories:
          stop generation (the engines pause for training); every in-flight request returns
          to the cache:
              on_policy: its tokens are thrown away and it is drawn again under the new weights
                         (a finished trajectory beyond the U is thrown away too)
              partial:   it keeps its tokens and resumes under the new weights
          train on the U trajectories sorted by length, sync weights

Rollout and training alternate. There is no staleness knob: in partial mode a trajectory's
staleness is what results (at most about G x n / U versions) and is reported. On-policy mode
gains little because every update discards the work in flight; a faithful simulation shows it.

Parameters:
- `group` G: prompts loaded together; None = 4 x P0 (the paper's 512-prompt group holds four
  update batches of 128 prompts x 8).
- `update_batch` U: trajectories per update; None = P0 x R0, so an update trains as many
  samples as a synchronous step.
- `mode`: `on_policy` (default) or `partial`.
- `keep_groups`: wait for whole GRPO groups (U / R0 of them) instead of single trajectories; the
  paper's algorithms (Reinforce++, PPO with n = 1) do not need it, GRPO's advantages do.

`redraw`: what a trajectory thrown away at an on-policy update becomes when it is generated
again. `same` (default): the same sample of the trace, i.e. its length under the new weights is
the length it would have had (an update moves a response's length little), so long
trajectories are restarted from scratch and on-policy mode gains little, as the paper finds.
`fresh`: the next, unused sample of the prompt (reusing the trace's samples cyclically past its
count, as `reused_samples` reports): a new random draw, so short draws win the race and
training skews short (`trained_length_bias`); where a prompt explains little of the length
variance (the bundled trace: 8%) this is a large selection effect, not a scheduling gain.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from rlsim.errors import RlsimError
from rlsim.protocol import Abort, Aborted, Action, Event, EventBatch, Finished, Launch, PolicyView, Train

MODES = ("on_policy", "partial")
REDRAWS = ("same", "fresh")


@dataclass(frozen=True, slots=True)
class SortedRLConfig:
    group: int | None = None  # prompts loaded together; None = 4 x prompts_per_step
    update_batch: int | None = None  # trajectories per update; None = prompts_per_step x samples
    mode: str = "on_policy"
    keep_groups: bool = False
    redraw: str = "same"  # on_policy: a thrown-away trajectory comes back as the same trace sample

    def __post_init__(self) -> None:
        if self.redraw not in REDRAWS:
            raise RlsimError(f"sortedrl redraw must be one of {', '.join(REDRAWS)}, got {self.redraw!r}")
        if self.mode not in MODES:
            raise RlsimError(f"sortedrl mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.group is not None and self.group <= 0:
            raise RlsimError("sortedrl group must be positive")
        if self.update_batch is not None and self.update_batch <= 0:
            raise RlsimError("sortedrl update_batch must be positive")


class SortedRLPolicy:
    """Load a group whole, update every U finished trajectories, drain before loading again."""

    name = "sortedrl"
    Config = SortedRLConfig

    def __init__(self, **knobs: object) -> None:
        self.config = SortedRLConfig(**knobs)
        self.on_policy = self.config.mode == "on_policy"
        self.whole_groups = self.config.keep_groups  # False: a prompt's samples may train in different updates
        self.owed: dict[int, int] = {}  # cached prompt -> trajectories not yet finished (or in flight)
        self.ready: dict[int, list[int]] = {}  # prompt -> finished, untrained request ids (finish order)
        self.order: list[int] = []  # every ready request id, in finish order
        self.relaunch: dict[int, list[int]] = {}  # prompt -> samples to draw again at the next step start
        self.dropped: set[int] = set()  # request ids thrown away at an update
        self.length: dict[int, int] = {}  # ready request id -> its length (training sorts by it)
        self.training = False
        self.exhausted = False

    # ---- sizes ----------------------------------------------------------------------------
    def _group(self, view: PolicyView) -> int:
        return self.config.group or 4 * view.prompts_per_step

    def _update(self, view: PolicyView) -> int:
        return self.config.update_batch or view.prompts_per_step * view.samples_per_prompt

    # ---- protocol -------------------------------------------------------------------------
    def on_step_start(self, view: PolicyView) -> list[Action]:
        self.training = False
        same = self.config.redraw == "same"
        actions: list[Action] = [
            Launch(p, len(s), redraw=tuple(s) if same else None) for p, s in self.relaunch.items() if s
        ]
        self.relaunch.clear()
        actions += self._load(view)
        return actions + self._maybe_train(view)

    def on_event(self, event: Event, view: PolicyView) -> list[Action]:
        booked = len(self.order)
        self.on_quiet_events((event,), view)  # booked as a batch's events are
        if len(self.order) == booked or self.training:
            return []  # not a cached trajectory's finish, or one booked for the next update (disaggregated)
        if self.owed and not self.whole_groups and len(self.order) < self._update(view):
            return []  # (what _maybe_train and _load answer then: no update due, the group not drained)
        return self._maybe_train(view) or self._load(view)

    def on_quiet_events(self, batch: EventBatch, view: PolicyView) -> None:
        """Book these events (`on_event` books each one here, then decides): a cached
        trajectory's finish joins the ready buffer; an id thrown away at an update is forgotten
        once it ends. Told as one batch, they are the events `quiet_for` covers: none is the one
        an update or a load waits for."""
        dropped, owed, ready, order, length, request = (
            self.dropped, self.owed, self.ready, self.order, self.length, view.request
        )
        for ev in batch:
            kind = type(ev)
            if kind is not Finished and kind is not Aborted:
                continue
            rid = ev[0]
            if rid in dropped:  # thrown away at an update: it ended once, now forget it
                dropped.discard(rid)
                continue
            if kind is Aborted:
                continue
            p = request(rid).prompt_id
            left = owed.get(p)
            if left is None:
                continue
            ready.setdefault(p, []).append(rid)
            order.append(rid)
            length[rid] = ev[3]
            if left > 1:
                owed[p] = left - 1
            else:
                del owed[p]

    def quiet_for(self, view: PolicyView) -> int:
        """Finishes this policy answers nothing to (`Policy.quiet_for`): an update is due at the
        U-th ready trajectory and the next group loads once this one drains, so neither comes
        before min(U - ready, trajectories owed) more finishes; until then a finish only moves
        the two counts (and reads its request). While training it answers nothing at all (the
        update's aborts come back then); 1 (no promise) with whole groups."""
        if self.training:
            return sys.maxsize
        if self.whole_groups or not self.owed:
            return 1
        return max(1, min(self._update(view) - len(self.order), sum(self.owed.values())))

    # ---- internals ------------------------------------------------------------------------
    def _load(self, view: PolicyView) -> list[Action]:
        """The next group, once the cache has drained and its trajectories have trained (a
        group of G x n trajectories, a multiple of U by default, drains with an empty buffer;
        otherwise its remainder trains as a smaller update first)."""
        if self.owed or self.ready or self.exhausted:
            return []
        new = view.take_prompts(self._group(view))
        n = view.samples_per_prompt
        for p in new:
            self.owed[p] = n
        self.exhausted = not new
        return [Launch(p, n) for p in new]

    def _batch(self, view: PolicyView) -> list[int] | None:
        """Request ids of the next update, or None while it is not due."""
        u, n = self._update(view), view.samples_per_prompt
        drained = not self.owed  # the group drained: what is ready trains before the next loads
        if self.config.keep_groups:
            whole = [p for p in self.ready if len(self.ready[p]) == n and p not in self.owed]
            want = max(u // n, 1)
            if len(whole) < want and not (drained and whole):
                return None
            return [r for p in whole[:want] for r in self.ready[p]]
        if len(self.order) < u and not (drained and self.order):
            return None
        return self.order[:u]

    def _maybe_train(self, view: PolicyView) -> list[Action]:
        ids = self._batch(view)
        if ids is None:
            return []
        self.training = True
        taken = set(ids)
        self.order = [r for r in self.order if r not in taken]
        for p in list(self.ready):
            self.ready[p] = [r for r in self.ready[p] if r not in taken]
            if not self.ready[p]:
                del self.ready[p]
        actions: list[Action] = []
        if self.on_policy:
            aborts: list[int] = []
            for p in list(self.owed):  # in flight: thrown away, drawn again after the update
                flying = view.in_flight(p)
                aborts += flying
                self.relaunch.setdefault(p, []).extend(view.request(r).sample_idx for r in flying)
            for p, rs in self.ready.items():  # finished under the old weights, beyond the batch
                self.owed[p] = self.owed.get(p, 0) + len(rs)
                self.relaunch.setdefault(p, []).extend(view.request(r).sample_idx for r in rs)
            self.ready.clear()
            self.order.clear()
            self.dropped.update(aborts)
            if aborts:
                actions.append(Abort(tuple(aborts)))
        ids.sort(key=lambda r: (self.length.pop(r), r))
        if self.on_policy:
            self.length.clear()
        return [*actions, Train(tuple(ids))]
