"""``celery -A proj delayq ...`` against a real store, as a user runs it."""

from __future__ import annotations

import json

from tests.conftest import finish


def run(spawn, *args: str) -> tuple[int, str]:
    process = spawn("delayq", *args)
    output = finish(process)
    return process.returncode, output


def test_ls_show_and_cancel_by_id(proj, spawn, redis_client):
    proj.record.apply_delayed(args=("x",), delay=600, job_id="order:1:close", key="order:1")
    code, output = run(spawn, "ls")
    assert code == 0 and "order:1:close" in output and "key=order:1" in output

    code, output = run(spawn, "show", "order:1:close")
    assert code == 0
    assert json.loads(output)["task"] == proj.record.name

    code, output = run(spawn, "cancel", "order:1:close")
    assert (code, output.strip()) == (0, "order:1:close: cancelled")
    code, output = run(spawn, "cancel", "order:1:close")
    assert (code, output.strip()) == (1, "order:1:close: unknown")


def test_cancel_by_key_and_stats(proj, spawn, redis_client):
    for name in ("close", "remind"):
        proj.record.apply_delayed(args=(name,), delay=600, key="order:2",
                                  job_id=f"order:2:{name}")
    code, output = run(spawn, "stats", "--json")
    assert code == 0 and sum(row["pending"] for row in json.loads(output)) == 2
    code, output = run(spawn, "cancel", "--key", "order:2")
    assert (code, output.strip()) == (0, "cancelled 2 jobs of key 'order:2'")


def test_show_of_an_unknown_job_exits_nonzero(spawn, redis_client):
    code, output = run(spawn, "show", "nope")
    assert code == 1 and "no job 'nope'" in output


def test_ls_dead_on_an_empty_store_lists_nothing(spawn, redis_client):
    assert run(spawn, "ls", "--dead") == (0, "")
