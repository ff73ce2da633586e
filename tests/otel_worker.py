"""Run `cairnq_worker` with OpenTelemetry spans written as JSON lines to $CAIRNQ_TEST_SPANS.

    python -m tests.otel_worker --burst

The test process cannot see a child's in-memory exporter, so the child writes
each finished span to a file the test reads.
"""

from __future__ import annotations

import json
import os
import sys

import django
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans):
        with open(self.path, "a") as out:
            for span in spans:
                out.write(json.dumps({
                    "name": span.name,
                    "trace_id": f"{span.context.trace_id:032x}",
                    "span_id": f"{span.context.span_id:016x}",
                    "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                    "kind": span.kind.name,
                    "status": span.status.status_code.name,
                    "attributes": dict(span.attributes),
                }) + "\n")
        return SpanExportResult.SUCCESS


def main(argv: list[str]) -> None:
    django.setup()
    from django.core.management import execute_from_command_line

    from cairnq_django.observability import tracing

    provider = TracerProvider()
    exporter = JsonLinesExporter(os.environ["CAIRNQ_TEST_SPANS"])
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.connect(provider)
    execute_from_command_line(["manage.py", "cairnq_worker", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
