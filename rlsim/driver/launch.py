"""Launching: how the driver turns a policy's `Launch` into `Request`s and places them.

A launched sample's target length comes from the trace (`TraceIndex`), never from the policy;
samples past the trace's count reuse its samples cyclically (counted in the summary). Placement is
the policy's own (`Launch.instance`) or the run's dispatch rule: per-sample least-loaded by
default (`rlsim.driver.dispatch`), decided when the batch is submitted so that each assignment
counts against the next. A `Launch(resume=r)` continues the response of an ended chunk.
"""

from __future__ import annotations

from collections import deque

from rlsim.driver.dispatch import least_loaded
from rlsim.errors import RlsimError
from rlsim.protocol import Launch, Request, RequestBatch

_INSTANCE = Request._fields.index("instance")


class Launching(RequestBatch):
    """A batch being launched: its rows from `booked` on are not in the run's `RequestTable` yet
    (booked once, when the batch is dispatched or a request is needed there)."""

    __slots__ = ("booked",)

    def __init__(self) -> None:
        super().__init__()
        self.booked = 0


class Launcher:
    """The `Driver`'s launch and dispatch methods (a mixin over its state)."""

    def _instance_for(self, launch: Launch) -> int | tuple[int, ...] | None:
        """The policy's placement, or the dispatch rule's; None: per-sample least-loaded, decided
        when the batch is submitted (`_dispatch`)."""
        n = self.view.num_instances
        if type(launch.instance) is int and 0 <= launch.instance < n:  # (one instance, in range)
            return launch.instance
        if launch.instance is not None:
            chosen = launch.instance if isinstance(launch.instance, tuple) else (launch.instance,)
            if isinstance(launch.instance, tuple) and len(chosen) != launch.num_samples:
                raise RlsimError(f"policy gave {len(chosen)} instances for {launch.num_samples} samples")
            if not all(0 <= i < n for i in chosen):
                raise RlsimError(f"policy chose instance {max(chosen)} of {n}")
            return launch.instance
        if self.cluster.dispatch == "least_loaded":
            return None
        if self.cluster.dispatch == "round_robin":
            first = self.rr
            self.rr = (self.rr + launch.num_samples) % n
            return tuple((first + j) % n for j in range(launch.num_samples))
        self.rr = (self.rr + 1) % n  # per_prompt
        return self.rr

    def _book_requests(self, batch: Launching) -> None:
        """Append the batch's rows not yet booked to the run's requests."""
        done = batch.booked
        if done < len(batch):
            self.requests.extend_columns(batch.columns if done == 0 else [col[done:] for col in batch.columns])
            batch.booked = len(batch)

    def _dispatch(self, batch: Launching) -> Launching:
        """Place the batch's undecided samples least-loaded (counting each assignment) and count
        every sample of the batch against its instance."""
        self._book_requests(batch)
        rids, where = batch.columns[0], batch.columns[_INSTANCE]
        todo = [j for j, i in enumerate(where) if i < 0]
        if todo:
            placed = least_loaded(self.assigned, len(todo))
            placed_at = self.requests.instance
            for j, i in zip(todo, placed, strict=True):
                where[j] = i
                placed_at[rids[j]] = i
        if len(todo) < len(where):
            assigned, undecided = self.assigned, set(todo)
            for j, i in enumerate(where):
                if j not in undecided:
                    assigned[i] += 1
        return batch

    def _launch(self, act: Launch, batch: Launching) -> None:
        """Append the launch's requests to `batch`, the run's requests to follow (`_book_requests`)."""
        epoch = self.taken_epoch.get(act.prompt_id)
        if epoch is None or (epoch, act.prompt_id) not in self.pending:
            raise RlsimError(f"policy launched prompt {act.prompt_id}, which it has not taken for this visit")
        max_tokens = min(act.max_tokens or self.rl.max_response_len, self.rl.max_response_len)
        if self.rl.max_model_len is not None and self.turns is None:  # vLLM's cap: prompt plus response
            prompt_tokens = self.index.prompt_ints[self.index.start[(epoch, act.prompt_id)]]
            max_tokens = min(max_tokens, self.rl.max_model_len - prompt_tokens)
        inst = self._instance_for(act)
        if act.resume is not None:
            self._book_requests(batch)
            batch.add(self._resume(act, max_tokens, inst))
            batch.booked += 1
            return
        visit = (epoch, act.prompt_id)
        if act.restart:
            self.next_sample[visit] = 0
            self.finished[visit] = []
        n = act.num_samples
        if act.redraw is not None:
            if len(act.redraw) != n:
                raise RlsimError(f"policy redrew {len(act.redraw)} samples for a Launch of {n}")
            draws = list(act.redraw)
        else:
            first = self.next_sample.get(visit, 0)
            self.next_sample[visit] = first + n
            draws = range(first, first + n)
        index, requests, pid, version = self.index, self.requests, act.prompt_id, self.rollout_version
        base, samples = index.start[visit], index.samples
        first_id = len(requests) + len(batch.columns[0]) - batch.booked
        ids = range(first_id, first_id + n)
        self.in_flight.setdefault(pid, set()).update(ids)
        # Past the trace's samples, reuse them cyclically (counted in the summary).
        turns = self.turns
        if isinstance(draws, range) and draws.stop <= samples:
            idx = draws
            lo = base + draws.start
            if n == 1 and turns is None:  # one sample (a policy that launches as samples finish): no columns built
                w = inst[0] if isinstance(inst, tuple) else (-1 if inst is None else inst)
                row = (first_id, pid, lo - base, epoch, index.prompt_ints[lo], max_tokens, index.out_ints[lo], w,
                       version, 0, 0, False)  # fmt: skip
                deque(map(list.append, batch.columns, row), 0)  # (each column's append, in C)
                return
            prompt, target = index.prompt_ints[lo : lo + n].tolist(), index.out_ints[lo : lo + n].tolist()
        else:
            idx = [k % samples for k in draws]
            self.reused_samples += sum(k >= samples for k in draws)
            pi, oi = index.prompt_ints, index.out_ints
            prompt, target = [pi[base + s] for s in idx], [oi[base + s] for s in idx]
        where = list(inst) if isinstance(inst, tuple) else [-1 if inst is None else inst] * n
        cols = (ids, [pid] * n, idx, [epoch] * n, prompt, [max_tokens] * n, target, where, [version] * n,
                [0] * n, [0] * n, [False] * n)  # fmt: skip
        if turns is None:
            batch.extend(cols)
            return
        rows = [base + s for s in idx]  # a multi-turn sample starts with its first turn
        out = [turns.first_turn(req, row) for req, row in zip(map(Request, *cols), rows, strict=True)]
        self._book_requests(batch)
        requests.extend(out)
        for req in out:
            batch.add(req)
        batch.booked = len(batch)

    def _resume(self, act: Launch, max_tokens: int, inst) -> Request:  # noqa: ANN001
        """A request continuing an ended chunk's response (divided rollout): same sample, its
        tokens so far kept, the behaviour version of its first tokens."""
        old = self.requests[act.resume] if 0 <= act.resume < len(self.requests) else None
        if old is None or old.prompt_id != act.prompt_id or self.records.cols["outcome"][act.resume] != "chunk":
            raise RlsimError(
                f"policy resumed request {act.resume}, which is not an ended chunk of prompt {act.prompt_id}"
            )
        if act.num_samples != 1:
            raise RlsimError("a Launch that resumes a chunk launches exactly one sample")
        kept = self.records.num_output_tokens[act.resume]
        if max_tokens <= kept:
            raise RlsimError(f"policy resumed request {act.resume} with max_tokens {max_tokens} <= its {kept} tokens")
        self.records.continued(act.resume)
        rid = len(self.requests)
        where = inst[0] if isinstance(inst, tuple) else (-1 if inst is None else inst)
        req = old._replace(request_id=rid, max_tokens=max_tokens, instance=where, kept_tokens=kept)
        self.requests.append(req)
        self.in_flight.setdefault(act.prompt_id, set()).add(rid)
        if self.turns is not None and self.turns.suspended(act.resume):  # a trajectory: its turn goes on
            req = self.turns.resume(act.resume, req)
        return req

