"""The minimal ACL command sets of docs/operations.md are enough, and taken from there.

A real redis-server with three ACL users defined by the ``ACL SETUSER`` lines of the
docs (producer, carrier, CLI): a producer schedules, the CLI pauses another queue and
rate-limits this one, a carrier promotes (the broker is another Redis), the CLI runs
``stats``, ``ls``, ``cancel``, lifts the limit, resumes, repairs the store (``check
--repair``, ``check``) and exports the journal. Nothing is refused. On a Redis
Cluster the producer's line and the cluster commands the docs add are enough too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_delayq import ConfigurationError, DelayedTask, DelayQ
from celery_delayq.carrier import Carrier
from celery_delayq.store import releasing
from celery_delayq.testing.redis_server import RedisClusterServer, RedisServer
from tests.conftest import CLUSTER, ROOT, celery_cli, wait_for

OPERATIONS = Path(ROOT) / "docs" / "operations.md"
USERS = ("delayq-producer", "delayq-carrier", "delayq-cli")
PASSWORD = "acl-test-password"

pytestmark = pytest.mark.skipif(CLUSTER, reason="one Redis with ACL users")


def documented_acl() -> dict[str, list[str]]:
    """``ACL SETUSER`` arguments per user, as docs/operations.md lists them."""
    lines = re.findall(r"^ACL SETUSER (delayq-\w+) (.+)$", OPERATIONS.read_text(), re.M)
    return {user: shlex.split(rules.replace("PASSWORD", PASSWORD)) for user, rules in lines}


def test_operations_md_lists_a_user_for_producers_the_carrier_and_the_cli():
    assert set(documented_acl()) == set(USERS)


def test_producer_carrier_and_cli_run_with_exactly_the_documented_commands(
        redis_server, tmp_path):
    broker = f"{redis_server.url}/8"
    with RedisServer() as server:
        admin = redis.Redis(port=server.port, decode_responses=True)
        for user, rules in documented_acl().items():
            admin.acl_setuser(user, reset=True)
            admin.execute_command("ACL", "SETUSER", user, *rules)
        url = f"redis://{{user}}:{PASSWORD}@127.0.0.1:{server.port}/0"

        def app_as(user: str) -> tuple[Celery, DelayedTask]:
            app = Celery("acl", broker=broker, set_as_current=False)
            app.conf.update(delayq_redis_url=url.format(user=user), delayq_shards=4,
                            delayq_idle_timeout=0.5, task_default_queue="acl-test")

            @app.task(base=DelayedTask, name="acl.noop", shared=False)
            def noop(n):
                return n

            DelayQ(app)
            return app, noop

        _, noop = app_as("delayq-producer")
        noop.apply_delayed_many([{"args": (n,), "delay": 0.2, "job_id": f"due-{n}"}
                                 for n in range(20)])
        # held on one shard by a pause that stays: more than a release call looks at, so
        # the resume at the end walks past them call by call
        noop.apply_delayed_many([{"args": (n,), "delay": 0.2, "key": "tenant:1"}
                                 for n in range(releasing.RELEASE_CHUNK + 100)],
                                queue="kept")
        noop.apply_delayed(args=(0,), delay=600, job_id="later", key="order:1")
        noop.apply_delayed(args=(0,), delay=600, job_id="cancel-me")
        assert DelayQ.of(noop.app).cancel("cancel-me")
        # jobs of ids of their own: a task id index, which a reschedule and a revoke use
        moved = noop.apply_delayed(args=(0,), delay=600, job_id="move-me", key="order:2")
        assert DelayQ.of(noop.app).reschedule("move-me", delay=900, key="order:2")
        revoked = noop.apply_delayed(args=(0,), delay=600, job_id="revoke-me")
        assert DelayQ.of(noop.app).revoke([revoked.id]) == 1
        shard = DelayQ.of(noop.app).store.keys.shard(0)
        for bad in ("bad-1", "bad-2"):  # the carrier dead-letters them, the CLI settles them
            admin.hset(shard.jobs, bad, '{"t":"acl.noop"')
            admin.zadd(shard.due, {bad: 0})
        env = {"DELAYQ_TEST_REDIS_URL": redis_server.url,
               "DELAYQ_TEST_STORE_URL": url.format(user="delayq-cli"), "PYTHONPATH": ROOT,
               "DELAYQ_TEST_DEFAULT_QUEUE": "acl-test"}
        outputs = {}

        def cli(*command: str) -> None:
            done = subprocess.run(celery_cli("delayq", *command), cwd=ROOT, text=True,
                                  env={**os.environ, **env},
                                  capture_output=True, timeout=60)
            assert done.returncode == 0, done.stdout + done.stderr
            outputs[command[0]] = done.stdout

        cli("pause", "--queue", "elsewhere")
        cli("pause", "--queue", "kept")
        cli("rate-limit", "acl-test", "1000/s")  # the carrier's claims read and keep a bucket

        app, _ = app_as("delayq-carrier")
        carrier = Carrier(app)
        thread = threading.Thread(target=carrier.run, daemon=True)
        thread.start()
        queue = redis.Redis.from_url(broker)
        try:
            wait_for(lambda: queue.llen("acl-test") >= 20, what="20 jobs promoted")
            wait_for(lambda: sum(row["paused"] for row in DelayQ.of(app).store.stats())
                     == releasing.RELEASE_CHUNK + 100, what="the kept queue's jobs held")
        finally:
            carrier.stop()
            thread.join(10)
            queue.delete("acl-test")
        for command in (["stats", "--json"], ["ls", "--key", "order:1"], ["cancel", "later"],
                        ["reschedule", "move-me", "--delay", "1200"], ["run-now", "move-me"],
                        ["paused"], ["rate-limit", "acl-test", "off"],
                        ["resume", "--queue", "elsewhere"], ["drop", "bad-1"],
                        ["replay", "--all"], ["drop", "--all", "--yes"]):
            cli(*command)
        # damage to repair: the kept queue's held jobs stranded (its pause gone by hand,
        # so the repair releases them in a transaction), and a due member without a job
        for keys in DelayQ.of(app).store.keys:
            admin.hdel(keys.paused, "queue:kept")
        admin.zadd(shard.due, {"dangling": 0})
        cli("check", "--repair")
        cli("check")
        cli("export", "--to", str(tmp_path / "export"), "--format", "jsonl")
        denied = admin.acl_log()
        admin.close()
    # Refused and handled: redis-py's CLIENT SETINFO on connect (Redis < 7.2 lacks it), and
    # the eviction check's CONFIG GET maxmemory-policy, which falls back to INFO.
    assert sorted({f"{d['username']}: {d['object']}" for d in denied
                   if d["object"].split("|")[0] not in ("client", "config")}) == []
    assert sum(row["pending"] for row in json.loads(outputs["stats"])) == (
        2 + releasing.RELEASE_CHUNK + 100)
    assert moved.id and "move-me" in outputs["run-now"]
    assert "later" in outputs["ls"] and "later: cancelled" in outputs["cancel"]
    assert outputs["paused"] == "queue elsewhere\nqueue kept\n"
    assert "replayed 1 dead job" in outputs["replay"] and "dropped 0" in outputs["drop"]
    assert outputs["check"].startswith("clean: ") and "exported " in outputs["export"]


@pytest.mark.parametrize("left_out", ["+evalsha", "+type"])
def test_a_user_refused_a_store_command_gets_an_error_that_names_the_acl_section(
        redis_server, left_out):
    """A producer user the docs' line was not given whole: ``ConfigurationError`` pointing
    at docs/operations.md, not a raw ``NoPermissionError`` (no EVALSHA) or ``ResponseError``
    (a command refused inside a script: "The user executing the script can't run this
    command"); nothing written, as the script checks its keys before it writes."""
    with RedisServer() as server, producer_without(redis_server, server, left_out) as delayq:
        with pytest.raises(ConfigurationError, match="Redis ACL users") as refused:
            delayq.schedule("acl.noop", [1], delay=60)
        assert PASSWORD not in str(refused.value)
        assert redis.Redis(port=server.port).dbsize() == 1  # the store's meta record,
        # written at its first use


def test_a_reschedule_by_a_user_of_an_older_line_without_pexpire_writes_nothing(redis_server):
    """The script sets a task id index's expiry itself: without PEXPIRE it is refused
    before it moves the due time, not after (no journal entry, no wake)."""
    with RedisServer() as server, producer_without(redis_server, server, "+pexpire") as delayq:
        delayq.schedule("acl.noop", [1], delay=600, job_id="move-me")
        admin = redis.Redis(port=server.port, decode_responses=True)
        journal = delayq.store.keys.shard_for("move-me").journal
        before = (delayq.get("move-me").due, admin.xlen(journal))
        with pytest.raises(ConfigurationError, match="Redis ACL users"):
            delayq.reschedule("move-me", delay=900)
        assert (delayq.get("move-me").due, admin.xlen(journal)) == before
        admin.close()


def test_a_producer_given_the_line_of_releases_before_script_exists_still_schedules_own_ids(
        redis_server):
    """Before ``+script|exists`` was documented (a reservation asks which scripts Redis
    lacks, so none is loaded between a write and its release), the producer's line lacked
    it: such a user still schedules and replaces jobs of ids of its own."""
    with RedisServer() as server, producer_without(redis_server, server,
                                                   "+script|exists") as delayq:
        delayq.schedule("acl.noop", [1], delay=60, job_id="j", key="order:1")
        delayq.schedule("acl.noop", [2], delay=60, job_id="j", key="order:2",
                        if_exists="replace")
        assert [(job.job_id, job.key) for job in delayq.pending()] == [("j", "order:2")]


@contextlib.contextmanager
def producer_without(redis_server, server: RedisServer, left_out: str) -> Iterator[DelayQ]:
    """A DelayQ on ``server`` as the docs' producer user, less the rule ``left_out``."""
    admin = redis.Redis(port=server.port, decode_responses=True)
    rules = [rule for rule in documented_acl()["delayq-producer"] if rule != left_out]
    assert len(rules) == len(documented_acl()["delayq-producer"]) - 1, left_out
    admin.execute_command("ACL", "SETUSER", "delayq-producer", *rules)
    admin.close()
    app = Celery("acl", broker=f"{redis_server.url}/8", set_as_current=False)
    app.conf.update(delayq_redis_url=f"redis://delayq-producer:{PASSWORD}@127.0.0.1:"
                                     f"{server.port}/0", delayq_shards=4)
    delayq = DelayQ(app)
    try:
        yield delayq
    finally:
        delayq.store.close()


def test_on_a_cluster_the_documented_lines_and_cluster_commands_are_enough(redis_server):
    """docs/operations.md: on a Redis Cluster every user also needs the commands redis-py's
    cluster client reads the slot map and the command table with; a user without them is
    told so (redis-py says "Cluster mode is not enabled on this node")."""
    extra = shlex.split(re.search(r"On a Redis Cluster, add `([^`]+)` to every user",
                                  OPERATIONS.read_text())[1])
    with RedisClusterServer() as cluster:
        for node in cluster.nodes:
            with redis.Redis(port=node.port) as admin:
                admin.execute_command("ACL", "SETUSER", "delayq-producer",
                                      *documented_acl()["delayq-producer"], *extra)
                admin.execute_command("ACL", "SETUSER", "no-cluster-commands",
                                      *documented_acl()["delayq-producer"])

        def delayq_as(user: str) -> DelayQ:
            app = Celery("acl", broker=f"{redis_server.url}/8", set_as_current=False)
            app.conf.update(delayq_redis_url=cluster.url.replace(
                "//", f"//{user}:{PASSWORD}@"))
            return DelayQ(app)

        delayq = delayq_as("delayq-producer")
        delayq.schedule("acl.noop", [1], delay=60, job_id="j", key="order:1")
        assert [job.job_id for job in delayq.pending(key="order:1")] == ["j"]
        assert delayq.cancel("j")
        delayq.store.close()
        with pytest.raises(ConfigurationError, match=r"\+cluster\|slots \+command") as refused:
            delayq_as("no-cluster-commands").schedule("acl.noop", [1], delay=60)
        assert PASSWORD not in str(refused.value)


def test_a_carrier_user_refused_a_command_its_claim_calls_is_told_which_section(
        redis_server):
    """The claim script of a shard with a rate limit calls ZLEXCOUNT: a carrier user
    without it gets each shard's refusal as ``ConfigurationError`` naming the ACL section
    (the carrier logs it), not "Redis refused the call"."""
    with RedisServer() as server:
        admin = redis.Redis(port=server.port, decode_responses=True)
        rules = [rule for rule in documented_acl()["delayq-carrier"] if rule != "+zlexcount"]
        admin.execute_command("ACL", "SETUSER", "delayq-carrier", *rules)

        def delayq_as(userinfo: str) -> DelayQ:
            app = Celery("acl", broker=f"{redis_server.url}/8", set_as_current=False)
            app.conf.update(delayq_redis_url=f"redis://{userinfo}127.0.0.1:{server.port}/0",
                            delayq_shards=4)
            return DelayQ(app)

        owner = delayq_as("")
        owner.set_rate_limit("limited", "10/s")
        owner.schedule_many("acl.noop", [{"args": [n], "delay": 0} for n in range(8)],
                            queue="limited")
        carrier = delayq_as(f"delayq-carrier:{PASSWORD}@")
        claims = carrier.store.claim(list(carrier.store.keys), 10, 3000)
        assert [type(claim.error) for claim in claims] == [ConfigurationError] * 4
        assert "Redis ACL users" in str(claims[0].error)
        assert PASSWORD not in str(claims[0].error)
        for delayq in (owner, carrier):
            delayq.store.close()
        admin.close()
