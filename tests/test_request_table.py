"""The driver's requests as columns (`rlsim.driver.requests.RequestTable`): a `Request` stored is
the `Request` read back, by id, through pickling (a real run's checkpoint) and placement."""

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


def test_requests_read_back_as_stored() -> None:
    table = RequestTable()
    table.extend(_reqs()[:2])
    table.append(_reqs()[2])
    assert len(table) == 3
    assert list(table) == _reqs()
    assert table[-1] == _reqs()[2] and type(table[2].more_turns) is bool
    assert table.prompt_id[1] == 2**40 and table.instance[0] == -1  # 64-bit prompt ids, signed instances


def test_placement_and_pickle() -> None:
    table = RequestTable(_reqs())
    table.instance[0] = 6  # the dispatcher places an undecided sample
    table[1] = _reqs()[1]._replace(policy_version=9)
    back = pickle.loads(pickle.dumps(table))
    assert back[0] == _reqs()[0]._replace(instance=6)
    assert back[1].policy_version == 9 and list(back)[2] == _reqs()[2]


def test_ids_must_continue_the_table() -> None:
    table = RequestTable(_reqs()[:1])
    with pytest.raises(ValueError, match="out of order"):
        table.append(_reqs()[2])
    with pytest.raises(ValueError, match="stored as request"):
        table[0] = _reqs()[1]
