"""`shigoto.runtime.threads`: a call never waits behind a stuck one; abandoned calls are counted."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from shigoto.runtime.threads import Threads
from tests.support.waiting import wait_until


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # never leave a test thread blocked


def test_a_call_starts_even_while_every_earlier_one_is_stuck(gate: threading.Event) -> None:
    threads = Threads("t-grow")
    stuck = [threads.submit(gate.wait, 30) for _ in range(3)]
    assert threads.submit(lambda: "free").result(timeout=10) == "free"
    for future in stuck:
        threads.abandon(future)
    assert threads.stuck == 3
    gate.set()
    wait_until(lambda: threads.stuck == 0, message="stuck calls returned by themselves")
    threads.shutdown()


def test_idle_threads_are_reused() -> None:
    threads = Threads("t-reuse")
    names = set()
    for _ in range(20):
        names.add(threads.submit(lambda: threading.current_thread().name).result(timeout=10))
    assert len(names) == 1 and threads.alive == 1
    threads.shutdown()


def test_a_bounded_pool_queues_and_an_unstarted_abandoned_call_never_runs(
    gate: threading.Event,
) -> None:
    threads = Threads("t-bound", max_threads=1)
    busy = threads.submit(gate.wait, 30)
    ran = threading.Event()
    queued = threads.submit(ran.set)
    threads.abandon(queued)
    assert queued.cancelled() and threads.stuck == 0
    after = threads.submit(lambda: "next")
    gate.set()
    assert busy.result(timeout=10) is True
    assert after.result(timeout=10) == "next"
    assert not ran.is_set()
    threads.shutdown()


def test_idle_threads_exit_after_their_idle_timeout() -> None:
    threads = Threads("t-idle", idle_timeout=0.05)
    threads.submit(lambda: None).result(timeout=10)
    wait_until(lambda: threads.alive == 0, message="the idle thread exited")
    assert threads.submit(lambda: 7).result(timeout=10) == 7


def test_threads_are_daemons_and_shutdown_refuses_new_calls() -> None:
    threads = Threads("t-daemon")
    assert threads.submit(lambda: threading.current_thread().daemon).result(timeout=10)
    threads.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        threads.submit(lambda: None)
