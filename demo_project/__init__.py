"""The demo shop: a small Django project using celery-delayq (``make demo`` runs it)."""

from .celery_app import app as celery_app

__all__ = ["celery_app"]
