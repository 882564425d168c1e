"""Secrets stay out of errors, logs, CLI output and metrics; ids cannot reach outside
their namespace.

The secret tests use a real ``requirepass`` redis-server (or Sentinels) with a known
password, in every URL form redis-py and kombu accept, and grep everything that was
printed: exception text, log records, the CLI's stdout/stderr, the carrier's log and
its metrics page.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import subprocess
import threading
import urllib.request

import pytest
import redis
from celery import Celery

from celery_delayq import (
    ConfigurationError,
    DelayedTask,
    DelayQ,
    InvalidOption,
    StoreUnavailable,
)
from celery_delayq.carrier import Carrier
from celery_delayq.keys import pack_id
from celery_delayq.testing.redis_server import RedisServer, SentinelSet, free_port
from tests.conftest import CLUSTER, ROOT, celery_cli, store_keys, wait_for
from tests.ops.test_worker_start import WORKER


def app_with_store(url: str, **conf) -> tuple[Celery, DelayedTask]:
    app = Celery("secure", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.update(delayq_redis_url=url, delayq_redis_retries=1,
                    delayq_redis_socket_timeout=0.5, **conf)

    @app.task(base=DelayedTask, name="secure.noop", shared=False)
    def noop():
        return None

    return app, noop


def secret() -> str:
    return "pw" + secrets.token_hex(8)


#: Store URLs (and options) naming ``{pw}`` in every place a secret can go.
SECRET_FORMS = {
    "userinfo": ("redis://:{pw}@127.0.0.1:{port}/0", {}),
    "acl user": ("redis://delayq:{pw}@127.0.0.1:{port}/0", {}),
    "query": ("redis://127.0.0.1:{port}/0?password={pw}", {}),
    "query and user": ("rediss://127.0.0.1:{port}/0?username=delayq&password={pw}", {}),
    "sentinel": ("sentinel://:{pw}@127.0.0.1:{port};sentinel://127.0.0.1:{port}/0?password={pw}",
                 {"delayq_redis_transport_options": {
                     "master_name": "m", "sentinel_kwargs": {"password": "{pw}"}}}),
}


@pytest.mark.parametrize("form", SECRET_FORMS)
def test_unreachable_store_error_and_log_never_show_the_password(form, caplog):
    password, (url, conf) = secret(), SECRET_FORMS[form]
    conf = eval(repr(conf).replace("{pw}", password))  # the options hold it too
    _, noop = app_with_store(url.format(pw=password, port=free_port()), **conf)
    with caplog.at_level(logging.DEBUG), pytest.raises(StoreUnavailable) as raised:
        noop.apply_delayed(delay=5)
    printed = f"{raised.value}\n{raised.value.__cause__!r}\n{caplog.text}"
    assert password not in printed and "***" in str(raised.value)


def cli(store_url: str, broker_url: str, *args: str, log) -> subprocess.Popen:
    env = dict(os.environ, DELAYQ_TEST_REDIS_URL=broker_url, DELAYQ_TEST_STORE_URL=store_url,
               PYTHONPATH=ROOT)
    return subprocess.Popen(celery_cli("delayq", *args), cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def test_cli_errors_never_print_the_store_password(redis_server, tmp_path):
    password, wrong = secret(), secret()
    with RedisServer(extra=("--requirepass", password)) as server:
        down = free_port()
        runs = [
            *((f"redis://127.0.0.1:{down}/0?password={password}", command)
              for command in (["stats"], ["health"], ["ls"], ["show", "j1"],
                              ["cancel", "j1"])),
            (f"redis://:{password}@127.0.0.1:{down}/0", ["stats"]),
            (f"redis://127.0.0.1:{server.port}/0?password={wrong}", ["ls"]),
        ]
        processes = []
        for index, (url, command) in enumerate(runs):
            with open(tmp_path / f"{index}.log", "w") as log:
                processes.append(cli(url, redis_server.url, *command, log=log))
        for process in processes:
            assert process.wait(60) == 1
    printed = "".join(p.read_text() for p in sorted(tmp_path.glob("*.log")))
    assert printed.count("error: ") == len(runs)
    assert password not in printed and wrong not in printed
    assert printed.count("password=***") == 6


def test_carrier_log_and_metrics_never_show_the_store_password(redis_server, tmp_path):
    password = secret()
    with RedisServer(extra=("--requirepass", password)) as server:
        url = f"redis://127.0.0.1:{server.port}/0?password={password}"
        port = free_port()
        with open(tmp_path / "carrier.log", "w") as log:
            carrier = cli(url, redis_server.url, "carrier", "--metrics-port", str(port),
                          "-l", "DEBUG", log=log)
        try:
            _, noop = app_with_store(url, delayq_shards=4)
            noop.apply_delayed(delay=0.1)  # works: redis-py reads ?password=
            wait_for(lambda: "promoted 1 job;" in (tmp_path / "carrier.log").read_text(),
                     timeout=30, what="the job promoted with ?password=")
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read()
            server.stop()
            wait_for(lambda: "carrier paused" in (tmp_path / "carrier.log").read_text(),
                     timeout=30, what="the carrier to log the outage")
        finally:
            carrier.send_signal(signal.SIGTERM)
            carrier.wait(30)
    printed = (tmp_path / "carrier.log").read_text() + metrics.decode()
    assert password not in printed and "password=***" in printed


@pytest.mark.skipif(CLUSTER, reason="Sentinel runs beside a single Redis")
def test_password_protected_sentinels_work_and_never_show_their_passwords(caplog):
    password = secret()
    with SentinelSet(password=password) as sentinels:
        nodes = ";".join(f"sentinel://:{password}@127.0.0.1:{s.port}"
                         for s in sentinels.sentinels)
        app, noop = app_with_store(f"{nodes}/0", delayq_redis_transport_options={
            "master_name": sentinels.name, "sentinel_kwargs": {"password": password}})
        result = noop.apply_delayed(delay=60, key="order:1")
        assert DelayQ.of(app).get(result.job_id).key == "order:1"
        DelayQ.of(app).store.close()
        for sentinel in sentinels.sentinels:
            sentinel.stop()
        with caplog.at_level(logging.DEBUG), pytest.raises(StoreUnavailable) as raised:
            noop.apply_delayed(delay=60)
    assert password not in f"{raised.value}\n{raised.value.__cause__!r}\n{caplog.text}"


def test_store_works_with_a_password_protected_redis():
    password = secrets.token_urlsafe(12)
    with RedisServer(extra=("--requirepass", password)) as server:
        app, noop = app_with_store(f"redis://:{password}@127.0.0.1:{server.port}/0")
        result = noop.apply_delayed(delay=60, key="order:1")
        assert DelayQ.of(app).get(result.job_id).key == "order:1"


@pytest.mark.parametrize("given", ["a wrong password", "no password"])
def test_a_store_refusing_the_credentials_says_so_not_that_it_is_down(given):
    """A wrong password (WRONGPASS) or none for a requirepass Redis (NOAUTH) is told as
    such: "unavailable ... check that it runs" sent operators looking for a down server."""
    password = secret()
    with RedisServer(extra=("--requirepass", password)) as server:
        userinfo = f":{secret()}@" if given == "a wrong password" else ""
        _, noop = app_with_store(f"redis://{userinfo}127.0.0.1:{server.port}/0")
        with pytest.raises(StoreUnavailable, match="refused the credentials") as refused:
            noop.apply_delayed(delay=60)
    said = str(refused.value)
    assert "delayq_redis_password" in said and "check that it runs" not in said
    assert password not in said and (not userinfo or userinfo[1:-1] not in said)


def shown(app) -> str:
    """What Celery shows of an app's settings to whoever asks: ``celery report`` (pasted
    into bug reports) and ``celery inspect conf`` (any client of the broker)."""
    return app.bugreport() + repr(app.conf.table(with_defaults=True))


@pytest.mark.parametrize("user", ["", "delayq"])
def test_delayq_redis_password_authenticates_and_celery_reports_hide_it(user):
    password = secret()
    with RedisServer(extra=("--requirepass", password)) as server:
        redis.Redis(port=server.port, password=password).acl_setuser(
            "delayq", enabled=True, passwords=[f"+{password}"], keys=["*"], channels=["*"],
            commands=["+@all"])
        userinfo = f"{user}@" if user else ""
        app, noop = app_with_store(f"redis://{userinfo}127.0.0.1:{server.port}/0",
                                   delayq_redis_password=password)
        result = noop.apply_delayed(delay=60, key="order:1")
        assert DelayQ.of(app).get(result.job_id).key == "order:1"
        assert password not in shown(app) + repr(DelayQ.of(app).config)
        DelayQ.of(app).store.close()


@pytest.mark.skipif(CLUSTER, reason="Sentinel runs beside a single Redis")
def test_delayq_redis_password_is_the_sentinel_masters():
    password = secret()
    with SentinelSet(password=password) as sentinels:
        nodes = ";".join(f"sentinel://127.0.0.1:{s.port}" for s in sentinels.sentinels)
        app, noop = app_with_store(f"{nodes}/0", delayq_redis_password=password,
                                   delayq_redis_transport_options={
                                       "master_name": sentinels.name,
                                       "sentinel_kwargs": {"password": password}})
        result = noop.apply_delayed(delay=60, key="order:1")
        assert DelayQ.of(app).get(result.job_id).key == "order:1"
        assert password not in shown(app)
        DelayQ.of(app).store.close()


def test_a_password_in_delayq_redis_url_is_shown_by_celery_so_the_carrier_warns(caplog):
    password = secret()
    with RedisServer(extra=("--requirepass", password)) as server:
        app, _ = app_with_store(f"redis://:{password}@127.0.0.1:{server.port}/0")
        assert password in shown(app)  # Celery hides settings by name, not a URL of ours
        carrier = Carrier(app)
        thread = threading.Thread(target=carrier.run, daemon=True)
        with caplog.at_level(logging.WARNING, logger="celery_delayq"):
            thread.start()
            wait_for(lambda: "set delayq_redis_password" in caplog.text,
                     what="the carrier's warning")
            carrier.stop()
            thread.join(10)
    assert password not in caplog.text


def test_a_worker_whose_delayq_redis_url_holds_a_password_warns(spawn, monkeypatch):
    """Workers answer ``celery inspect conf`` to any client of the broker, as the carrier
    does: they warn too (a worker of a queue nothing is sent to; the store is not reached)."""
    password = secret()
    monkeypatch.setenv("DELAYQ_TEST_STORE_URL", f"redis://:{password}@127.0.0.1:{free_port()}/0")
    worker = spawn(*WORKER)
    wait_for(lambda: "ready." in worker.log.read_text(), timeout=30, what="the worker")

    said = worker.log.read_text()
    assert said.count("WARNING/MainProcess] delayq_redis_url holds a password, which `celery "
                      "report` and `celery inspect conf` print as it is: set "
                      "delayq_redis_password") == 1
    assert password not in said


@pytest.mark.parametrize("url", ["redis://:{pw}@127.0.0.1:{port}/0",
                                 "redis://127.0.0.1:{port}/0?password={pw}"])
def test_a_password_in_the_url_and_in_delayq_redis_password_is_refused(url):
    password, other = secret(), secret()
    _, noop = app_with_store(url.format(pw=password, port=free_port()),
                             delayq_redis_password=other)
    with pytest.raises(ConfigurationError, match="keep it in delayq_redis_password") as refused:
        noop.apply_delayed(delay=5)
    assert password not in str(refused.value) and other not in str(refused.value)


@pytest.mark.skipif(CLUSTER, reason="counts keys of the single store")
@pytest.mark.parametrize("job_id", ["delayq:{0}:due", "../../etc", "order:1\u200bx", "*"])
def test_job_ids_that_look_like_keys_stay_inside_the_store(proj, redis_client, job_id):
    before = store_keys(proj.delayq)
    result = proj.record.apply_delayed(args=("x",), delay=60, job_id=job_id, key=job_id)
    assert proj.delayq.get(job_id).job_id == job_id
    keys = proj.delayq.store.keys
    assert set(store_keys(proj.delayq)) <= set(before) | {
        k for s in keys
        for k in (s.due, s.jobs, s.bykey, s.journal, s.counts,
                  keys.task_index(s, pack_id(result.id)))}
    assert proj.delayq.cancel_key(job_id) == 1


#: Queue names whose Redis list kombu would keep in a key of the store (delayq_prefix
#: "delayq"), and the keys a reviewer's calls damaged with them.
STORE_KEY_QUEUES = ["delayq:meta", "delayq:carriers", "delayq:export", "delayq:{0}:due",
                    "delayq:{0}:limits", "delayq:{1}:reserved:order:42:close"]


@pytest.mark.parametrize("queue", STORE_KEY_QUEUES)
def test_a_queue_whose_broker_list_would_be_a_store_key_is_refused_at_the_call(queue):
    """The store on the broker's Redis (the default): kombu keeps a queue's messages in a
    list named as the queue, so such a queue turned a key of the store into a list, which
    stopped a shard, every promotion, or one job id for good."""
    app, noop = app_with_store("redis://127.0.0.1:1/0")
    with pytest.raises(InvalidOption, match=rf"queue '{re.escape(queue)}' would keep its "
                                            "messages in a key of the delay store"):
        noop.apply_delayed(delay=5, queue=queue)
    with pytest.raises(InvalidOption, match="would keep its messages in a key"):
        DelayQ.of(app).schedule_many("secure.noop", [{"delay": 5}], queue=queue)


def test_a_queue_is_refused_by_its_list_under_kombus_global_keyprefix():
    _, noop = app_with_store("redis://127.0.0.1:1/0", delayq_prefix="app:delayq",
                             broker_transport_options={"global_keyprefix": "app:"})
    with pytest.raises(InvalidOption, match="would keep its messages in a key"):
        noop.apply_delayed(delay=5, queue="delayq:{0}:due")  # the list app:delayq:{0}:due


@pytest.mark.parametrize("queue", ["delayq:emails", "delayq:{meta-archive}", "delayq:{0}"])
def test_a_queue_named_beside_the_store_keys_is_taken(proj, redis_client, queue):
    result = proj.record.apply_delayed(args=("x",), delay=60, queue=queue)
    assert proj.delayq.get(result.id).queue == queue
    assert result.cancel()
