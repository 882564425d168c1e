"""The package's errors keep their message when Celery stores and rebuilds them."""

from __future__ import annotations

import pickle

import pytest

from celery_delayq.errors import DamagedShard, JobExists, StoreFull, StoreUnavailable

ERRORS = [
    StoreFull("Redis at redis://h:6379/0 uses 9 of its 10 bytes (maxmemory)"),
    StoreUnavailable("Redis at redis://h:6379/0 refused a write", stored=["a", "b"]),
    DamagedShard("shard 1's due holds a string"),
    JobExists("order:1"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda error: type(error).__name__)
def test_an_error_rebuilt_from_its_message_says_it_once(error):
    """A result backend stores an exception's class and args, and rebuilds it with
    ``cls(*args)`` (a ``Reject`` of a retry the store refused carries one)."""
    assert str(type(error)(*error.args)) == str(error)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)
