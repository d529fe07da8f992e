"""The telemetry API on its own: subscribing, filtering, detaching, and failing subscribers."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shigoto import telemetry


@pytest.fixture
def attach() -> Iterator[Callable[..., int]]:
    """`telemetry.attach` that detaches everything it attached when the test ends."""
    handles: list[int] = []

    def attach_(handler: telemetry.Handler, events: Any = None) -> int:
        handles.append(telemetry.attach(handler, events))
        return handles[-1]

    yield attach_
    for handle in handles:
        telemetry.detach(handle)


def recorder() -> tuple[list[tuple[str, dict[str, Any], dict[str, Any]]], telemetry.Handler]:
    seen: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    def handler(event: str, measurements: dict[str, Any], metadata: dict[str, Any]) -> None:
        seen.append((event, measurements, metadata))

    return seen, handler


def test_a_subscriber_gets_every_event_by_default(attach) -> None:
    seen, handler = recorder()
    attach(handler)
    telemetry.emit("job.start", {"system_time": 1.0}, {"node": "n"})
    telemetry.emit("pruner.prune", {"archived": 2}, {"node": "n"})
    assert seen == [
        ("job.start", {"system_time": 1.0}, {"node": "n"}),
        ("pruner.prune", {"archived": 2}, {"node": "n"}),
    ]


def test_a_subscriber_gets_only_the_events_it_asked_for(attach) -> None:
    seen, handler = recorder()
    attach(handler, ["job.stop", "job.exception"])
    for event in ("job.start", "job.stop", "stager.stage", "job.exception"):
        telemetry.emit(event, {}, {})
    assert [event for event, _, _ in seen] == ["job.stop", "job.exception"]


def test_an_unknown_event_name_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"job\.finish") as info:
        telemetry.attach(lambda *_: None, ["job.finish"])
    assert "job.stop" in str(info.value)


def test_detach_stops_delivery_and_is_idempotent(attach) -> None:
    seen, handler = recorder()
    handle = attach(handler)
    telemetry.emit("job.start", {}, {})
    telemetry.detach(handle)
    telemetry.detach(handle)
    telemetry.emit("job.start", {}, {})
    assert len(seen) == 1


def test_a_raising_subscriber_is_logged_and_the_others_still_run(
    attach, caplog: pytest.LogCaptureFixture
) -> None:
    def faulty(event: str, measurements: dict[str, Any], metadata: dict[str, Any]) -> None:
        raise RuntimeError("subscriber bug")

    seen, handler = recorder()
    attach(faulty)
    attach(handler)
    with caplog.at_level(logging.ERROR, logger="shigoto.telemetry"):
        telemetry.emit("job.stop", {"duration": 0.1}, {"node": "n"})  # must not raise
    assert [event for event, _, _ in seen] == ["job.stop"]
    [record] = [r for r in caplog.records if r.name == "shigoto.telemetry"]
    assert "job.stop" in record.getMessage()
    assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)


def test_a_subscriber_may_detach_itself_while_events_are_emitted(attach) -> None:
    calls: list[str] = []
    handles: list[int] = []

    def once(event: str, measurements: dict[str, Any], metadata: dict[str, Any]) -> None:
        calls.append(event)
        telemetry.detach(handles[0])

    handles.append(attach(once))
    telemetry.emit("job.start", {}, {})
    telemetry.emit("job.start", {}, {})
    assert calls == ["job.start"]


def test_nothing_is_followed_until_a_handler_attaches_and_after_it_detaches(attach) -> None:
    # `enabled` is what per-job emitters ask before building anything: it must follow attach
    # and detach exactly, per event.
    assert not telemetry.enabled("job.claim")
    handle = attach(lambda *_: None, ["job.claim"])
    assert telemetry.enabled("job.claim")
    assert not telemetry.enabled("job.start")
    telemetry.detach(handle)
    assert not telemetry.enabled("job.claim")
