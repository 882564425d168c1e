"""Celery's own integration suite, as it is and with celery-delayq, side by side.

``make test-celery-suite`` (opt-in, about 40 minutes for the default files) takes the
``t/`` folder from the sdist of the installed Celery (``pip download``), then runs the chosen
files twice at once, each arm on a Redis of its own (broker and backend):

* **native**: the suite as it is, the delayq pytest plugin disabled;
* **delayq**: ``task_cls = DelayedTask``, so every countdown, eta and retry of the suite
  goes through the store (``delayq_countdown_threshold`` is 0 by default), with a carrier
  beside the suite's session worker (an overlay appended to the suite's ``conftest.py``).

It prints each arm's counts and every test whose outcome differs, and exits 1 when a test
that passes natively fails with delayq for a reason not listed in ``EXPECTED``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import celery

from celery_delayq.testing.redis_server import RedisServer

FILES = ("test_tasks.py", "test_canvas.py", "test_inspect.py")
#: Tests whose outcome differs by design, and why.
EXPECTED = {
    "t.integration.test_inspect.test_Inspect::test_scheduled":
        "`celery inspect scheduled` lists the ETA tasks held in workers' memory; a delayed "
        "call is in the store instead (`celery delayq ls`, docs/migrating.md)",
}

OVERLAY = '''

# ---- celery-delayq (tests/compat/celery_suite.py): every countdown, eta and retry through
# the store, and a carrier beside the session worker.
import json
import threading as _threading

from celery_delayq import DelayedTask as _DelayedTask


@pytest.fixture(scope="session")
def celery_parameters():
    return {"task_cls": _DelayedTask}


@pytest.fixture(scope="session", autouse=True)
def delayq_carrier(celery_session_app):
    from celery_delayq.carrier import Carrier

    carrier = Carrier(celery_session_app, idle_timeout=0.2)
    thread = _threading.Thread(target=carrier.run, daemon=True)
    thread.start()
    yield carrier
    carrier.stop()
    thread.join(10)
    with open("carrier.json", "w") as out:  # what went through the store
        json.dump(vars(carrier.stats), out)
'''


def suite(into: Path) -> Path:
    """The ``t/`` folder of the installed Celery's sdist, extracted under ``into``."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--no-binary", ":all:", "--dest", str(into),
                    f"celery=={celery.__version__}"], check=True)
    (sdist,) = into.glob("celery-*.tar.gz")
    root = f"celery-{celery.__version__}/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(root + "t/")]
        for member in members:
            member.name = member.name[len(root):]
        tar.extractall(into / "suite", members=members, filter="data")
    return into / "suite"


def arm(source: Path, work: Path, files: list[str], *, delayq: bool) -> dict[str, str]:
    """Run the files in a copy of ``source`` on a Redis of its own: outcome per test id."""
    subprocess.run(["cp", "-r", str(source), str(work)], check=True)
    if delayq:
        with open(work / "t" / "integration" / "conftest.py", "a") as conftest:
            conftest.write(OVERLAY)
    (work / "pytest.ini").write_text("[pytest]\npython_classes = test_*\nxfail_strict = true\n"
                                     "markers =\n    flaky\n    timeout\n    amqp\n")
    report = work / "report.xml"
    with RedisServer() as server:
        env = dict(os.environ, TEST_BROKER=f"{server.url}/0", TEST_BACKEND=f"{server.url}/1",
                   REDIS_HOST="127.0.0.1", REDIS_PORT=str(server.port))
        plugins = [] if delayq else ["-p", "no:celery_delayq"]
        with open(work / "output.txt", "w") as output:
            subprocess.run([sys.executable, "-m", "pytest", "-p", "celery.contrib.pytest",
                            "-p", "no:cacheprovider", *plugins, "-q", f"--junitxml={report}",
                            *(f"t/integration/{name}" for name in files)],
                           cwd=work, env=env, stdout=output, stderr=subprocess.STDOUT)
    carried = work / "carrier.json"
    if carried.exists():
        print(f"delayq's carrier: {json.loads(carried.read_text())}", flush=True)
    return outcomes(report)


def outcomes(report: Path) -> dict[str, str]:
    """passed / failed / skipped per ``module::class::test`` of a JUnit XML report."""
    found = {}
    for case in ET.parse(report).iter("testcase"):
        module, _, cls = case.get("classname", "").rpartition(".")
        name = f"{module}.{cls}::{case.get('name')}" if module else f"{cls}::{case.get('name')}"
        kinds = {child.tag for child in case}
        found[name] = ("failed" if kinds & {"failure", "error"} else
                       "skipped" if "skipped" in kinds else "passed")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat.celery_suite",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", default=list(FILES),
                        help=f"files of t/integration (default: {' '.join(FILES)})")
    files = parser.parse_args(argv).files
    with tempfile.TemporaryDirectory(prefix="celery-suite-") as tmp:
        source = suite(Path(tmp))
        print(f"Celery {celery.__version__}'s t/integration: {', '.join(files)}; both arms "
              f"at once (output in {tmp}/<arm>/output.txt while they run)", flush=True)
        results: dict[str, dict[str, str]] = {}

        def run(name: str) -> None:
            results[name] = arm(source, Path(tmp) / name, files, delayq=name == "delayq")

        threads = [threading.Thread(target=run, args=(name,)) for name in ("native", "delayq")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    native, delayq = results["native"], results["delayq"]
    for name, found in results.items():
        counts = {kind: list(found.values()).count(kind) for kind in ("passed", "failed",
                                                                       "skipped")}
        print(f"{name:>7}: " + ", ".join(f"{n} {kind}" for kind, n in counts.items()))
    both = sorted(t for t in native if native[t] == delayq.get(t) == "failed")
    if both:
        print(f"failing in both arms (not delayq's): {', '.join(both)}")
    unexplained = 0
    for test in sorted(set(native) | set(delayq)):
        before, after = native.get(test, "absent"), delayq.get(test, "absent")
        if before != after:
            why = EXPECTED.get(test)
            unexplained += why is None and before == "passed"
            print(f"{test}: {before} natively, {after} with delayq"
                  + (f" (expected: {why})" if why else ""))
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
