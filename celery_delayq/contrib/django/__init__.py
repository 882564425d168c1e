"""Django app of celery-delayq: models mirroring the store, admin pages, transactional scheduling.

Add ``"celery_delayq.contrib.django"`` to ``INSTALLED_APPS`` (app label ``delayq``).
"""
