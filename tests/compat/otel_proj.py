"""``tests.proj`` traced by OpenTelemetry's Celery instrumentation (worker, carrier or
producer alike): every span goes, one JSON line each, to the file ``DELAYQ_TEST_SPANS``."""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from tests.proj import app, record

__all__ = ["app", "record"]

_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
    out=open(os.environ["DELAYQ_TEST_SPANS"], "a"),  # noqa: SIM115 (open for the process)
    formatter=lambda span: span.to_json(indent=None) + "\n")))
trace.set_tracer_provider(_provider)
CeleryInstrumentor().instrument()
