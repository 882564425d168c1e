"""The version matrix (`make test-matrix`): each suite on the oldest and the newest versions
pyproject.toml allows. docs/compatibility.md holds the table of the last full run.

``lowest`` installs every requirement pyproject.toml names at its declared floor (uv's
``--resolution lowest-direct``; what those need in turn resolves to its newest release) on
the oldest Python; ``latest`` installs the newest releases on the newest Python.
Interpreters come from PATH or pyenv; nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.download_python = "never"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

VERSIONS = [
    nox.param("3.10", "lowest-direct", id="lowest"),
    nox.param("3.13", "highest", id="latest"),
]
SHOWN = ("celery", "kombu", "redis", "hiredis", "django", "pyspark", "pytest")
NO_CACHE = ("-p", "no:cacheprovider")  # sessions run side by side with `make test`
ALL = ("-m", "slow or not slow")  # the opt-in long runs too


def _pyenv_on_path() -> None:
    """Put pyenv's interpreters ahead on PATH: its shims answer only for the active version."""
    versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"), "versions")
    found = sorted(versions.glob("3.*/bin"), reverse=True) if versions.is_dir() else []
    os.environ["PATH"] = os.pathsep.join([*map(str, found), os.environ.get("PATH", "")])


_pyenv_on_path()


def _install(session: nox.Session, resolution: str, *requirements: str) -> None:
    session.install("--resolution", resolution, *requirements)
    session.run("python", "-c", _SHOW, silent=False)


_SHOW = f"""import importlib.metadata as m, sys
names = {{d.metadata["Name"].lower(): d.version for d in m.distributions()}}
print("python==" + sys.version.split()[0], *(n + "==" + names[n] for n in {SHOWN!r} if n in names))
"""


def _core_suite(session: nox.Session) -> None:
    """Everything but tests/django and tests/spark, in the processes ``make test`` and
    ``make test-slow`` use: a process runs one app's workers (tests/conftest.py,
    running_worker), so the HTTP suite and the long runs, which start workers of apps of
    their own, are not run beside the session's worker of ``tests.proj``."""
    apart = ("--ignore=tests/django", "--ignore=tests/spark", "--ignore=tests/http")
    session.run("pytest", *apart, "-m", "not slow", *NO_CACHE, *session.posargs)
    session.run("pytest", *apart, "-m", "slow", *NO_CACHE, *session.posargs)
    session.run("pytest", "tests/http", *ALL, *NO_CACHE, *session.posargs)


@nox.session
@nox.parametrize("python,resolution", VERSIONS)
def core(session: nox.Session, resolution: str) -> None:
    """The core suite (everything but tests/django and tests/spark)."""
    _install(session, resolution, "-e", ".[test]")
    _core_suite(session)


@nox.session(python="3.11")
def core_celery55(session: nox.Session) -> None:
    """The core suite on Celery 5.5, whose kombu caps redis-py at 5.2.1."""
    _install(session, "highest", "-e", ".[test]", "celery>=5.5,<5.6", "redis<5.3")
    _core_suite(session)


@nox.session
@nox.parametrize("python,resolution", VERSIONS)
def django(session: nox.Session, resolution: str) -> None:
    """The Django app's suite: Django 4.2 LTS on the lowest stack, the newest on the latest."""
    _install(session, resolution, "-e", ".[test,django]", "pytest-django>=4.8",
             "selenium>=4.15")
    session.run("pytest", "tests/django", *NO_CACHE, *session.posargs)


@nox.session
@nox.parametrize("python,resolution", VERSIONS)
def spark(session: nox.Session, resolution: str) -> None:
    """The Spark suite: PySpark 3.5 on the lowest stack, the newest on the latest."""
    _install(session, resolution, "-e", ".[test,spark]", "selenium>=4.15")
    session.run("pytest", "tests/spark", *ALL, *NO_CACHE, *session.posargs)
