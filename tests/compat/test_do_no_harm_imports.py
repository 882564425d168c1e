"""Do no harm: importing what Celery and pytest load in every process leaves a plain app alone.

``celery`` loads the ``celery.commands`` entry point (``celery_delayq.cli``) and pytest the
``pytest11`` one (``celery_delayq.testing.pytest_plugin``) in every process, and users import
``celery_delayq.http``. Each check runs in a fresh interpreter: this test session has long
imported the package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from celery_delayq.http import TASK_NAME

MODULES = ["celery_delayq.http", "celery_delayq.cli", "celery_delayq.testing.pytest_plugin"]

PROBE = textwrap.dedent('''
    import json, sys
    from celery import Celery, signals

    def seen(app):
        """What the package could change on an app: its tasks, send_task, a DelayQ."""
        return {"tasks": sorted(app.tasks), "send_task_patched": "send_task" in vars(app),
                "delayq": hasattr(app, "_delayq")}

    def receivers():
        return {name: len(getattr(signals, name).receivers) for name in signals.__all__
                if hasattr(getattr(signals, name), "receivers")}

    before_app = Celery("before", broker="memory://", set_as_current=False)
    before_app.finalize()
    before, signals_before = seen(before_app), receivers()
    for module in sys.argv[1:]:
        __import__(module)
    after_app = Celery("after", broker="memory://", set_as_current=False)
    after_app.finalize()
    after_app.send_task("plain.task")  # a memory:// broker takes it
    print(json.dumps({"before": before, "finalized_before_import": seen(before_app),
                      "created_after_import": seen(after_app),
                      "signals_before": signals_before, "signals_after": receivers(),
                      "prometheus": "prometheus_client" in sys.modules}))
''')


def plain_environ() -> dict[str, str]:
    """This environment without what this suite sets for itself (pytest-django's
    DJANGO_SETTINGS_MODULE would make Celery apply its Django fixup to every app)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTEST_", "DELAYQ_", "DJANGO_"))}


def probe(*modules: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, *modules], capture_output=True,
                         text=True, timeout=60, env=plain_environ())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("module", MODULES)
def test_importing_the_package_leaves_a_plain_app_unchanged(module):
    seen = probe(module)
    plain = seen["before"]
    assert TASK_NAME not in plain["tasks"]
    assert plain == {**plain, "send_task_patched": False, "delayq": False}
    assert seen["finalized_before_import"] == plain
    assert seen["created_after_import"] == plain
    assert seen["signals_after"] == seen["signals_before"]


def test_the_celery_command_entry_point_imports_no_metrics_library():
    # prometheus_client builds its global registry on import, and its multiprocess mode
    # reads PROMETHEUS_MULTIPROC_DIR then: a user's worker must import it first, if at all.
    assert not probe("celery_delayq.cli")["prometheus"]
