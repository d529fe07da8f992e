"""OpenTelemetry tracing of enqueues and executions (the optional extra `shigoto[otel]`).

`instrument()` registers two middlewares, outermost, through the public middleware API:

- an enqueue middleware (sync and async twins) that wraps each write in a PRODUCER span
  `send <queue>` and stores that span's context in each job's meta under `otel` (the W3C
  `traceparent`, plus `tracestate` and baggage, written by the globally configured propagator);
- an execution middleware that wraps each attempt in a CONSUMER span `process <queue>` whose
  parent is the context stored at enqueue, so the execution continues the enqueuing service's
  trace. The messaging conventions require a link to the creation context and allow it as the
  parent when a span processes a single message, as an attempt always does; the span has both.
  A job enqueued without a context (a cron slot, an uninstrumented service) starts a new trace.

Attributes follow the OpenTelemetry messaging semantic conventions: `messaging.system`
("shigoto"), `messaging.operation.type` and `.name` ("send" for enqueue, the current name of
the deprecated "publish"; "process" for execution), `messaging.destination.name` (the queue;
omitted for a batch spanning several), `messaging.message.id` (the job id; for one job),
`messaging.batch.message_count` (batches of more than one); and `shigoto.worker`,
`shigoto.attempt`, `shigoto.max_attempts`, `shigoto.outcome` (completed, failure, snooze,
cancel, discard, interrupted) with `shigoto.snooze.seconds` or `shigoto.reason`.

A failure (an exception from the perform or from inner middleware) is recorded on the span as
an exception event with status ERROR and `error.type`; snooze, cancel and discard are outcomes,
not errors: they leave the status unset and are told by the attributes. An attempt cut short by
its timeout, an operator's cancel or shutdown ends with `interrupted` and status ERROR.

Importing `shigoto` never imports this module; importing this one without the extra raises
`ConfigurationError` saying what to install.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from shigoto import errors, middleware
from shigoto.context import current_job
from shigoto.errors import Cancel, ConfigurationError, Discard, Error, Snooze
from shigoto.job import Job
from shigoto.jobspec import JobSpec

try:
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer
except ImportError as exc:  # pragma: no cover - the extra is installed wherever tests run
    raise ConfigurationError(
        "shigoto.otel needs OpenTelemetry: pip install 'shigoto[otel]' (opentelemetry-api, "
        "and opentelemetry-sdk or another SDK to export spans)"
    ) from exc

#: The meta key holding the enqueuing span's propagated context.
META_KEY = "otel"
SYSTEM = "shigoto"


# -- attributes (pure) -------------------------------------------------------------------------


def send_attributes(specs: list[JobSpec]) -> dict[str, Any]:
    """A send span's attributes, known before the write."""
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
    }
    queues = {s.queue for s in specs}
    if len(queues) == 1:
        attributes["messaging.destination.name"] = next(iter(queues))
    workers = {s.worker for s in specs}
    if len(workers) == 1:
        attributes["shigoto.worker"] = next(iter(workers))
    if len(specs) > 1:
        attributes["messaging.batch.message_count"] = len(specs)
    return attributes


def send_name(specs: list[JobSpec]) -> str:
    queues = {s.queue for s in specs}
    return f"send {next(iter(queues))}" if len(queues) == 1 else "send"


def process_attributes(job: Job) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": job.queue,
        "messaging.message.id": str(job.id),
        "shigoto.worker": job.worker,
        "shigoto.attempt": job.attempt,
    }


def outcome_attributes(raised: BaseException | None) -> dict[str, Any]:
    """What an attempt's end says about it; `raised` is what the chain raised (None: it
    returned, so the job completed)."""
    if raised is None:
        return {"shigoto.outcome": "completed"}
    if isinstance(raised, Snooze):
        return {"shigoto.outcome": "snooze", "shigoto.snooze.seconds": float(raised.seconds)}
    if isinstance(raised, Cancel | Discard):
        kind = "cancel" if isinstance(raised, Cancel) else "discard"
        return {"shigoto.outcome": kind, "shigoto.reason": str(raised)}
    if isinstance(raised, asyncio.CancelledError):
        return {"shigoto.outcome": "interrupted"}
    return {"shigoto.outcome": "failure", "error.type": type(raised).__qualname__}


def creation_context(meta: Any) -> Context | None:
    """The enqueuing span's context stored in a job's meta, or None."""
    carrier = meta.get(META_KEY) if isinstance(meta, Mapping) else None
    if not isinstance(carrier, Mapping):
        return None
    context = propagate.extract({str(k): str(v) for k, v in carrier.items()})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


# -- the middlewares ----------------------------------------------------------------------------


class Tracing:
    """The enqueue and execution middlewares of one tracer."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    @contextmanager
    def _send_span(self, specs: list[JobSpec]) -> Iterator[tuple[Span, list[JobSpec]]]:
        with self.tracer.start_as_current_span(
            send_name(specs), kind=SpanKind.PRODUCER, attributes=send_attributes(specs)
        ) as span:  # records an exception (a refusal, a failed write) with status ERROR
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            yield span, [middleware.with_meta(s, {META_KEY: carrier}) for s in specs]

    @staticmethod
    def _sent(span: Span, jobs: list[Job]) -> list[Job]:
        if len(jobs) == 1:
            span.set_attribute("messaging.message.id", str(jobs[0].id))
        return jobs

    def send(self, specs: list[JobSpec], call_next: Callable[[list[JobSpec]], list[Job]]
             ) -> list[Job]:  # fmt: skip
        """Sync enqueue middleware."""
        with self._send_span(specs) as (span, traced):
            return self._sent(span, call_next(traced))

    async def asend(
        self, specs: list[JobSpec], call_next: Callable[[list[JobSpec]], Awaitable[list[Job]]]
    ) -> list[Job]:
        """Async enqueue middleware."""
        with self._send_span(specs) as (span, traced):
            return self._sent(span, await call_next(traced))

    async def process(self, job: Job, call_next: Callable[[Job], Awaitable[Any]]) -> Any:
        """Execution middleware: one CONSUMER span per attempt."""
        parent = creation_context(job.meta)
        links = [Link(trace.get_current_span(parent).get_span_context())] if parent else []
        with self.tracer.start_as_current_span(
            f"process {job.queue}", context=parent, kind=SpanKind.CONSUMER, links=links,
            attributes=process_attributes(job), record_exception=False,
            set_status_on_exception=False,
        ) as span:  # fmt: skip
            span.set_attribute("shigoto.max_attempts", _max_attempts())
            try:
                result = await call_next(job)
            except BaseException as raised:
                _ended(span, raised)
                raise
            span.set_attributes(outcome_attributes(None))
            return result


def _ended(span: Span, raised: BaseException) -> None:
    span.set_attributes(outcome_attributes(raised))
    if isinstance(raised, Snooze | Cancel | Discard):
        return  # outcomes, not errors
    if isinstance(raised, asyncio.CancelledError):
        span.set_status(Status(StatusCode.ERROR, "attempt interrupted: timeout, cancel or "
                                                 "shutdown"))  # fmt: skip
        return
    # The exception event of OpenTelemetry's conventions, written here rather than by
    # record_exception, which would copy a message and traceback of any size into the span.
    span.add_event("exception", {
        "exception.type": type(raised).__qualname__,
        "exception.message": errors.cut_text(str(raised)),
        "exception.stacktrace": errors.error_traceback(raised),
    })  # fmt: skip
    span.set_status(Status(StatusCode.ERROR, errors.error_message(raised)))


def _max_attempts() -> int:
    try:
        return current_job().max_attempts
    except Error:  # not under a runner's executor
        return 0


# -- switching it on ---------------------------------------------------------------------------

_installed: Tracing | None = None


def instrument(tracer_provider: Any = None) -> Tracing:
    """Trace every enqueue and execution of this process (idempotent): spans go to
    `tracer_provider`, by default the global one (set by your SDK setup or
    `opentelemetry-instrument`). Returns the middlewares, for `uninstrument`."""
    global _installed
    if _installed is not None:
        return _installed
    from shigoto import __version__

    tracing = Tracing(trace.get_tracer("shigoto", __version__, tracer_provider=tracer_provider))
    middleware.use_enqueue_middleware(tracing.send, twin=tracing.asend, outermost=True)
    middleware.use_middleware(tracing.process, outermost=True)
    _installed = tracing
    return tracing


def uninstrument() -> None:
    """Stop tracing (jobs already running finish their spans)."""
    global _installed
    if _installed is None:
        return
    middleware.remove_enqueue_middleware(_installed.send)
    middleware.remove_middleware(_installed.process)
    _installed = None


__all__ = [
    "META_KEY", "Tracing", "creation_context", "instrument", "outcome_attributes",
    "process_attributes", "send_attributes", "uninstrument",
]  # fmt: skip
