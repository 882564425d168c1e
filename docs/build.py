"""Build the documentation site: ``python docs/build.py`` (``make docs``).

The pages in ``docs/`` are copied into ``<out>/src`` together with ``configuration.md``,
which is generated from :data:`celery_delayq.settings.SETTINGS`; then ``mkdocs build --strict``
writes the site to ``<out>/site`` (default ``docs/_build/site``). Any warning fails the build.
``--serve`` runs ``mkdocs serve`` on the same sources instead (the configuration page is
generated once, at start).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the package of this checkout, when run as a script

from celery_delayq.settings import SETTINGS, Setting  # noqa: E402

DEFAULT_OUT = DOCS / "_build"

INTRO = """\
# Configuration reference

Generated from `SETTINGS` in `celery_delayq/conf.py` when the site is built: this table is
every setting of the Celery app there is. The few read elsewhere (the Django app's, the
pytest plugin's) follow it, [outside the Celery app's settings](#outside-the-celery-apps-settings).

Set them on the Celery app (`app.conf.delayq_shards = 16`). In a Django project whose Celery
app reads settings with `namespace="CELERY"`, write them in `settings.py` in upper case with
the `CELERY_` prefix (`CELERY_DELAYQ_SHARDS = 16`). Values are read once, when the app's
`DelayQ` first needs them (`DelayQ.of(app).config`), and checked then: a bad value raises
`ConfigurationError` with the setting's name.

"""


def format_default(setting: Setting) -> str:
    """The default as the reference page shows it."""
    value = setting.default
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ", ".join(_number(v) for v in value) if value else "empty"
    if isinstance(value, float):
        return _number(value)
    return str(value)


def _number(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _type_name(setting: Setting) -> str:
    names = {"SecondsList": "list of seconds", "HostList": "list of hosts"}
    return names.get(setting.type.__name__, setting.type.__name__)


#: Settings read outside ``SETTINGS``: name, where it is set, default, meaning (Markdown).
#: tests/docs/test_docs.py checks this list against the names the code reads.
OUTSIDE = [
    ("DELAYQ_CELERY_APP", "Django settings", "Celery's current app",
     "The Celery app of the Django app (`delayq_sync`, `delayq_reconcile`, the admin's "
     "actions, its system checks, transactional scheduling), as `\"module:attribute\"` "
     "(`\"module\"` alone means its `app`). Celery's current app is the project's when "
     "`proj/__init__.py` imports it, as Celery's Django guide shows."),
    ("DELAYQ_TRANSACTIONAL", "Django settings", "`True`",
     "`apply_delayed` inside `transaction.atomic()` writes its `DelayedTask` row in the "
     "transaction and Redis on commit (see the Django guide); `False` writes Redis at once. "
     "Read at each call."),
    ("DELAYQ_KEY_MODELS", "Django settings", "none",
     "Business key prefix -> model label, e.g. `{\"order\": \"shop.Order\"}`: the "
     "delayed-task admin links the key `order:42` to the admin page of order 42 (for staff "
     "who may view it). Keys of other prefixes stay plain text."),
    ("delayq_app", "pytest ini option", "none",
     "The Celery app of the `delayq` fixture, as `\"module:attribute\"`; or override the "
     "`delayq_app` fixture. With neither, a test using `delayq` stops with a usage error."),
    ("delayq_redis_url", "pytest ini option", "none: a `redis-server` for the session",
     "The Redis of the `delayq` fixture (not the Celery setting of the same name); each test "
     "gets a key prefix of its own there, deleted afterwards."),
    ("DELAYQ_PYTEST_REDIS_URL", "environment variable", "none",
     "As the ini option `delayq_redis_url`, which it overrides."),
]


def markdown_text(text: str) -> str:
    """``text`` for a Markdown table cell, shown as written: ``*`` and ``_`` are not
    emphasis (``'*.example.com'`` turned the rest of its cell italic), ``|`` ends no cell."""
    for char in "\\`*_[]|":
        text = text.replace(char, "\\" + char)
    return text.replace("<", "&lt;")


def configuration_page(settings: Iterable[Setting] = SETTINGS) -> str:
    """Markdown of the configuration reference, one table row per setting, then the
    settings read outside ``SETTINGS``. A setting's two names share its first cell, which
    leaves the meaning room while the names stay whole."""
    rows = ["| setting<br>Django setting | default | type | meaning |", "|---|---|---|---|"]
    for s in settings:
        rows.append(f"| `delayq_{s.name}`<br>`CELERY_DELAYQ_{s.name.upper()}` | "
                    f"`{format_default(s)}` | {_type_name(s)} | {markdown_text(s.doc)} |")
    lists = ("Lists (`list of seconds`, `list of hosts`) also take a comma-separated string, "
             "as an environment variable would give them.")
    outside = ["## Outside the Celery app's settings", "",
               "| setting | where | default | meaning |", "|---|---|---|---|"]
    outside += [f"| `{name}` | {where} | {default} | {meaning} |"
                for name, where, default, meaning in OUTSIDE]
    return (INTRO + _names_kept_whole(rows) + "\n" + lists + "\n\n" + outside[0] + "\n\n"
            + _names_kept_whole(outside[2:]))


def _names_kept_whole(table: list[str]) -> str:
    """The table in a ``div.names`` (md_in_html): ``extra.css`` keeps its first column's
    names whole, where the theme would break them anywhere."""
    return '<div class="names" markdown>\n\n' + "\n".join(table) + "\n\n</div>\n"


def prepare(out: Path) -> Path:
    """Fill ``out/src`` with the pages and write ``out/mkdocs.yml``; returns the config path."""
    src = out / "src"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    for page in [*DOCS.glob("*.md"), *DOCS.glob("*.css")]:
        shutil.copy2(page, src / page.name)
    if (DOCS / "img").is_dir():
        shutil.copytree(DOCS / "img", src / "img")
    (src / "configuration.md").write_text(configuration_page())
    config = out / "mkdocs.yml"
    config.write_text(f"INHERIT: {DOCS / 'mkdocs.yml'}\ndocs_dir: src\nsite_dir: site\n")
    return config


def build(out: Path = DEFAULT_OUT, serve: bool = False) -> int:
    config = prepare(out.resolve())
    command = ["serve"] if serve else ["build", "--strict", "--clean"]
    # The theme's end-of-life banner is not a warning about these docs.
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.call([sys.executable, "-m", "mkdocs", *command, "-f", str(config)],
                           env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="build directory (default: docs/_build)")
    parser.add_argument("--serve", action="store_true", help="mkdocs serve instead of build")
    opts = parser.parse_args()
    sys.exit(build(opts.out, opts.serve))


if __name__ == "__main__":
    main()
