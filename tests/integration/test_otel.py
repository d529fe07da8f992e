"""OpenTelemetry tracing with the SDK's in-memory exporter: an enqueue made inside a service's
trace is executed by a runner in a span of the same trace (its parent is the enqueue's span,
and it links to it), with the messaging attributes, and failures and outcomes recorded."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import shigoto
from shigoto import otel
from shigoto.errors import MAX_ERROR_BYTES
from tests.support import middleware_workers as mw
from tests.support.in_process import running
from tests.support.waiting import row, until, wait_until


@pytest.fixture
def exporter(db_url: str) -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    otel.instrument(tracer_provider=provider)
    try:
        yield spans
    finally:
        otel.uninstrument()
        provider.shutdown()


def tracer(exporter: InMemorySpanExporter) -> Any:
    """A tracer of the service enqueueing, exporting to the same place as shigoto's spans."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("the-service")


def only(spans: list[ReadableSpan], kind: SpanKind) -> ReadableSpan:
    found = [s for s in spans if s.kind == kind]
    assert len(found) == 1, found
    return found[0]


async def test_execution_continues_the_enqueuing_trace(
    exporter: InMemorySpanExporter, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running(db_url):  # started outside the request: its tasks carry no trace
        with tracer(exporter).start_as_current_span("POST /signup") as request:
            job = await shigoto.aenqueue(mw.plain, {"n": 3}, database_url=db_url)
        await until(lambda: any(s.kind == SpanKind.CONSUMER for s in exporter.get_finished_spans()),
                    message="process span exported")  # fmt: skip
    spans = list(exporter.get_finished_spans())
    send, process = only(spans, SpanKind.PRODUCER), only(spans, SpanKind.CONSUMER)
    trace_id = request.get_span_context().trace_id
    assert send.context.trace_id == process.context.trace_id == trace_id
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert [link.context.span_id for link in process.links] == [send.context.span_id]
    assert row(conn, job.id)["meta"]["otel"]["traceparent"].split("-")[1] == f"{trace_id:032x}"

    assert send.name == "send default"
    assert dict(send.attributes or {}) == {
        "messaging.system": "shigoto", "messaging.operation.type": "send",
        "messaging.operation.name": "send", "messaging.destination.name": "default",
        "shigoto.worker": mw.plain.name, "messaging.message.id": str(job.id),
    }  # fmt: skip
    assert process.name == "process default"
    assert dict(process.attributes or {}) == {
        "messaging.system": "shigoto", "messaging.operation.type": "process",
        "messaging.operation.name": "process", "messaging.destination.name": "default",
        "messaging.message.id": str(job.id), "shigoto.worker": mw.plain.name,
        "shigoto.attempt": 1, "shigoto.max_attempts": 3, "shigoto.outcome": "completed",
    }  # fmt: skip
    assert process.status.status_code == StatusCode.UNSET


def test_a_failure_is_recorded_with_status_error(
    exporter: InMemorySpanExporter, conn: psycopg.Connection[Any]
) -> None:
    job = shigoto.enqueue(mw.fails, {"why": "no disk"})
    assert shigoto.drain_queue() == {"retryable": 1}
    process = only(list(exporter.get_finished_spans()), SpanKind.CONSUMER)
    assert process.status.status_code == StatusCode.ERROR
    assert process.status.description == "ValueError: no disk"
    assert process.attributes["shigoto.outcome"] == "failure"  # type: ignore[index]
    assert process.attributes["error.type"] == "ValueError"  # type: ignore[index]
    [event] = process.events
    assert event.name == "exception"
    assert event.attributes["exception.message"] == "no disk"  # type: ignore[index]
    assert row(conn, job.id)["errors"][0]["error"] == "ValueError: no disk"  # still recorded


def test_a_huge_error_message_is_cut_on_the_span_too(exporter: InMemorySpanExporter) -> None:
    """The span's exception event and status carry the stored, cut message (issue 24), not a
    copy of whatever size the exception had."""
    shigoto.enqueue(mw.fails, {"why": "x" * 2_000_000})
    assert shigoto.drain_queue() == {"retryable": 1}
    process = only(list(exporter.get_finished_spans()), SpanKind.CONSUMER)
    [event] = process.events
    message = event.attributes["exception.message"]  # type: ignore[index]
    assert len(message.encode()) <= MAX_ERROR_BYTES and "[cut: 2,000,000 bytes" in message
    assert len(process.status.description.encode()) <= MAX_ERROR_BYTES  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("what", "attributes"),
    [("snooze", {"shigoto.outcome": "snooze", "shigoto.snooze.seconds": 60.0}),
     ("cancel", {"shigoto.outcome": "cancel", "shigoto.reason": "refused by middleware"}),
     ("discard", {"shigoto.outcome": "discard", "shigoto.reason": "dropped by middleware"})],
)  # fmt: skip
def test_outcomes_are_attributes_not_errors(
    exporter: InMemorySpanExporter, what: str, attributes: dict[str, Any]
) -> None:
    shigoto.enqueue(mw.guarded, {"mw": what})
    shigoto.drain_queue()
    process = only(list(exporter.get_finished_spans()), SpanKind.CONSUMER)
    assert {k: process.attributes[k] for k in attributes} == attributes  # type: ignore[index]
    assert process.status.status_code == StatusCode.UNSET


def test_a_job_enqueued_without_a_trace_starts_its_own(
    exporter: InMemorySpanExporter, conn: psycopg.Connection[Any]
) -> None:
    otel.uninstrument()  # enqueued by an uninstrumented service: no context in meta
    job = shigoto.enqueue(mw.plain)
    assert "otel" not in row(conn, job.id)["meta"]
    otel.instrument(tracer_provider=exporter_provider(exporter))
    shigoto.drain_queue()
    process = only(list(exporter.get_finished_spans()), SpanKind.CONSUMER)
    assert process.parent is None and list(process.links) == []


def exporter_provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def test_a_refused_enqueue_ends_its_span_in_error(
    exporter: InMemorySpanExporter, conn: psycopg.Connection[Any]
) -> None:
    def refuse(specs: list[Any], call_next: Any) -> Any:
        raise PermissionError("not today")

    shigoto.use_enqueue_middleware(refuse)
    try:
        with pytest.raises(PermissionError):
            shigoto.enqueue_many([{"worker": mw.plain}, {"worker": mw.plain, "queue": "other"}])
    finally:
        shigoto.remove_enqueue_middleware(refuse)
    send = only(list(exporter.get_finished_spans()), SpanKind.PRODUCER)
    assert send.name == "send"  # two queues: no single destination
    assert send.attributes["messaging.batch.message_count"] == 2  # type: ignore[index]
    assert "messaging.destination.name" not in (send.attributes or {})
    assert send.status.status_code == StatusCode.ERROR
    assert conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone() == (0,)


def test_shigoto_run_otel_continues_the_trace_in_another_process(
    exporter: InMemorySpanExporter, conn: psycopg.Connection[Any], runner_processes: Any,
    tmp_path: Path,
) -> None:  # fmt: skip
    spans_file = tmp_path / "spans.jsonl"
    with tracer(exporter).start_as_current_span("POST /orders") as request:
        job = shigoto.enqueue("tests.support.otel_workers.traced", {"n": 1})
    runner = runner_processes("--otel", workers="tests.support.otel_workers",
                              env={"SHIGOTO_TEST_SPANS": str(spans_file)})  # fmt: skip
    wait_until(lambda: row(conn, job.id)["state"] == "completed", timeout=60,
               message=f"job completed:\n{runner.output()}")  # fmt: skip
    process = wait_until(lambda: _consumer_line(spans_file), message="process span written")
    send = only(list(exporter.get_finished_spans()), SpanKind.PRODUCER)
    assert process["trace_id"] == f"{request.get_span_context().trace_id:032x}"
    assert process["parent"] == f"{send.context.span_id:016x}"
    assert process["attributes"]["messaging.message.id"] == str(job.id)
    runner.signal(signal.SIGTERM)
    assert runner.wait_exit() == 0


def _consumer_line(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return next((s for s in lines if s["kind"] == "CONSUMER"), None)
