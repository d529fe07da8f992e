"""The client's sync and async twins take the same arguments, with the same defaults.

Their code is written once, async, and the sync modules are generated from it
(tools/async_to_sync.py: the insert path, the job API and enqueueing), so
tests/unit/test_generated_sync.py is what checks that the two do the same thing. What the
generator does not cover is checked here: every public pair exported by `shigoto` takes the
same arguments (operations, queue settings and migrations have twins of their own, outside
the generator).
"""

from __future__ import annotations

import inspect

import pytest

import shigoto

#: (sync, async) pairs of the public API: every coroutine function `aX` that `shigoto`
#: exports, and the sync `X` it is the twin of (enqueue, retry_by, status, migrate...).
TWINS = sorted(
    (name[1:], name)
    for name in shigoto.__all__
    if inspect.iscoroutinefunction(getattr(shigoto, name))
)


def shape(fn: object) -> list[tuple[str, object, object]]:
    """Names, kinds and defaults; annotations differ on purpose (Connection vs
    AsyncConnection)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize(("sync", "async_"), TWINS)
def test_twins_take_the_same_arguments(sync: str, async_: str) -> None:
    assert inspect.iscoroutinefunction(getattr(shigoto, async_))
    assert not inspect.iscoroutinefunction(getattr(shigoto, sync))
    assert shape(getattr(shigoto, sync)) == shape(getattr(shigoto, async_))


def test_every_public_async_call_has_an_exported_sync_twin() -> None:
    assert {"aenqueue", "aretry_by", "astatus", "amigrate", "alist_jobs", "await_for"} <= {
        a for _, a in TWINS
    }
    missing = [sync for sync, _ in TWINS if sync not in shigoto.__all__]
    assert missing == [], f"async calls without an exported sync twin: {missing}"
