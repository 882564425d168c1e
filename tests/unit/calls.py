"""Stored calls for the unit tests: well-formed (``build``) and unusable."""

from __future__ import annotations

from celery_delayq import envelope


def build(app, name="unit.plain", args=(42,), kwargs=None, **options) -> envelope.Call:
    return envelope.build(app, name, args, kwargs, options, job_id=options.pop("job_id", None),
                          key=options.pop("key", None), max_payload_bytes=4096,
                          max_nesting=64)


#: Stored envelopes no worker could run: each must be refused, never published.
UNUSABLE_ENVELOPES = [
    None, "{not json", "[]", '{"t": ""}', '{"t": "x", "a": [1]}', '{"t": "x"}\n1\n',
    '{"t": "x"}\n[]\n[]', '{"t": "x"}\n[1]\n{"k": 1', '{"t": "x", "p": {"content_type": "pickle"}}',
    '{"t": "x", "o": 5}', '{"t": "x", "h": []}',
]
