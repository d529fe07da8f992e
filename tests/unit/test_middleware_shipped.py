"""The shipped middlewares and the OpenTelemetry attribute rules, without a database; and that
importing shigoto does not import OpenTelemetry."""

from __future__ import annotations

import logging
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import shigoto
from shigoto import otel
from shigoto.clock import ManualClock
from shigoto.job import Job, JobState
from shigoto.jobspec import build
from shigoto.middleware.shipped import (
    Deadline,
    JobLogFilter,
    current_log_fields,
    deadline,
    deadline_of,
    log_context,
    parse_deadline,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def a_job(meta: dict[str, Any] | None = None, **fields: Any) -> Job:
    return Job(id=9, queue="mail", worker="send", args={}, state=JobState.EXECUTING,
               attempt=2, inserted_at=T0, meta=meta or {}, **fields)  # fmt: skip


async def performed(job: Job) -> str:
    return "ran"


# -- deadline ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("2026-01-01T13:00:00+01:00", T0), ("2026-01-01T12:00:00", T0), (T0.timestamp(), T0)],
)
def test_deadlines_parse_from_iso_or_unix_seconds(value: Any, expected: datetime) -> None:
    assert parse_deadline(value) == expected


@pytest.mark.parametrize("value", ["soon", True, [], 1e20])
def test_anything_else_is_not_a_deadline(value: Any) -> None:
    with pytest.raises(shigoto.ValidationError, match="ISO 8601"):
        parse_deadline(value)


def test_the_earlier_of_meta_and_relative_deadline_wins() -> None:
    soon = (T0 + timedelta(minutes=5)).isoformat()
    assert deadline_of(a_job({"deadline": soon}), timedelta(hours=1)) == T0 + timedelta(minutes=5)
    assert deadline_of(a_job({"deadline": soon}), timedelta(minutes=1)) == T0 + timedelta(minutes=1)
    assert deadline_of(a_job(), None) is None


async def test_a_job_runs_until_its_deadline_and_is_discarded_from_then_on() -> None:
    clock = ManualClock(T0)
    mw = deadline(60, clock=clock)
    clock.advance(59.9)
    assert await mw(a_job(), performed) == "ran"
    clock.advance(0.1)
    with pytest.raises(shigoto.Discard, match="before attempt 2 began"):
        await mw(a_job(), performed)


async def test_an_unreadable_meta_deadline_discards_naming_it() -> None:
    with pytest.raises(shigoto.Discard, match=r"meta\.deadline"):
        await Deadline(clock=ManualClock(T0))(a_job({"deadline": "soon"}), performed)


@pytest.mark.parametrize("within", [0, -1, True, "60"])
def test_a_bad_relative_deadline_is_refused_at_definition(within: Any) -> None:
    with pytest.raises(shigoto.ValidationError, match="within"):
        deadline(within)


# -- log context -------------------------------------------------------------------------------


async def test_log_context_binds_fields_only_for_the_job() -> None:
    seen: dict[str, Any] = {}

    async def inside(job: Job) -> None:
        seen.update(current_log_fields())

    await log_context(a_job(), inside)
    assert seen == {"job_id": 9, "worker": "send", "queue": "mail", "attempt": 2}
    assert dict(current_log_fields()) == {}


async def test_the_filter_never_overrides_explicit_extra() -> None:
    record = logging.makeLogRecord({"job_id": "explicit"})

    async def inside(job: Job) -> None:
        JobLogFilter().filter(record)

    await log_context(a_job(), inside)
    assert record.job_id == "explicit" and record.queue == "mail"  # type: ignore[attr-defined]


# -- OpenTelemetry attributes --------------------------------------------------------------------


def test_send_attributes_of_one_job_and_of_a_mixed_batch() -> None:
    one = [build("send", {}, queue="mail")]
    assert otel.send_attributes(one) == {
        "messaging.system": "shigoto", "messaging.operation.type": "send",
        "messaging.operation.name": "send", "messaging.destination.name": "mail",
        "shigoto.worker": "send",
    }  # fmt: skip
    mixed = [build("send", {}, queue="mail"), build("bill", {}, queue="money")]
    attributes = otel.send_attributes(mixed)
    assert attributes["messaging.batch.message_count"] == 2
    assert "messaging.destination.name" not in attributes and "shigoto.worker" not in attributes
    assert otel.send_name(one) == "send mail" and otel.send_name(mixed) == "send"


@pytest.mark.parametrize(
    ("raised", "expected"),
    [(None, {"shigoto.outcome": "completed"}),
     (shigoto.Snooze(5), {"shigoto.outcome": "snooze", "shigoto.snooze.seconds": 5.0}),
     (shigoto.Cancel("no"), {"shigoto.outcome": "cancel", "shigoto.reason": "no"}),
     (shigoto.Discard("bad"), {"shigoto.outcome": "discard", "shigoto.reason": "bad"}),
     (KeyError("k"), {"shigoto.outcome": "failure", "error.type": "KeyError"})],
)  # fmt: skip
def test_outcome_attributes(raised: BaseException | None, expected: dict[str, Any]) -> None:
    assert otel.outcome_attributes(raised) == expected


def test_a_meta_without_a_valid_context_gives_none() -> None:
    assert otel.creation_context({}) is None
    assert otel.creation_context({"otel": {"traceparent": "garbage"}}) is None
    assert otel.creation_context("not a dict") is None
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert otel.creation_context({"otel": {"traceparent": good}}) is not None


def test_importing_shigoto_does_not_import_opentelemetry() -> None:
    code = "import shigoto, sys; print(any(m.startswith('opentelemetry') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_old_module_name_still_imports_the_shipped_middlewares_with_a_warning() -> None:
    import importlib

    import shigoto.middleware

    sys.modules.pop("shigoto.middlewares", None)
    with pytest.warns(DeprecationWarning, match="shigoto.middleware"):
        old = importlib.import_module("shigoto.middlewares")
    assert old.deadline is shigoto.middleware.deadline
    assert old.log_context is shigoto.middleware.log_context
