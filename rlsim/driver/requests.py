"""RequestTable: every request a run has launched, by id, as typed columns.

An epoch of a 10x trace launches millions of requests. Kept as `Request` tuples (with their int
objects) they cost about 220 bytes each for the whole run; as columns, 45. The engine is handed
`Request` tuples and holds each only while it runs; the driver keeps the columns, reads them
directly on its hot paths (`table.instance[rid]`), and builds a `Request` back on access
(`table[rid]`) elsewhere. Ids are handed out in order, so a request's id is its row.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from rlsim.protocol import Request

# Request's fields after request_id (the row), with their array type codes: prompt ids as the
# trace has them (64-bit), every other count 32-bit, more_turns a byte
COLUMNS = (
    ("prompt_id", "q"),
    ("sample_idx", "i"),
    ("epoch", "i"),
    ("num_prompt_tokens", "i"),
    ("max_tokens", "i"),
    ("target_tokens", "i"),
    ("instance", "i"),
    ("policy_version", "i"),
    ("kept_tokens", "i"),
    ("prompt_len", "i"),
    ("more_turns", "b"),
)
assert tuple(name for name, _ in COLUMNS) == Request._fields[1:]


class RequestTable:
    """Requests by id, one typed array per `Request` field (`request_id` is the row)."""

    __slots__ = tuple(name for name, _ in COLUMNS)

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        for name, code in COLUMNS:
            setattr(self, name, array(code))
        self.extend(requests)

    def __len__(self) -> int:
        return len(self.epoch)

    def __getitem__(self, rid: int) -> Request:
        return Request(
            rid, self.prompt_id[rid], self.sample_idx[rid], self.epoch[rid], self.num_prompt_tokens[rid],
            self.max_tokens[rid], self.target_tokens[rid], self.instance[rid], self.policy_version[rid],
            self.kept_tokens[rid], self.prompt_len[rid], bool(self.more_turns[rid]),
        )  # fmt: skip

    def append(self, req: Request) -> None:
        self.extend((req,))

    def extend(self, requests: Iterable[Request]) -> None:
        """Append requests whose ids continue the table's (one extend per column)."""
        reqs = list(requests)
        if not reqs:
            return
        n = len(self)
        if any(q.request_id != n + j for j, q in enumerate(reqs)):
            raise ValueError(f"requests appended out of order: ids {reqs[0].request_id}.. after {n} requests")
        for (name, _), values in zip(COLUMNS, list(zip(*reqs, strict=True))[1:], strict=True):
            getattr(self, name).extend(values)

    def extend_columns(self, columns) -> None:  # noqa: ANN001 - one sequence per Request field
        """Append requests given as columns (`RequestBatch.columns`), ids continuing the table's."""
        ids = columns[0]
        if len(ids) and ids[0] != len(self):
            raise ValueError(f"requests appended out of order: ids {ids[0]}.. after {len(self)} requests")
        for (name, code), values in zip(COLUMNS, columns[1:], strict=True):
            getattr(self, name).extend(array(code, values))  # (built from a list in C, then copied)
