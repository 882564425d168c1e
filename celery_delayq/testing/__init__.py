"""Helpers for testing with celery-delayq against real servers."""
