"""The demo's Celery app: broker and delay store at ``REDIS_URL`` (see settings)."""

import os

from celery import Celery

from celery_delayq import DelayQ

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")

app = Celery("demo_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
delayq = DelayQ(app)
