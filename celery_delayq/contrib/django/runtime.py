"""The Celery app (and its ``DelayQ``) the Django app works with.

``settings.DELAYQ_CELERY_APP = "proj.celery:app"`` names it; without that setting it is
Celery's current app, which is the project's app when ``proj/__init__.py`` imports it as
Celery's Django guide shows.
"""

from __future__ import annotations

import shlex
from importlib import import_module

from celery import current_app
from django.conf import settings

from celery_delayq import DelayQ


def celery_app():
    """The project's Celery app."""
    path = getattr(settings, "DELAYQ_CELERY_APP", None)
    if not path:
        return current_app._get_current_object()
    module, _, attr = path.partition(":")
    return getattr(import_module(module), attr or "app")


def delayq() -> DelayQ:
    """The ``DelayQ`` of the project's Celery app."""
    return DelayQ.of(celery_app())


def resume_command(kind: str, name: str) -> str:
    """The shell command that resumes the paused ``kind`` ("task" or "queue") ``name``."""
    app = getattr(settings, "DELAYQ_CELERY_APP", None) or "proj"
    return f"celery -A {shlex.quote(app)} delayq resume --{kind} {shlex.quote(name)}"
