"""The one-shot management commands stopped by Ctrl-C or by a database that stays locked:
a clear error saying what happened and that running the command again is safe (no
traceback), and a run once the lock is gone does the rest."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone

from celery_delayq.contrib.django.models import DelayedTask as Row
from celery_delayq.contrib.django.models import JournalCursor
from celery_delayq.contrib.django.sync import JournalSync

pytestmark = pytest.mark.django_db(transaction=True)


def _unstored_row(shop_delayq) -> None:
    from shop.tasks import close_unpaid_order

    with transaction.atomic():  # the on-commit write never ran
        close_unpaid_order.apply_delayed(args=(7,), delay=600, job_id="order:7:close")
        transaction.get_connection().run_on_commit = []
    Row.objects.update(store_error="the store is unavailable")


def _journaled(shop_delayq) -> None:
    from shop.tasks import close_unpaid_order

    close_unpaid_order.apply_delayed(args=(7,), delay=600, job_id="order:7:close")


def _old_finished_row(shop_delayq) -> None:
    JournalSync(shop_delayq).run_once()
    JournalCursor.objects.update(caught_up_at=timezone.now())
    Row.objects.create(job_id="old", task="t", state="succeeded",
                       finished_at=timezone.now() - timedelta(days=90))


COMMANDS = [  # (command, what makes it write, what it says once done)
    pytest.param(["delayq_reconcile"], _unstored_row, "pushed 1 delayed tasks",
                 id="reconcile"),
    pytest.param(["delayq_sync", "--once"], _journaled, "applied 1 journal events",
                 id="sync"),
    pytest.param(["delayq_prune"], _old_finished_row, "deleted 1 delayed tasks",
                 id="prune"),
]


@pytest.fixture
def locked():
    """Another process holding the SQLite database's write lock; this connection waits
    for it 0.2 s (the demo's 20 s, shortened)."""
    assert connection.vendor == "sqlite"
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        [waits] = cursor.fetchone()
        cursor.execute("PRAGMA busy_timeout = 200")
    other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    yield other
    other.close()
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {int(waits)}")


@pytest.mark.parametrize(("command", "arrange", "done"), COMMANDS)
def test_a_command_meeting_a_locked_database_says_so_and_a_rerun_does_the_rest(
        shop_delayq, locked, command, arrange, done, capsys):
    locked.execute("ROLLBACK")
    arrange(shop_delayq)
    locked.execute("BEGIN IMMEDIATE")
    with pytest.raises(CommandError, match=r"database.*locked.*run .*again") as raised:
        call_command(*command)
    assert "safe" in str(raised.value)

    locked.execute("ROLLBACK")
    call_command(*command)
    assert done in capsys.readouterr().out


@pytest.mark.parametrize(("command", "arrange", "done"), COMMANDS[1:])
def test_ctrl_c_in_a_command_says_it_was_interrupted_and_a_rerun_does_the_rest(
        shop_delayq, monkeypatch, command, arrange, done, capsys):
    arrange(shop_delayq)
    real_enter, pressed = transaction.Atomic.__enter__, []

    def ctrl_c_at_the_first_write(self):
        if not pressed:
            pressed.append(True)
            raise KeyboardInterrupt
        return real_enter(self)

    monkeypatch.setattr(transaction.Atomic, "__enter__", ctrl_c_at_the_first_write)
    with pytest.raises(CommandError, match=r"interrupted.*again.*safe") as raised:
        call_command(*command)
    assert (pressed, raised.value.returncode) == ([True], 130)

    monkeypatch.undo()
    call_command(*command)
    assert done in capsys.readouterr().out


def test_ctrl_c_in_delayq_reconcile_leaves_the_row_it_was_writing_to_that_write(
        shop_delayq, monkeypatch, capsys):
    """Interrupted during a row's Redis write, reconcile cannot know whether the job got
    there (and was run since): a re-run leaves the row to the journal (``delayq_sync``
    marks it written) or to its claim's expiry, and names it."""
    _unstored_row(shop_delayq)

    def ctrl_c(items, if_exists):
        raise KeyboardInterrupt

    monkeypatch.setattr(shop_delayq, "submit", ctrl_c)
    with pytest.raises(CommandError, match=r"interrupted.*again.*safe") as raised:
        call_command("delayq_reconcile")
    assert raised.value.returncode == 130

    monkeypatch.undo()
    call_command("delayq_reconcile")
    out, err = capsys.readouterr()
    assert "pushed 0 delayed tasks" in out
    assert "order:7:close" in err and "being written" in err
