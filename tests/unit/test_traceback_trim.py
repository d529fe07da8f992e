"""Stored tracebacks start at the user's frame (issue 25, item 7): the frames of Shigoto's
executor, thread dispatch and middleware chain above it are dropped for one line saying how
many; and inline test mode raises a job's error without an unrelated
`RuntimeError: no running event loop` chained onto it."""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterator
from typing import Any

import pytest

import shigoto
from shigoto import middleware, testing
from shigoto.job import Job
from shigoto.runtime.outcome import error_entry

NOTE = re.compile(r"^  … (\d+) frames of shigoto omitted$", re.MULTILINE)


@shigoto.worker
def fails_in_a_helper(n: int) -> None:
    _helper(n)


@shigoto.worker
async def fails_async(n: int) -> None:
    _helper(n)


def _helper(n: int) -> None:
    raise ValueError(f"bad value {n}")


@pytest.fixture(autouse=True)
def no_middleware() -> Iterator[None]:
    saved = (middleware._execution, middleware._enqueue)
    middleware._execution, middleware._enqueue = (), ()
    yield
    middleware._execution, middleware._enqueue = saved


def _stored_traceback(worker: Any) -> str:
    with testing.inline(raise_errors=False) as jobs:
        worker.enqueue(n=7)
        [job] = jobs.all_enqueued()
    return str(job.errors[-1]["traceback"])


def _frames(text: str) -> list[str]:
    return re.findall(r'^  File "([^"]+)", line \d+, in (\S+)$', text, re.MULTILINE)


@pytest.mark.parametrize("worker", [fails_in_a_helper, fails_async])
def test_the_stored_traceback_starts_at_the_users_frame(worker: Any) -> None:
    text = _stored_traceback(worker)
    assert text.startswith("Traceback (most recent call last):\n  … ")
    assert int(NOTE.findall(text)[0]) >= 1
    frames = _frames(text)
    assert frames[0] == (__file__, worker.fn.__name__)
    assert frames[-1] == (__file__, "_helper")
    assert "shigoto/runtime" not in text and text.endswith("ValueError: bad value 7\n")


def test_middleware_frames_above_the_worker_are_dropped_too() -> None:
    def user_middleware(job: Job, call_next: Any) -> Any:
        return call_next(job)

    middleware.use_middleware(user_middleware)
    frames = _frames(_stored_traceback(fails_in_a_helper))
    # The user's middleware is their frame: the trace starts there; Shigoto's chain frames
    # between it and the worker stay (they are not at the top).
    assert frames[0] == (__file__, "user_middleware")
    assert frames[-1] == (__file__, "_helper")


def test_a_traceback_with_no_shigoto_frame_at_the_top_is_kept_whole() -> None:
    error: BaseException | None = None
    try:
        _helper(1)
    except ValueError as exc:
        error = exc
    assert error is not None
    entry = error_entry(1, error)
    assert not NOTE.search(entry["traceback"])
    assert entry["traceback"] == "".join(traceback.format_exception(error))


def test_inline_mode_chains_nothing_unrelated_onto_a_failure() -> None:
    with pytest.raises(ValueError, match="bad value 7") as raised, testing.inline():
        fails_in_a_helper.enqueue(n=7)
    text = "".join(traceback.format_exception(raised.value))
    assert "no running event loop" not in text
    assert "During handling of the above exception" not in text
