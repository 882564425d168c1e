"""The documentation: the site builds with no warnings, the configuration page is complete,
every Python example of the quickstart and the migration guide runs against a real Redis
(the quickstart's with a real worker and carrier, started with the commands it shows), the
testing guide's example passes under the plugin, and every other example is valid Python."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import textwrap
from html import unescape
from pathlib import Path

import pytest
import redis

from celery_delayq.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _load_build():
    spec = importlib.util.spec_from_file_location("docs_build", DOCS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build()


def test_site_builds_with_no_warnings(tmp_path):
    missing = [m for m in ("mkdocs", "material") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install -e '.[docs]'")
    assert build.build(tmp_path) == 0, "mkdocs build --strict failed (see the log above)"
    site = tmp_path / "site"
    pages = {p.name for p in site.glob("*.html")}
    expected = {f"{p.stem}.html" for p in DOCS.glob("*.md")} | {"configuration.html"}
    assert expected <= pages
    index = (site / "index.html").read_text()
    assert "fonts.googleapis.com" not in index  # offline: no web fonts
    assert "delayq_countdown_threshold" in (site / "configuration.html").read_text()


def _rendered_rows(page: str) -> dict[str, list]:
    """The configuration page as the site shows it: each table row's cells as plain text
    (tags dropped), by the row's first name; a cell with emphasis in it keeps ``<em>``."""
    markdown = pytest.importorskip("markdown")
    html = markdown.markdown(page, extensions=["tables", "md_in_html"])
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", html, re.DOTALL):
        cells = [c.strip() for c in re.findall(r"<td>(.*?)</td>", row, re.DOTALL)]
        texts = [c if re.search(r"<(em|strong)>", c)
                 else unescape(re.sub(r"<[^>]+>", " ", c)).split() for c in cells]
        if cells:
            rows[texts[0][0] if isinstance(texts[0], list) else cells[0]] = texts
    return rows


def test_configuration_page_lists_every_setting_with_its_default():
    page = build.configuration_page()
    rows = _rendered_rows(page[:page.index("## Outside the Celery app's settings")])
    assert set(rows) == {f"delayq_{s.name}" for s in SETTINGS}
    for setting in SETTINGS:
        names, default, _type, meaning = rows[f"delayq_{setting.name}"]
        assert names == [f"delayq_{setting.name}", f"CELERY_DELAYQ_{setting.name.upper()}"]
        assert " ".join(default) == build.format_default(setting)
        assert meaning == setting.doc.split(), f"{setting.name}: rendered otherwise than written"
    assert rows["delayq_shards"][:3] == [["delayq_shards", "CELERY_DELAYQ_SHARDS"], ["8"],
                                         ["int"]]
    assert rows["delayq_http_retry_schedule"][1] == ["10,", "60,", "300,", "1800,", "7200"]
    assert rows["delayq_redis_url"][1] == ["none"]
    allowed = rows["delayq_http_allowed_hosts"][3]  # '*.example.com' ... '*' was in italics
    assert "'*.example.com'," in allowed and "'*'" in allowed


def _settings_read_outside_conf() -> dict[str, str]:
    """Each setting the code reads besides ``SETTINGS``, with its default as written there:
    Django settings read with ``getattr(settings, NAME, DEFAULT)``, the pytest plugin's ini
    options and its environment variable."""
    package = ROOT / "celery_delayq"
    found = {}
    for path in package.rglob("*.py"):
        text = path.read_text()
        for name, default in re.findall(r'getattr\(settings, "(\w+)", ([^)]+)\)', text):
            found[name] = default
        for name in re.findall(r'addini\("(\w+)"', text):
            found[name] = ""
        for name in re.findall(r'^ENV_\w+ = "(\w+)"', text, re.MULTILINE):
            found[name] = ""
    return found


def test_configuration_page_lists_the_settings_read_outside_settings_too():
    read = _settings_read_outside_conf()
    assert {"DELAYQ_CELERY_APP", "DELAYQ_TRANSACTIONAL", "delayq_app", "delayq_redis_url",
            "DELAYQ_PYTEST_REDIS_URL"} <= set(read)
    page = build.configuration_page()
    section = page[page.index("## Outside the Celery app's settings"):]
    rows = _rendered_rows(section)
    assert set(rows) == set(read)
    for name, default in read.items():
        if default not in ("", "None"):
            assert rows[name][2] == [default], name


def python_examples(page: str) -> list[tuple[str, str]]:
    """``(file name, code)`` of every python block; each names its file in its first line."""
    text = (DOCS / page).read_text()
    examples = []
    for code in re.findall(r"^```python\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        first = code.splitlines()[0]
        match = re.match(r"# (\w+\.py):", first)
        assert match, f"{page}: a python example must start with '# name.py: ...': {first!r}"
        examples.append((match.group(1), code))
    return examples


def example_env(redis_url: str) -> dict[str, str]:
    """The environment of a reader running the examples: REDIS_URL, no Django settings
    (pytest-django sets DJANGO_SETTINGS_MODULE, and a worker would then set up Django)."""
    env = dict(os.environ, REDIS_URL=redis_url)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


@pytest.fixture
def redis_db(redis_server):
    """A database of the session's Redis that only this test uses, emptied around it."""
    url = f"{redis_server.url}/7"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


def _run_examples(page: str, directory: Path, env: dict[str, str]) -> dict[str, str]:
    examples = python_examples(page)
    assert examples, f"{page} has no python examples"
    for name, code in examples:
        (directory / name).write_text(code)
    outputs = {}
    for name, _code in examples:
        done = subprocess.run([sys.executable, name], cwd=directory, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{page}: {name} failed:\n{done.stdout}{done.stderr}"
        outputs[name] = done.stdout
    return outputs


def test_quickstart_examples_schedule_run_and_cancel(redis_db, tmp_path):
    page = (DOCS / "quickstart.md").read_text()
    commands = ["celery -A proj worker --loglevel INFO", "celery -A proj delayq carrier"]
    for command in commands:
        assert command in page
    env = example_env(redis_db)
    started = []
    try:
        for command in commands:
            argv = [sys.executable, "-m", *command.split()]
            log = open(tmp_path / f"{command.split()[3]}.log", "w")  # noqa: SIM115
            started.append((subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log,
                                              stderr=subprocess.STDOUT,
                                              start_new_session=True), log))
        try:
            outputs = _run_examples("quickstart.md", tmp_path, env)
        except AssertionError as exc:
            logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}"
                           for p in sorted(tmp_path.glob("*.log")))
            raise AssertionError(f"{exc}\nworker and carrier logs:{logs}") from None
    finally:
        for process, log in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the worker and its pool children
            process.wait(10)
            log.close()
    assert outputs["delay.py"].splitlines()[-1] == "order 42 closed"


def test_migrating_examples_route_delayed_calls_through_the_store(redis_db, tmp_path):
    _run_examples("migrating.md", tmp_path, example_env(redis_db))
    client = redis.Redis.from_url(redis_db)
    # The call under the threshold went to the broker as a native ETA message.
    assert client.llen("celery") == 1
    client.close()


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^\s*```{language}\n(.*?)^\s*```", text, re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("page", [*sorted(p.name for p in DOCS.glob("*.md")), "README.md"])
def test_every_python_example_is_valid_python(page):
    path = ROOT / page if page == "README.md" else DOCS / page
    for code in _blocks(path.read_text(), "python"):
        compile(textwrap.dedent(code), f"{page} example", "exec")


def test_testing_guide_example_passes_under_the_plugin(redis_db, tmp_path):
    text = (DOCS / "testing.md").read_text()
    shop, tests = _blocks(text, "python")[:2]
    (tmp_path / "shop.py").write_text(shop)
    (tmp_path / "test_orders.py").write_text(tests)
    (tmp_path / "pytest.ini").write_text(_blocks(text, "ini")[0])
    env = dict(example_env(redis_db), DELAYQ_PYTEST_REDIS_URL=redis_db, PYTHONPATH=".")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:django"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_every_test_the_docs_name_exists():
    """``tests/...py`` paths, ``tests/...py::test_name`` and bare `` `test_name` ``
    references (`` `test_name...` ``: one that starts so) in README.md and docs/."""
    tests = {path: path.read_text() for path in (ROOT / "tests").rglob("*.py")}
    defined = {name for text in tests.values() for name in re.findall(r"def (test_\w+)\(", text)}
    missing = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = page.read_text()
        for match in re.finditer(r"tests/[\w/]+\.py(?:::(\w+))?", text):
            path = ROOT / match.group(0).split("::")[0]
            if path not in tests or (match.group(1) and match.group(1) not in defined):
                missing.append(f"{page.name}: {match.group(0)}")
        for name in re.findall(r"`(test_\w+?)(?:\[[^\]`]*\])?(?:\.\.\.)?`", text):
            if not any(test.startswith(name) for test in defined):
                missing.append(f"{page.name}: {name}")
    assert missing == []
