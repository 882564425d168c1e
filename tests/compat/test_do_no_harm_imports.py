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


def _run(code: str, cwd: str | None = None, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *(["-c", code] if code else []), *args],
                          capture_output=True, text=True, timeout=120, env=plain_environ(),
                          cwd=cwd)


def test_loading_the_pytest_plugin_imports_nothing_but_the_package():
    # pytest loads it first thing in every project, before that project's conftest.py,
    # which may need to run before ssl, threading users or Celery are imported (gevent).
    out = _run(textwrap.dedent('''
        import json, sys
        import pytest
        before = set(sys.modules)
        import celery_delayq.testing.pytest_plugin
        print(json.dumps(sorted({m.split(".")[0] for m in set(sys.modules) - before})))
    '''))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["celery_delayq"]


def test_a_project_that_monkey_patches_with_gevent_in_its_conftest_still_runs(tmp_path):
    pytest.importorskip("gevent", reason="pip install gevent (in the test extra) to run it")
    (tmp_path / "conftest.py").write_text("from gevent import monkey\nmonkey.patch_all()\n")
    (tmp_path / "test_patched.py").write_text(
        "import socket\n\ndef test_sockets_are_gevents():\n"
        "    assert socket.socket.__module__.startswith('gevent')\n")
    out = _run("", str(tmp_path), "-m", "pytest", "-p", "no:cacheprovider",
               "-W", "error::gevent.monkey.MonkeyPatchWarning")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout


def test_a_projects_own_pytest_plugin_named_delayq_still_loads(tmp_path):
    """The entry point took the name ``delayq``: pytest, finding a plugin of that name
    registered, skipped the project's ``-p delayq`` without a word."""
    (tmp_path / "delayq.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef retry_budget():\n    return 3\n")
    (tmp_path / "test_budget.py").write_text(
        "def test_budget(retry_budget):\n    assert retry_budget == 3\n")
    out = _run("", str(tmp_path), "-m", "pytest", "-p", "no:cacheprovider", "-p", "delayq")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout


def test_introspecting_the_module_level_http_callback_without_a_delayq_raises_nothing():
    # gc walkers (gevent's monkey-patching, objgraph, debuggers) ask every object its
    # __class__; only using the task needs an app with a DelayQ.
    out = _run(textwrap.dedent('''
        import json
        from celery_delayq import DelayQError, http
        seen = isinstance(http.http_callback, http.HttpCallbackTask)
        try:
            http.http_callback.name
        except DelayQError as exc:
            used = str(exc)
        print(json.dumps([seen, used]))
    '''))
    assert out.returncode == 0, out.stderr
    seen, used = json.loads(out.stdout)
    assert seen is False
    assert used.startswith("celery_delayq.http_callback is registered only on apps that use "
                           "celery-delayq; call DelayQ(app)")


SHARED = textwrap.dedent('''
    import json
    from celery import Celery
    from celery_delayq import DelayedTask

    project = Celery("project", broker="memory://", set_as_current=False)

    @project.task(base=DelayedTask, name="project.close_order")  # shared, as the docs show
    def close_order(order_id):
        return order_id

    plain = Celery("plain", broker="memory://", set_as_current=False)  # a test app, say
    plain.finalize()
    result = plain.send_task("plain.task", countdown=5)  # Celery's own countdown
    print(json.dumps({"bound": "project.close_order" in plain.tasks,
                      "send_task_patched": "send_task" in vars(plain),
                      "delayq": hasattr(plain, "_delayq"), "sent": type(result).__name__}))
''')


def test_a_delayed_task_celery_binds_to_every_app_opts_no_other_app_in():
    """``@app.task`` makes a shared task by default: Celery binds it to every app of the
    process as each is finalized (Celery's ``celery_app`` test app too). Binding it opted
    that app in, so its countdowns went to a store no carrier serves (or raised, on
    memory://): only ``DelayQ(app)`` or a delayed call opts an app in."""
    out = subprocess.run([sys.executable, "-c", SHARED], capture_output=True, text=True,
                         timeout=60, env=plain_environ())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"bound": True, "send_task_patched": False,
                                      "delayq": False, "sent": "AsyncResult"}


def test_the_command_plugin_every_celery_process_loads_imports_no_store_nor_carrier():
    """``celery`` loads the plugin for every command (``celery worker``, ``celery
    inspect``): it imported the store, the journal and their Redis client, 100 ms more of
    every command's start (redis-py alone ~60 ms, through the settings for the commands'
    help). Only the group's commands import them, when they run."""
    out = subprocess.run([sys.executable, "-c", "import sys, json, celery_delayq.cli; "
                          "print(json.dumps(sorted(sys.modules)))"], capture_output=True,
                         text=True, timeout=60, env=plain_environ())
    loaded = set(json.loads(out.stdout))
    assert not loaded & {"celery_delayq.extension", "celery_delayq.store",
                         "celery_delayq.journal", "celery_delayq.carrier", "redis"}
