from django.apps import AppConfig


class DelayQConfig(AppConfig):
    """Connects transactional scheduling to the project's Celery app when Django starts."""

    name = "celery_delayq.contrib.django"
    label = "delayq"
    verbose_name = "Delayed tasks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .transactional import connect

        connect()
