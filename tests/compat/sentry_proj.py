"""``tests.proj`` with Sentry's Celery integration (worker, carrier or producer alike): every
transaction goes, one JSON line each, to the file ``DELAYQ_TEST_SENTRY``; nothing leaves the
machine."""

from __future__ import annotations

import json
import os

import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.integrations.celery import CeleryIntegration
from sentry_sdk.transport import Transport

from tests.proj import app, plain, record, request_of

__all__ = ["app", "plain", "record", "request_of"]


class FileTransport(Transport):
    """Appends each transaction of an envelope to ``DELAYQ_TEST_SENTRY``."""

    def capture_envelope(self, envelope: Envelope) -> None:
        with open(os.environ["DELAYQ_TEST_SENTRY"], "a") as out:
            for item in envelope.items:
                transaction = item.get_transaction_event()
                if transaction is not None:
                    out.write(json.dumps(transaction, default=str) + "\n")


# No default integrations: Sentry's Redis integration leaves a command's span open (and the
# current span) when the command raises (getsentry/sentry-python#7409), as the store's
# first EVALSHA does (NOSCRIPT), so later spans would hang below it.
sentry_sdk.init(dsn="https://public@sentry.invalid/1", traces_sample_rate=1.0,
                integrations=[CeleryIntegration()], default_integrations=False,
                transport=FileTransport)
