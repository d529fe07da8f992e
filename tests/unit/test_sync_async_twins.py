"""The client's sync and async twins take the same arguments, with the same defaults.

The logic lives once (in jobspec and the SQL); the twins repeat only their signatures, as
psycopg's do. This test is what keeps them from drifting: a parameter added to one and not
the other, or a different default, fails here.
"""

from __future__ import annotations

import inspect

import pytest

import shigoto

#: (sync, async) pairs of the public client.
TWINS = [("enqueue", "aenqueue"), ("enqueue_many", "aenqueue_many")]


def shape(fn: object) -> list[tuple[str, object, object]]:
    """Names, kinds and defaults; annotations differ on purpose (Connection vs
    AsyncConnection)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize(("sync", "async_"), TWINS)
def test_twins_take_the_same_arguments(sync: str, async_: str) -> None:
    assert inspect.iscoroutinefunction(getattr(shigoto, async_))
    assert not inspect.iscoroutinefunction(getattr(shigoto, sync))
    assert shape(getattr(shigoto, sync)) == shape(getattr(shigoto, async_))


def test_every_public_async_client_call_has_a_listed_twin() -> None:
    listed = {a for _, a in TWINS}
    found = {
        name
        for name in shigoto.__all__
        if name.startswith("aenqueue") and inspect.iscoroutinefunction(getattr(shigoto, name))
    }
    assert found <= listed, f"add {found - listed} to TWINS"
