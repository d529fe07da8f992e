"""The pytest plugin (registered through the `pytest11` entry point): a `shigoto` fixture.

In a test that asks for it, enqueues are recorded instead of written (`testing.manual()`), so
unit tests need no database:

    def test_signup_sends_welcome(shigoto):
        signup("ada@example.com")
        shigoto.assert_enqueued("myapp.workers.send_welcome", args={"email": "ada@example.com"})
        shigoto.drain()                      # perform what was recorded, in this process

`shigoto.inline()` switches to performing each job at once as it is enqueued.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shigoto import testing


class ShigotoFixture:
    """What the `shigoto` fixture gives a test: the recorder and the assertions."""

    def __init__(self, recorder: testing.Recorder) -> None:
        self.recorder = recorder

    @property
    def jobs(self) -> list[Any]:
        return list(self.recorder.jobs)

    def all_enqueued(self, worker: Any = None, **filters: Any) -> list[Any]:
        return testing.all_enqueued(worker, **filters)

    def assert_enqueued(self, worker: Any = None, **filters: Any) -> Any:
        return testing.assert_enqueued(worker, **filters)

    def refute_enqueued(self, worker: Any = None, **filters: Any) -> None:
        testing.refute_enqueued(worker, **filters)

    def drain(self, queue: str | None = None, *, with_scheduled: bool = False) -> dict[str, int]:
        return testing.active_recorder().drain(queue, with_scheduled=with_scheduled)

    def perform_job(self, worker: Any, args: dict[str, Any] | None = None, **options: Any) -> Any:
        return testing.perform_job(worker, args, **options)

    def inline(self, *, raise_errors: bool = True) -> Any:
        """A context manager: within it, each job runs as it is enqueued."""
        return testing.inline(raise_errors=raise_errors)


@pytest.fixture
def shigoto() -> Iterator[ShigotoFixture]:
    """Enqueues are recorded, not written, for the duration of the test (manual mode)."""
    with testing.manual() as recorder:
        yield ShigotoFixture(recorder)
