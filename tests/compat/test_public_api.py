"""What a library user imports: the public types from the package root, typed (PEP 561)."""

from __future__ import annotations

import inspect
from importlib import resources

import celery_delayq
from celery_delayq import errors


def test_every_error_of_the_hierarchy_is_exported_from_the_package_root():
    hierarchy = {name for name, value in inspect.getmembers(errors, inspect.isclass)
                 if issubclass(value, errors.DelayQError)}
    assert hierarchy <= set(celery_delayq.__all__)
    assert all(getattr(celery_delayq, name) is getattr(errors, name) for name in hierarchy)


def test_returned_types_are_exported_from_the_package_root():
    from celery_delayq.job import Job
    from celery_delayq.store import CancelOutcome

    assert celery_delayq.Job is Job and celery_delayq.CancelOutcome is CancelOutcome
    assert {"Job", "CancelOutcome", "DelayQ", "DelayedResult", "DelayedTask"} <= set(
        celery_delayq.__all__)


def test_package_says_it_is_typed():
    assert resources.files(celery_delayq).joinpath("py.typed").is_file()
