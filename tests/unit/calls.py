"""Stored calls for the unit tests: well-formed (``build``) and unusable."""

from __future__ import annotations

from celery_delayq import envelope
from celery_delayq.keys import Keyspace

#: The store's names the unit tests' calls are checked against (delayq_prefix's default).
KEYS = Keyspace("delayq", 8)


def build(app, name="unit.plain", args=(42,), kwargs=None, **options) -> envelope.Call:
    job_id, key = options.pop("job_id", None), options.pop("key", None)
    return envelope.template(app, name, options, KEYS, args=args, kwargs=kwargs).call(
        args, kwargs, job_id=job_id, key=key, max_payload_bytes=4096, max_nesting=64)


#: Stored envelopes no worker could run: each must be refused, never published.
UNUSABLE_ENVELOPES = [
    None, "{not json", "[]", '{"t": ""}', '{"t": "x", "a": [1]}', '{"t": "x"}\n1\n',
    '{"t": "x"}\n[]\n[]', '{"t": "x"}\n[1]\n{"k": 1', '{"t": "x", "p": {"content_type": "pickle"}}',
    '{"t": "x", "o": 5}', '{"t": "x", "h": []}',
]
