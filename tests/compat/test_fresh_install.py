"""The quickstart from a built wheel in a new virtualenv: nothing of the checkout, nothing of
the test environment, only ``celery-delayq[server]`` and what it declares.

Opt-in (``pytest -m install``; `make test-install`, which .ci/run runs). The wheel is built
from an sdist of the checkout (so the sdist is complete too) with uv, which
also makes the venv and installs into it (PyPI, or uv's cache). The steps are the
quickstart's: its Redis (``python -m celery_delayq.testing.redis_server``), its worker and
carrier commands, then its programs, all run by the new venv's interpreter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from celery_delayq.testing.redis_server import free_port
from tests.docs.test_docs import example_env, python_examples

pytestmark = pytest.mark.install
uv = pytest.importorskip("uv", reason="uv is in the dev extra: pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = (ROOT / "docs" / "quickstart.md").read_text()
COMMANDS = ["celery -A proj worker --loglevel INFO", "celery -A proj delayq carrier"]


def _uv(*args: str, timeout: float = 240) -> None:
    done = subprocess.run([uv.find_uv_bin(), *args], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"uv {' '.join(args)} failed:\n{done.stdout}{done.stderr}"


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    """A new venv holding the wheel built from this checkout, with its ``server`` extra
    (about a minute, more on a cold uv cache)."""
    base = tmp_path_factory.mktemp("fresh")
    _uv("build", "--quiet", "--out-dir", str(base / "dist"), str(ROOT))
    (wheel,) = (base / "dist").glob("celery_delayq-*.whl")
    _uv("venv", "--quiet", "--python", sys.executable, str(base / "venv"))
    python = base / "venv" / "bin" / "python"
    _uv("pip", "install", "--quiet", "--python", str(python), f"{wheel}[server]")
    return base / "venv"


def test_pytest_after_the_celery_command_is_imported_gives_no_warning(fresh_venv, tmp_path):
    """Importing ``celery.bin.celery`` (the ``celery`` command, ``app.worker_main``) loads
    the command plugin, so the installed package is imported before pytest marks it, a
    ``pytest11`` plugin's distribution, for assertion rewriting: ``-W error`` failed on
    PytestAssertRewriteWarning. (An editable install lists no module files to mark.)"""
    python = fresh_venv / "bin" / "python"
    _uv("pip", "install", "--quiet", "--python", str(python), "pytest")
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    out = subprocess.run(
        [str(python), "-c", "import sys, celery.bin.celery, pytest\n"
         "sys.exit(pytest.main(['-p', 'no:cacheprovider', '-W', 'error']))"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_quickstart_runs_from_the_wheel_in_a_fresh_venv(fresh_venv, tmp_path):
    bin_dir = fresh_venv / "bin"
    assert "pip install 'celery-delayq[server]'" not in QUICKSTART  # not on PyPI yet
    assert "python -m celery_delayq.testing.redis_server --port 6379" in QUICKSTART
    assert all(command in QUICKSTART for command in COMMANDS)
    located = subprocess.run(
        [str(bin_dir / "python"), "-c", "import celery_delayq; print(celery_delayq.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True).stdout
    assert Path(located.strip()).is_relative_to(fresh_venv)  # the wheel's copy, not the checkout
    parser = subprocess.run(  # installing changes no redis-py client of the process
        [str(bin_dir / "python"), "-c", "import redis.utils; print(redis.utils.HIREDIS_AVAILABLE)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True).stdout
    assert parser.strip() == "False", "hiredis came with the package: [fast] is opt-in"
    port = free_port()
    env = example_env(f"redis://127.0.0.1:{port}/0")
    env["PATH"] = os.pathsep.join([str(bin_dir), env["PATH"]])
    env.pop("PYTHONPATH", None)
    started: list[subprocess.Popen] = []

    def start(name: str, argv: list[str]) -> None:
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 (closed with the test dir)
        started.append(subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True))

    try:
        (tmp_path / "redis").mkdir()
        start("redis", [str(bin_dir / "python"), "-m", "celery_delayq.testing.redis_server",
                        "--port", str(port), "--dir", str(tmp_path / "redis")])
        _wait_for_redis(port)
        for command in COMMANDS:
            start(command.split()[3], [str(bin_dir / "celery"), *command.split()[1:]])
        outputs = {}
        for name, code in python_examples("quickstart.md"):
            (tmp_path / name).write_text(code)
        for name, _ in python_examples("quickstart.md"):
            done = subprocess.run([str(bin_dir / "python"), name], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"{name} failed:\n{done.stdout}{done.stderr}" + "".join(
                f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))
            outputs[name] = done.stdout
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # with the pool children, redis-server
            process.wait(10)
    assert outputs["delay.py"].splitlines()[-1] == "order 42 closed"


def _wait_for_redis(port: int, timeout: float = 15) -> None:
    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "the quickstart's redis_server never answered"
                time.sleep(0.1)
    finally:
        client.close()
