"""``celery -A proj delayq ...`` against a real store, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from tests.conftest import finish

#: What must never reach an operator's terminal raw: ESC (CSI, OSC), BEL, CR, LF inside a
#: line, the C1 controls NEL and CSI, the line separator, a bidi override.
RAW = ("\x1b", "\x07", "\r", "\x85", "\x9b", "\u2028", "\u202e")


def run(spawn, *args: str) -> tuple[int, str]:
    process = spawn("delayq", *args)
    output = finish(process)
    return process.returncode, output


def test_ls_of_a_task_the_app_does_not_register_says_so(proj, spawn, redis_client):
    """A typo (``tests.proj.recrod``) lists nothing: the operator hears why."""
    proj.record.apply_delayed(args=("x",), delay=600)
    code, output = run(spawn, "ls", "--task", "tests.proj.recrod")
    assert code == 0 and "no pending jobs" in output
    assert "no task tests.proj.recrod is registered in this app" in output
    code, output = run(spawn, "ls", "--task", proj.record.name)
    assert code == 0 and "registered" not in output


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


def test_ls_dead_on_an_empty_store_says_so(spawn, redis_client):
    assert run(spawn, "ls", "--dead") == (0, "no dead letters\n")


def test_ls_on_an_empty_store_says_so(spawn, redis_client):
    assert run(spawn, "ls") == (0, "no pending jobs\n")


def test_ls_finds_jobs_by_an_argument_value(proj, spawn, redis_client):
    proj.record.apply_delayed(args=(42,), delay=600, job_id="order:42:close")
    proj.record.apply_delayed(args=("42",), delay=600, job_id="text-42")
    proj.record.apply_delayed(args=("order-7",), delay=600, job_id="order-7")
    code, output = run(spawn, "ls", "--args-contains", "42")
    assert code == 0 and "order:42:close" in output and "text-42" not in output
    code, output = run(spawn, "ls", "--args-contains", '"42"')
    assert code == 0 and "text-42" in output and "order:42:close" not in output
    code, output = run(spawn, "ls", "--args-contains", "order-7")  # not JSON: the text
    assert code == 0 and "order-7" in output


def test_reschedule_and_run_now_move_a_pending_job(proj, delayq, spawn, redis_client):
    proj.record.apply_delayed(args=("x",), delay=600, job_id="order:1:close", key="order:1")
    code, output = run(spawn, "reschedule", "order:1:close", "--delay", "7200")
    assert code == 0 and output.startswith("order:1:close: due 20")
    left = delayq.get("order:1:close").due - datetime.now(timezone.utc)
    assert 7100 < left.total_seconds() <= 7200

    eta = (datetime.now(timezone.utc) + timedelta(days=100)).replace(microsecond=0)
    code, output = run(spawn, "reschedule", "order:1:close", "--eta", eta.isoformat())
    assert (code, output) == (0, f"order:1:close: due {eta.isoformat(timespec='milliseconds')}\n")
    later = eta + timedelta(days=1)  # "Z" for UTC, which Python 3.10's fromisoformat refuses
    code, output = run(spawn, "reschedule", "order:1:close", "--eta",
                       later.strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert (code, delayq.get("order:1:close").due) == (0, later)

    code, output = run(spawn, "run-now", "order:1:close", "--key", "order:1")
    assert (code, output) == (0, "order:1:close: due now\n")
    assert delayq.get("order:1:close").due <= datetime.now(timezone.utc)


def test_reschedule_refuses_bad_input_and_unknown_jobs(spawn, redis_client):
    code, output = run(spawn, "reschedule", "nope", "--delay", "60")
    assert (code, output) == (1, "nope: not pending (promoted, cancelled or unknown)\n")
    code, output = run(spawn, "run-now", "nope")
    assert (code, output) == (1, "nope: not pending (promoted, cancelled or unknown)\n")
    code, output = run(spawn, "reschedule", "nope")
    assert code == 2 and "give --delay SECONDS or --eta ISO-8601" in output
    code, output = run(spawn, "reschedule", "nope", "--eta", "2030-01-01 08:00")
    assert code == 2 and "--eta '2030-01-01 08:00' has no offset: add one, e.g. " \
        "2030-01-01T08:00:00+00:00 (UTC)" in output


def test_carrier_help_shows_each_option_default(spawn):
    code, output = run(spawn, "carrier", "--help")
    assert code == 0
    for default in ("delayq_claim_batch (built in: 500)", "delayq_lease_seconds (built in: 30)",
                    "delayq_shard_lease_seconds (built in: 10)",
                    "delayq_idle_timeout (built in: 5)",
                    "delayq_direct_promotion (built in: False)"):
        assert default in " ".join(output.split()), default


def test_a_store_url_naming_a_database_the_server_lacks_is_a_clear_error(
        spawn, redis_server, monkeypatch):
    monkeypatch.setenv("DELAYQ_TEST_STORE_URL", f"{redis_server.url}/99")
    code, output = run(spawn, "stats")
    assert code == 1 and "Traceback" not in output
    assert "/99 has no such database" in output and "delayq_redis_url" in output


def test_without_an_app_the_cli_says_how_to_name_one(tmp_path):
    done = subprocess.run([sys.executable, "-m", "celery", "delayq", "stats"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("CELERY")})
    assert done.returncode == 1 and "celery -A proj delayq" in done.stderr


def test_pause_paused_health_stats_ls_and_resume_of_a_task(proj, delayq, spawn, redis_client):
    code, output = run(spawn, "pause", "--task", proj.record.name)
    assert code == 0 and f"paused task {proj.record.name}" in output
    assert run(spawn, "paused") == (0, f"task {proj.record.name}\n")
    proj.record.apply_delayed(args=("x",), eta=datetime(2026, 1, 1, tzinfo=timezone.utc),
                              job_id="held")
    delayq.store.claim(list(delayq.store.keys), 10, 60_000)  # a carrier's round holds it

    code, output = run(spawn, "health")
    assert code == 0 and "ok: 0 overdue jobs" in output
    assert "held, not counted as overdue: 1 held by a pause" in output
    code, output = run(spawn, "stats")
    assert "total pending: 1 (1 held by a pause)" in output
    code, output = run(spawn, "ls")
    assert "held" in output and output.rstrip().endswith("(paused)")

    code, output = run(spawn, "resume", "--task", proj.record.name)
    assert (code, output.strip()) == (0, f"resumed task {proj.record.name}: 1 held job due "
                                         "again")
    assert run(spawn, "paused") == (0, "nothing is paused\n")
    entries = [fields for shard in delayq.store.keys
               for _, fields in delayq.store.client.xrange(shard.journal)
               if fields["event"] in ("paused", "resumed")]
    assert [e["by"] for e in entries] == [e["by"] for e in entries[:1]] * 2
    assert entries[0]["by"].startswith("cli")


def test_pause_or_resume_without_or_with_both_options_is_a_usage_error_naming_them(
        spawn, redis_client):
    for command in ("pause", "resume"):
        for args in ((), ("--task", "t", "--queue", "q")):
            code, output = run(spawn, command, *args)
            assert code == 2 and "give exactly one of --task" in output, output


@pytest.mark.parametrize("option", ["--task", "--queue"])
@pytest.mark.parametrize("name, says", [("", "needs a non-empty name"),
                                         ("a\tb", "holds U+0009")])
def test_pause_or_resume_of_an_empty_or_unprintable_name_names_the_option(
        spawn, redis_client, option, name, says):
    for command in ("pause", "resume"):
        code, output = run(spawn, command, option, name)
        assert code == 2 and f"{option} {says}" in output.replace(f" {name!r}", ""), output
    assert not redis_client.keys("delayq:*:paused")


def test_rate_limit_sets_lists_and_removes_a_queue_limit(proj, delayq, spawn, redis_client):
    assert run(spawn, "rate-limit") == (0, "no rate limits\n")
    code, output = run(spawn, "rate-limit", "refunds", "200/s")  # (tests.proj has no refunds)
    assert (code, output.splitlines()[-1]) == (0, "refunds: at most 200/s promoted, shared "
                                                  "by every carrier")
    assert run(spawn, "rate-limit") == (0, "refunds: 200/s\n")
    assert run(spawn, "rate-limit", "refunds") == (0, "refunds: 200/s\n")
    code, output = run(spawn, "stats")
    assert "limited" in output.splitlines()[0]
    assert run(spawn, "rate-limit", "refunds", "off") == (
        0, "refunds: no rate limit; 0 held jobs due again\n")
    assert delayq.rate_limits() == {}
    code, output = run(spawn, "rate-limit", "refunds", "fast")
    assert code == 2 and "e.g. '200/s'" in output


@pytest.mark.parametrize(("args", "says"), [
    (("carrier", "--lease", "-1"), "delayq_lease_seconds (the carrier's --lease) must be"),
    (("carrier", "--lease", "0"), "delayq_lease_seconds (the carrier's --lease) must be"),
    (("carrier", "--shard-lease", "0"), "(the carrier's --shard-lease) must be greater"),
    (("carrier", "--idle-timeout", "-3"), "(the carrier's --idle-timeout) must be greater"),
    (("carrier", "--lease", "nan"), "delayq_lease_seconds (the carrier's --lease) must be"),
    (("carrier", "--lease", "inf"), "delayq_lease_seconds (the carrier's --lease) must be"),
    (("carrier", "--shard-lease", "inf"), "(the carrier's --shard-lease) must be"),
    (("carrier", "--lease", "0.0001"), "(the carrier's --lease) must be at least 0.001"),
    (("carrier", "--shard-lease", "0.0001"), "(the carrier's --shard-lease) must be at least"),
    (("carrier", "--metrics-port", "99999"), "Invalid value for '--metrics-port'"),
    (("ls", "--limit", "0"), "Invalid value for '--limit'"),
    (("ls", "--dead", "--limit", "-1"), "Invalid value for '--limit'"),
    (("health", "--max-overdue", "-1"), "Invalid value for '--max-overdue'"),
])
def test_a_carrier_option_or_listing_limit_out_of_range_is_refused_before_anything_runs(
        spawn, redis_client, args, says):
    """A carrier with a lease of -1 ran, every job it claimed leased into the past (so
    a recovery could take it back while it was being published); so did a listing of -5
    jobs ("no pending jobs")."""
    code, output = run(spawn, *args)
    assert code in (1, 2) and says in output
    assert "carrier started" not in output


def test_an_export_folder_that_cannot_be_made_is_an_error_not_a_traceback(spawn, redis_client):
    code, output = run(spawn, "export", "--to", "/proc/delayq-export", "--format", "jsonl")
    assert code == 1 and "error: cannot write the export under /proc/delayq-export" in output
    assert "Traceback" not in output


@pytest.fixture
def planted(proj, delayq, redis_client):
    """A pending job, a dead letter, a pause and a rate limit written with raw Redis
    commands (as an older version or anyone with access to Redis could), every name in
    them built to move, colour or forge the lines of an operator's terminal."""
    client, keys = delayq.store.client, delayq.store.keys
    job_id, key = "planted\x1b]0;owned\x07:\u202e1", "order:\x9b2J\x9b31m"
    fields = {"t": "reports.daily\x1b[2J\x1b]0;owned\x07\r\n2031-01-01  forged.task",
              "y": key, "q": "tenant-acme\u2028\x85queue=x"}
    shard = keys.shard_for(job_id, key)
    client.hset(shard.jobs, job_id, json.dumps(fields) + "\n[1]\n")
    client.zadd(shard.due, {job_id: delayq.store.now_ms() + 600_000})
    client.zadd(shard.bykey, {f"{key}\x00{job_id}": 0})
    dead = "dead\r\nforged\x07"
    client.hset(keys.shard_for(dead, None).dead, dead, json.dumps({
        "at": delayq.store.now_ms(), "reason": "unknown queue \x1b]0;owned\x07\r\nforged",
        "envelope": json.dumps(fields) + "\n\n"}))
    for each in keys:
        client.hset(each.paused, "task:reports\x1b]0;x\x07\u2028", "{}")
        client.hset(each.limits, "rate:tenant\x9b31m\r\n", "200/s\x1b[2J")
    return job_id


@pytest.mark.parametrize("command", [("ls",), ("ls", "--dead"), ("paused",), ("rate-limit",),
                                     ("check",)], ids=" ".join)
def test_stored_names_reach_the_terminal_escaped_one_line_each(spawn, planted, command):
    """Task and queue names, keys, job ids and dead-letter reasons are printed with their
    control, line-separating and bidi characters escaped: none reaches the terminal raw,
    none starts a line of its own."""
    _, output = run(spawn, *command)
    assert [c for c in RAW if c in output] == []
    lines = output.splitlines()
    assert not [line for line in lines if "forged" in line and "\\x" not in line]
    if command == ("ls",):
        assert len(lines) == 1  # one job, one line
        assert "planted\\x1b]0;owned\\x07:\\u202e1  reports.daily\\x1b[2J" in lines[0]
        assert "key=order:\\x9b2J\\x9b31m  queue=tenant-acme\\u2028\\x85queue=x" in lines[0]


def test_show_of_a_planted_job_prints_escaped_json(spawn, planted):
    code, output = run(spawn, "show", planted)
    assert code == 0 and [c for c in RAW if c in output] == []
    assert json.loads(output)["job_id"] == planted
