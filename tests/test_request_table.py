"""The driver's requests as columns (`rlsim.driver.requests.RequestTable`): a `Request` stored is
the `Request` read back, by id, through placement and pickling (a real run's checkpoint)."""

from __future__ import annotations

import pickle

import pytest

from rlsim.driver.requests import RequestTable
from rlsim.protocol import Request


def _reqs() -> list[Request]:
    return [
        Request(0, 17, 3, 1, 250, 8192, 4000, -1, 0),
        Request(1, 2**40, 0, 0, 90, 512, 512, 3, 2, kept_tokens=100),
        Request(2, 5, 1, 2, 1200, 2048, 77, 0, 5, prompt_len=300, more_turns=True),
    ]


def _all(table: RequestTable) -> list[Request]:
    return [table[i] for i in range(len(table))]


def test_requests_read_back_as_stored() -> None:
    table = RequestTable()
    table.extend(_reqs()[:2])
    table.append(_reqs()[2])
    assert len(table) == 3
    assert _all(table) == _reqs()
    assert type(table[2].more_turns) is bool
    assert table.prompt_id[1] == 2**40 and table.instance[0] == -1  # 64-bit prompt ids, signed instances


def test_placement_and_pickle() -> None:
    table = RequestTable(_reqs())
    table.instance[0] = 6  # the dispatcher places an undecided sample
    back = pickle.loads(pickle.dumps(table))
    assert _all(back) == [_reqs()[0]._replace(instance=6), *_reqs()[1:]]


def test_ids_must_continue_the_table() -> None:
    table = RequestTable(_reqs()[:1])
    with pytest.raises(ValueError, match="out of order"):
        table.append(_reqs()[2])
