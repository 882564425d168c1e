"""The demo shop's settings, and a second database, ``mirror``, for the tests of a project
that routes the delayq app's models to a database of their own (test_database_routing.py)."""

import os
import tempfile

from demo_project.settings import *  # noqa: F403
from demo_project.settings import DATABASES as DEMO_DATABASES

DATABASES = {**DEMO_DATABASES, "mirror": {
    **DEMO_DATABASES["default"],
    "NAME": os.path.join(tempfile.gettempdir(), f"delayq-mirror-{os.getpid()}.sqlite3"),
    "TEST": {"NAME": os.path.join(tempfile.gettempdir(),
                                  f"delayq-test-mirror-{os.getpid()}.sqlite3")},
}}
