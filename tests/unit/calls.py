"""The stored form of a call, as ``apply_delayed`` makes it, for the unit tests."""

from __future__ import annotations

from celery_delayq import envelope


def build(app, name="unit.plain", args=(42,), kwargs=None, **options) -> envelope.Call:
    return envelope.build(app, name, args, kwargs, options, job_id=options.pop("job_id", None),
                          key=options.pop("key", None), max_payload_bytes=4096)
