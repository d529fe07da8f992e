"""Workers for a `shigoto run --otel` subprocess, whose spans the test reads from a file.

Importing this module (`--import`) sets up the OpenTelemetry SDK as an application would: a
global tracer provider, here exporting each finished span as one JSON line to the file named by
`SHIGOTO_TEST_SPANS`. `--otel` then instruments shigoto against that global provider.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import shigoto


class JsonLines(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                out.write(json.dumps({
                    "name": span.name, "kind": span.kind.name,
                    "trace_id": f"{span.context.trace_id:032x}",
                    "parent": f"{span.parent.span_id:016x}" if span.parent else None,
                    "attributes": dict(span.attributes or {}),
                }) + "\n")  # fmt: skip
        return SpanExportResult.SUCCESS


if os.environ.get("SHIGOTO_TEST_SPANS"):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLines(os.environ["SHIGOTO_TEST_SPANS"])))
    trace.set_tracer_provider(provider)


@shigoto.worker
def traced(n: int) -> int:
    return n
