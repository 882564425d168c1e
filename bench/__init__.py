"""Benchmarks of celery-delayq against Celery's native ETA (``make bench``)."""
