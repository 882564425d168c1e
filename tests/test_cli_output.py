"""What the CLI says when things go wrong around a command: progress that cannot be
written, an error or a Ctrl-C part way, a store that is not configured, advice that must
name what the operator can do. Run in-process against a real store."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from celery_delayq import ConfigurationError, progress
from celery_delayq.cli_group import click as cli_click
from celery_delayq.errors import StoreUnavailable
from celery_delayq.store import producing
from tests.store.test_replay import make_dead
from tests.test_cli_interrupted import ctrl_c_in_call, invoke


def jobs_of_key(proj, key: str, n: int) -> None:
    proj.record.apply_delayed_many([{"args": (i,), "delay": 600, "key": key}
                                    for i in range(n)])


def test_a_progress_line_that_cannot_be_written_stops_the_progress_not_the_cancel(
        proj, delayq, monkeypatch):
    """stderr gone (``2>&1 | head``, ``2>/dev/full``): every job is still cancelled, and
    progress is not tried again after the first failed line."""
    monkeypatch.setattr(producing, "CANCEL_KEY_CHUNK", 4)
    jobs_of_key(proj, "order:9", 10)
    clock = itertools.count(0, 2)  # every count is a second past the last: each is said
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    tried, echo = [], cli_click.echo

    def broken_stderr(message: Any = None, err: bool = False, **kwargs: Any) -> None:
        if err:
            tried.append(message)
            raise BrokenPipeError(32, "Broken pipe")
        echo(message, err=err, **kwargs)

    monkeypatch.setattr(cli_click, "echo", broken_stderr)
    done = invoke(proj, "cancel", "--key", "order:9")
    assert (done.exit_code, done.output) == (0, "cancelled 10 jobs of key 'order:9'\n")
    assert delayq.pending(key="order:9") == [] and tried == ["cancelled 4 so far"]


def test_an_error_part_way_through_cancel_key_says_the_exact_count_and_that_a_rerun_is_safe(
        proj, delayq, monkeypatch):
    monkeypatch.setattr(producing, "CANCEL_KEY_CHUNK", 4)
    jobs_of_key(proj, "order:9", 10)
    real, calls = delayq.store._cancel, []

    def redis_gone_at_the_third_chunk(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise StoreUnavailable("cannot reach Redis")
        return real(*args)

    monkeypatch.setattr(delayq.store, "_cancel", redis_gone_at_the_third_chunk)
    done = invoke(proj, "cancel", "--key", "order:9")
    assert done.exit_code == 1, done.output
    assert "error: cannot reach Redis (cancelled 8 before it); running the same command " \
        "again is safe" in " ".join(done.output.split())
    assert len(delayq.pending(key="order:9")) == 2


@pytest.mark.parametrize("command", [("replay", "x"), ("replay", "--all"), ("drop", "x"),
                                     ("drop", "--all", "--yes")])
def test_replay_and_drop_of_an_unconfigured_store_say_the_error_without_a_traceback(
        proj, monkeypatch, command):
    from celery_delayq import cli_dead

    class Unconfigured:
        @property
        def store(self) -> None:
            raise ConfigurationError("no delayq_redis_url")

    monkeypatch.setattr(cli_dead, "delayq_of", lambda ctx: Unconfigured())
    done = invoke(proj, *command)
    assert (done.exit_code, done.output) == (1, "error: no delayq_redis_url\n")


@pytest.mark.parametrize(("command", "owner", "call", "rerun"), [
    (("check", "--repair"), "store", "unavailable", "what it repaired is repaired"),
    (("export", "--format", "jsonl", "--to"), "store", "journal_end",
     "what it wrote is kept"),
])
def test_ctrl_c_in_check_or_export_says_what_is_kept_and_exits_130(
        proj, delayq, monkeypatch, tmp_path, command, owner, call, rerun):
    jobs_of_key(proj, "order:9", 10)
    ctrl_c_in_call(monkeypatch, delayq.store, call, at_call=2)
    args = (*command, str(tmp_path)) if command[0] == "export" else command
    done = invoke(proj, *args)
    assert done.exit_code == 130, done.output
    text = " ".join(done.output.split())
    assert "interrupted" in text and "running the same command again is safe: " + rerun in text


def test_replay_of_an_id_a_live_job_has_says_what_the_operator_can_do(proj, delayq):
    make_dead(proj, delayq, ["live-1"], "unknown queue")
    proj.record.apply_delayed(args=(1,), delay=600, job_id="live-1")
    done = invoke(proj, "replay", "live-1")
    assert done.exit_code == 1
    assert "if_exists" not in done.output
    assert "cancel it first (`delayq cancel live-1`) or wait until it has run" in " ".join(
        done.output.split())


def test_ls_marks_the_jobs_a_rate_limit_holds(proj, delayq):
    delayq.set_rate_limit("slow.queue", "1/h")
    try:
        for n in range(3):
            delayq.schedule(proj.record.name, (n,), delay=0, queue="slow.queue", key="k")
        delayq.store.claim(list(delayq.store.keys), 1000, 60_000)  # one claimed, two held
        lines = invoke(proj, "ls").output.splitlines()
        assert sum(line.endswith("  (rate limit)") for line in lines) == 2, lines
    finally:
        delayq.set_rate_limit("slow.queue", None)


def test_ls_refuses_an_empty_key(proj):
    done = invoke(proj, "ls", "--key", "")
    assert done.exit_code == 2 and "--key is empty" in done.output


def test_show_of_an_unknown_job_says_so_on_stderr_and_exits_1(proj):
    done = invoke(proj, "show", "nope")
    assert (done.exit_code, done.stdout) == (1, "")
    assert "no job 'nope'" in done.stderr


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_health_refuses_a_threshold_that_is_no_finite_number(proj, value):
    done = invoke(proj, "health", "--max-overdue-age", value)
    assert done.exit_code == 2 and "is not a finite number" in done.output
