"""``tests.proj`` with Sentry's Celery integration (worker, carrier or producer alike): every
span goes, one JSON line each, to the file ``DELAYQ_TEST_SENTRY``; nothing leaves the
machine."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import sentry_sdk
from sentry_sdk.envelope import Envelope, Item
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.transport import Transport

from tests.proj import app, plain, record, request_of

__all__ = ["app", "plain", "record", "request_of"]


class FileTransport(Transport):
    """Appends each span of an envelope to ``DELAYQ_TEST_SENTRY``."""

    def capture_envelope(self, envelope: Envelope) -> None:
        with open(os.environ["DELAYQ_TEST_SENTRY"], "a") as out:
            for item in envelope.items:
                for span in spans_of(item):
                    out.write(json.dumps(span) + "\n")


def spans_of(item: Item) -> Iterator[dict[str, Any]]:
    """Each span of an envelope item, as sentry-sdk 3.x sends them (a batch of streamed spans)
    or as 2.x does (a transaction: its root span, then the others)."""
    if item.type == "span":
        for span in item.payload.json["items"]:
            data = {name: value["value"] for name, value in span.get("attributes", {}).items()}
            yield _line(span, span["name"], data.get("sentry.op"), data)
    elif item.type == "transaction":
        transaction = item.payload.json
        root = transaction["contexts"]["trace"]
        yield _line(root, transaction["transaction"], root.get("op"), root.get("data", {}))
        for span in transaction["spans"]:
            yield _line(span, span.get("description"), span.get("op"), span.get("data", {}))


def _line(span: dict[str, Any], name: str | None, op: str | None,
          data: dict[str, Any]) -> dict[str, Any]:
    """A span's ids, name, op and ``message_id``, the id of the Celery message it published
    or ran."""
    return {"trace_id": span["trace_id"], "span_id": span["span_id"],
            "parent_span_id": span.get("parent_span_id"), "name": name, "op": op,
            "message_id": data.get("messaging.message.id")}


# No default integrations: Sentry's Redis integration leaves a command's span open (and the
# current span) when the command raises (getsentry/sentry-python#7409), as the store's
# first EVALSHA does (NOSCRIPT), so later spans would hang below it.
sentry_sdk.init(dsn="https://public@sentry.invalid/1", traces_sample_rate=1.0,
                integrations=[CeleryIntegration()], default_integrations=False,
                transport=FileTransport)
