"""The Celery app (and its ``DelayQ``) the Django app works with.

``settings.DELAYQ_CELERY_APP = "proj.celery:app"`` names it; without that setting it is
Celery's current app, which is the project's app when ``proj/__init__.py`` imports it as
Celery's Django guide shows. ``key_models()`` reads ``DELAYQ_KEY_MODELS``, the models that
business keys name.
"""

from __future__ import annotations

import shlex
from importlib import import_module

from celery import Celery, current_app
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from celery_delayq import DelayQ


def celery_app() -> Celery:
    """The project's Celery app; ``ImproperlyConfigured`` naming ``DELAYQ_CELERY_APP`` when
    it names none (every ``manage.py`` command reads it as it starts)."""
    path = getattr(settings, "DELAYQ_CELERY_APP", None)
    if not path:
        return current_app._get_current_object()
    module, _, attr = str(path).partition(":")
    try:
        app = getattr(import_module(module), attr or "app")
    except (ImportError, AttributeError) as exc:  # (also one raised inside that module)
        raise ImproperlyConfigured(f"settings.DELAYQ_CELERY_APP = {path!r} could not be "
                                   f"loaded: {exc}. Give it as 'package.module:app'") from exc
    if not isinstance(app, Celery):
        raise ImproperlyConfigured(f"settings.DELAYQ_CELERY_APP = {path!r} is a "
                                   f"{type(app).__name__}, not a Celery app. Give it as "
                                   "'package.module:app'")
    return app


def delayq() -> DelayQ:
    """The ``DelayQ`` of the project's Celery app."""
    return DelayQ.of(celery_app())


def resume_command(kind: str, name: str) -> str:
    """The shell command that resumes the paused ``kind`` ("task" or "queue") ``name``."""
    app = getattr(settings, "DELAYQ_CELERY_APP", None) or "proj"
    return f"celery -A {shlex.quote(app)} delayq resume --{kind} {shlex.quote(name)}"


def key_models() -> dict[str, str]:
    """``settings.DELAYQ_KEY_MODELS``: business key prefix -> model label, e.g.
    ``{"order": "shop.Order"}``, so the admin links the key ``order:42`` to order 42."""
    return dict(getattr(settings, "DELAYQ_KEY_MODELS", None) or {})
