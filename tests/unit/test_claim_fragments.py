"""The claim's plugin boundary without a database: how fragments merge into one claim."""

from __future__ import annotations

import pytest

from shigoto.runtime.claimer import ConflictingFragments, merge
from shigoto.runtime.plugins import ClaimAsk, Fragment

ASK = ClaimAsk(queue="q", limit=10, node="n")


def test_no_fragment_leaves_the_plain_claim() -> None:
    claim = merge(ASK, [])
    assert claim.where == ()
    assert claim.params == {"queue": "q", "node": "n", "limit": 10}
    assert claim.limit == 10


def test_conditions_keep_the_plugins_order_and_workers_left_out_make_one_condition() -> None:
    claim = merge(ASK, [
        ("bulkheads", Fragment(leave_out=["b", "a"])),
        ("shedding", Fragment(where="j.priority >= %(shed_floor)s", params={"shed_floor": 2})),
        ("breakers", Fragment(leave_out=["a", "c"])),
    ])  # fmt: skip
    assert claim.where == ("j.priority >= %(shed_floor)s",
                           "j.worker <> ALL(%(claim_leave_out)s::text[])")  # fmt: skip
    assert claim.params["claim_leave_out"] == ["a", "b", "c"]
    assert claim.params["shed_floor"] == 2


@pytest.mark.parametrize("name", ["limit", "queue", "shared"])
def test_two_owners_of_one_parameter_are_refused_naming_both(name: str) -> None:
    first = ("first", Fragment(params={"shared": 1}))
    second = ("second", Fragment(where=f"j.priority > %({name})s", params={name: 2}))
    with pytest.raises(ConflictingFragments, match=f"'second' sets parameter '{name}'") as err:
        merge(ASK, [first, second])
    assert "prefix it with the plugin's name" in str(err.value)
