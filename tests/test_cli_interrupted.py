"""Ctrl-C in the middle of a long CLI command (``cancel --key``, ``replay --all``, ``drop
--all``, ``resume``): the exact count done before it, the rest untouched, exit 130, and a
re-run that does the rest. Run in-process, a real SIGINT sent from inside a store call."""

from __future__ import annotations

import os
import re
import signal
from types import SimpleNamespace
from typing import Any

import pytest
from celery import states as celery_states
from celery.result import AsyncResult
from click.testing import CliRunner, Result

from celery_delayq.cli import delayq as delayq_group
from celery_delayq.cli_group import cli_user
from celery_delayq.store import dead_letters, producing, releasing
from tests.carrier.test_pause import PARKED, hold
from tests.store.test_replay import dead_ids, make_dead


def invoke(proj, *args: str) -> Result:
    """``celery -A tests.proj delayq <args>``, in this process."""
    return CliRunner().invoke(delayq_group, list(args), obj=SimpleNamespace(app=proj.app))


def ctrl_c_in_call(monkeypatch, owner: Any, name: str, at_call: int) -> None:
    """Press Ctrl-C (a real SIGINT) while ``owner.name`` runs its ``at_call``-th call."""
    real, calls = getattr(owner, name), []

    def pressing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == at_call:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, pressing)


def states(proj, results: list) -> list[str]:
    return [AsyncResult(result.id, app=proj.app).state for result in results]


def test_cancel_key_marks_each_chunk_revoked_as_it_cancels_it(proj, delayq, monkeypatch):
    """Stopped after its first chunk, the jobs that chunk cancelled have REVOKED results
    (a re-run finds nothing of them to cancel, so it could not mark them)."""
    monkeypatch.setattr(producing, "CANCEL_KEY_CHUNK", 4)
    results = proj.record.apply_delayed_many([{"args": (i,), "delay": 600, "key": "order:9"}
                                              for i in range(10)])
    real, calls = delayq.store._cancel, []

    def stopped_at_the_second_chunk(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(delayq.store, "_cancel", stopped_at_the_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        delayq.cancel_key("order:9")
    left = {job.job_id for job in delayq.pending(key="order:9")}
    assert len(left) == 6
    assert sorted(states(proj, results)) == [celery_states.PENDING] * 6 + [
        celery_states.REVOKED] * 4
    assert all(state == celery_states.PENDING
               for result, state in zip(results, states(proj, results), strict=True)
               if result.job_id in left)


def test_ctrl_c_in_cancel_key_says_the_exact_count_exits_130_and_a_rerun_does_the_rest(
        proj, delayq, monkeypatch):
    monkeypatch.setattr(producing, "CANCEL_KEY_CHUNK", 4)
    results = proj.record.apply_delayed_many([{"args": (i,), "delay": 600, "key": "order:9"}
                                              for i in range(10)])
    ctrl_c_in_call(monkeypatch, delayq.store, "_cancel", at_call=2)
    done = invoke(proj, "cancel", "--key", "order:9")
    assert done.exit_code == 130, done.output
    assert "interrupted (cancelled 8 before it); running the same command again is safe: " \
        "each job cancelled has its result REVOKED" in " ".join(done.output.split())
    assert len(delayq.pending(key="order:9")) == 2
    assert states(proj, results).count(celery_states.REVOKED) == 8

    monkeypatch.undo()
    done = invoke(proj, "cancel", "--key", "order:9")
    assert (done.exit_code, done.output) == (0, "cancelled 2 jobs of key 'order:9'\n")
    assert set(states(proj, results)) == {celery_states.REVOKED}


def test_cancel_journals_who_ran_it_as_drop_and_pause_do(proj, delayq):
    proj.record.apply_delayed(args=(1,), delay=600, job_id="one", key="order:1")
    proj.record.apply_delayed(args=(2,), delay=600, job_id="two", key="order:2")
    assert invoke(proj, "cancel", "one").exit_code == 0
    assert invoke(proj, "cancel", "--key", "order:2").exit_code == 0
    by = [fields["by"] for shard in delayq.store.keys
          for _, fields in delayq.store.client.xrange(shard.journal)
          if fields["event"] == "cancelled"]
    assert by == [cli_user()] * 2


def test_cancel_help_says_what_key_does_with_and_without_a_job_id(proj):
    text = " ".join(invoke(proj, "cancel", "--help").output.split())
    assert "Without JOB_ID: cancel every pending job of KEY" in text
    assert "With JOB_ID it is not needed" in text


def said_count(output: str, verb: str) -> int:
    """The count an interrupted command said it got to."""
    found = re.search(rf"interrupted \({verb} ([\d,]+) before it\)", output)
    assert found, output
    return int(found[1].replace(",", ""))


@pytest.mark.parametrize(("command", "verb", "call"), [
    (("replay", "--all"), "replayed", "_replay_unless_live"),
    (("drop", "--all", "--yes"), "dropped", "_drop_call"),
])
def test_ctrl_c_in_replay_or_drop_all_says_the_exact_count_and_a_rerun_does_the_rest(
        proj, delayq, monkeypatch, command, verb, call):
    monkeypatch.setattr(dead_letters, "DEAD_CHUNK", 2)
    make_dead(proj, delayq, [f"dead-{n}" for n in range(12)], "unknown queue")
    ctrl_c_in_call(monkeypatch, delayq.store, call, at_call=2)
    done = invoke(proj, *command)
    assert done.exit_code == 130, done.output
    assert said_count(done.output, verb) == 12 - len(dead_ids(delayq)) > 0
    assert "running the same command again is safe" in done.output

    monkeypatch.undo()
    left = len(dead_ids(delayq))
    done = invoke(proj, *command)
    assert (done.exit_code, done.output) == (0, f"{verb} {left} dead jobs\n")
    assert dead_ids(delayq) == set()


def test_ctrl_c_in_resume_says_the_exact_count_and_a_rerun_gives_back_the_rest(
        proj, delayq, monkeypatch):
    monkeypatch.setattr(releasing, "RELEASE_CHUNK", 3)
    delayq.pause(queue=PARKED)
    hold(delayq, [(proj.record.name, PARKED, n) for n in range(10)])
    ctrl_c_in_call(monkeypatch, delayq.store, "_release_round", at_call=2)
    done = invoke(proj, "resume", "--queue", PARKED)
    assert done.exit_code == 130, done.output
    held = len([job for job in delayq.pending(limit=100) if job.paused])
    assert said_count(done.output, "gave back") == 10 - held == 6
    assert "running the same command again is safe" in done.output

    monkeypatch.undo()
    done = invoke(proj, "resume", "--queue", PARKED)
    assert (done.exit_code, done.output) == (
        0, f"queue {PARKED} was not paused any more: gave back 4 held jobs a stopped resume "
           "left\n")


def test_resume_of_what_is_not_paused_says_what_is_and_exits_1(proj, delayq):
    delayq.pause(queue="refunds")
    done = invoke(proj, "resume", "--queue", "refund")
    assert (done.exit_code, done.output) == (
        1, "queue refund was not paused (paused: queue refunds)\n")
    assert delayq.paused() == {"tasks": [], "queues": ["refunds"]}
    delayq.resume(queue="refunds")
    done = invoke(proj, "resume", "--task", "shop.nothing")
    assert (done.exit_code, done.output) == (1, "task shop.nothing was not paused (nothing "
                                                "is paused)\n")


def test_pause_of_a_task_the_app_does_not_register_warns_and_pauses_it(proj, delayq):
    done = invoke(proj, "pause", "--task", "tests.proj.recrod")
    assert done.exit_code == 0
    assert "warning: no task tests.proj.recrod is registered in this app" in done.output
    assert delayq.paused()["tasks"] == ["tests.proj.recrod"]
    assert "warning" not in invoke(proj, "pause", "--task", proj.record.name).output


def test_pause_or_rate_limit_of_a_queue_the_app_does_not_declare_warns_and_holds_it(
        proj, delayq, monkeypatch):
    """A typo (``order`` for ``orders``) would hold nothing while the operator believes the
    queue held; a queue the app declares or routes to is taken without a word."""
    monkeypatch.setitem(proj.app.conf, "task_routes", {"shop.refund": {"queue": "refunds"}})
    done = invoke(proj, "pause", "--queue", "refund")
    assert done.exit_code == 0
    assert "warning: no queue refund is declared or routed to in this app" in done.output
    assert delayq.paused()["queues"] == ["refund"]
    done = invoke(proj, "rate-limit", "refund", "10/s")
    assert done.exit_code == 0 and "rate-limit refund off" in done.output
    assert delayq.rate_limits() == {"refund": "10/s"}
    for known in ("refunds", proj.app.conf.task_default_queue):
        assert "warning" not in invoke(proj, "pause", "--queue", known).output
        assert "warning" not in invoke(proj, "rate-limit", known, "10/s").output
    for queue in ("refund", "refunds", proj.app.conf.task_default_queue):
        delayq.resume(queue=queue)
        delayq.set_rate_limit(queue, None)
