"""Optional integrations of celery-delayq with other frameworks."""
