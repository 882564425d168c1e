"""Settings are read from app.conf in one place, with defaults and clear errors."""

from __future__ import annotations

import sys

import pytest
from celery import Celery

from celery_delayq.carrier import Carrier
from celery_delayq.conf import DelayQConfig, redact
from celery_delayq.errors import ConfigurationError
from celery_delayq.settings import SETTINGS


def make_app(**conf):
    app = Celery("conf", set_as_current=False, **conf.pop("celery", {}))
    app.conf.update(conf)
    return app


def test_store_defaults_to_a_redis_broker():
    config = DelayQConfig.from_app(make_app(celery={"broker": "redis://h:6379/2"}))
    assert config.redis_url == "redis://h:6379/2"
    assert config.shards == 8


def test_settings_use_the_delayq_prefix():
    config = DelayQConfig.from_app(make_app(celery={"broker": "amqp://"},
                                            delayq_redis_url="redis://h/1", delayq_shards="3"))
    assert (config.redis_url, config.shards) == ("redis://h/1", 3)


def test_non_redis_broker_without_store_url_says_how_to_fix():
    with pytest.raises(ConfigurationError, match="delayq_redis_url"):
        DelayQConfig.from_app(make_app(celery={"broker": "amqp://guest@rabbit//"}))


@pytest.mark.parametrize(("setting", "value"), [("shards", 0), ("lease_seconds", 0),
                                                ("lease_seconds", float("inf")),
                                                ("shard_lease_seconds", 0.0001),
                                                ("idle_timeout", 1e300),
                                                # True read as 1 s, as whole numbers refuse it
                                                ("lease_seconds", True),
                                                ("handoff_lead", False),
                                                ("shards", 2.5), ("shards", True),
                                                ("countdown_threshold", float("nan")),
                                                ("countdown_threshold", -1),
                                                ("claim_batch", "many"), ("claim_batch", 0),
                                                ("claim_batch", 10_001),
                                                # a typo fixed into the store for good: its
                                                # record keeps the first shard count
                                                ("shards", 80_000),
                                                # -1 retried forever, and redis-py's resend
                                                # window (that many tries) fell to 0
                                                ("redis_retries", -1),
                                                ("redis_retries", 1000),
                                                # read as 0, the journal off
                                                ("journal_maxlen", -1),
                                                # "never trim": Lua wrote 9.2233720368547758e+18
                                                # to XADD, refused after the script's writes
                                                ("journal_maxlen", sys.maxsize),
                                                ("journal_maxlen", 10**17),
                                                # a typo read as False, 2 as True
                                                ("worker_events", "enabled"),
                                                ("worker_events", 2),
                                                ("worker_events", ["on"])])
def test_invalid_setting_is_refused(setting, value):
    app = make_app(celery={"broker": "redis://h"}, **{f"delayq_{setting}": value})
    with pytest.raises(ConfigurationError, match=f"delayq_{setting}"):
        DelayQConfig.from_app(app)


@pytest.mark.parametrize(("setting", "value", "written"), [
    ("shards", 80_000, "CELERY_DELAYQ_SHARDS"),
    ("worker_events", "enabled", "CELERY_DELAYQ_WORKER_EVENTS"),
    ("handoff_lead", -1, "CELERY_DELAYQ_HANDOFF_LEAD")])
def test_a_refused_setting_of_a_django_project_is_named_as_its_settings_write_it(
        setting, value, written):
    """Django projects read Celery's settings with ``namespace="CELERY"``: the error names
    the setting as settings.py holds it, beside the name Celery's docs use."""
    settings = type("settings", (), {"CELERY_BROKER_URL": "redis://h",
                                     f"CELERY_DELAYQ_{setting.upper()}": value})
    app = Celery("django", set_as_current=False)
    app.config_from_object(settings, namespace="CELERY")
    with pytest.raises(ConfigurationError, match=rf"delayq_{setting}\b.*{written} in this "
                                                 "app's settings"):
        DelayQConfig.from_app(app)
    plain = make_app(celery={"broker": "redis://h"}, **{f"delayq_{setting}": value})
    with pytest.raises(ConfigurationError) as refused:
        DelayQConfig.from_app(plain)
    assert "CELERY_DELAYQ" not in str(refused.value)


@pytest.mark.parametrize("url", ["redis://h:6379/db1", "redis://h:6379/1/2",
                                 "redis://h:6379/%201", "rediss://h/x",
                                 "redis+cluster://h:7000/x", "redis://h/1;redis://h/one"])
def test_a_database_that_is_not_a_number_is_refused(url):
    """redis-py reads ``/db1`` as database 0 and ``/1/2`` as 12: a producer and a carrier
    with one typo between them served two stores, and jobs waited for good."""
    with pytest.raises(ConfigurationError, match="give its number") as refused:
        DelayQConfig.from_app(make_app(celery={"broker": "amqp://"}, delayq_redis_url=url))
    assert "delayq_redis_url" in str(refused.value)


@pytest.mark.parametrize("url", ["redis://h:6379", "redis://h:6379/", "redis://h/15",
                                 "unix:///run/redis.sock?db=2", "redis+cluster://h:7000"])
def test_a_database_given_as_a_number_or_not_at_all_is_read(url):
    assert DelayQConfig.from_app(make_app(celery={"broker": "amqp://"},
                                          delayq_redis_url=url)).redis_url


@pytest.mark.parametrize(("given", "read"), [("true", True), ("Yes", True), (" on ", True),
                                            ("1", True), (1, True), (True, True),
                                            ("false", False), ("No", False), ("off", False),
                                            ("0", False), (0, False), (False, False)])
def test_a_switch_is_read_from_the_words_environments_use(given, read):
    config = DelayQConfig.from_app(make_app(celery={"broker": "redis://h"},
                                            delayq_worker_events=given))
    assert config.worker_events is read


def test_every_setting_is_documented_once():
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))
    assert all(s.doc.endswith(".") for s in SETTINGS)


def test_passwords_never_appear_in_redacted_urls():
    assert redact("redis://:s3cret@h:6379/0") == "redis://:***@h:6379/0"
    assert redact("rediss://user:s3cret@h/0") == "rediss://user:***@h/0"
    assert redact("redis://h/0") == "redis://h/0"


def test_a_setting_set_to_none_takes_its_default():
    config = DelayQConfig.from_app(make_app(celery={"broker": "redis://h"}, delayq_prefix=None,
                                            delayq_shards=None))
    assert (config.prefix, config.shards) == ("delayq", 8)


def test_a_carrier_batch_that_would_hold_redis_long_is_refused():
    """One claim of 50,000 jobs held Redis for 286 ms; --batch takes at most 10,000."""
    app = make_app(celery={"broker": "redis://h"})
    with pytest.raises(ConfigurationError, match="--batch"):
        Carrier(app, batch=50_000)
    assert Carrier(app, batch=10_000).batch == 10_000


@pytest.mark.parametrize("broker", [
    "redis://h1:6379/0;redis://h2:6379/0",
    ["redis://h1:6379/0", "redis://h2:6379/0"],
    ("redis://:pw@h1:6379/0", "rediss://h2:6380/0"),
])
def test_a_failover_list_of_redis_brokers_asks_which_one_holds_the_store(broker):
    """kombu moves to the next URL when one fails; a store cannot: two servers would hold
    two stores. Refused at start, instead of a store on the first that fails with it."""
    with pytest.raises(ConfigurationError, match="lists 2 Redis servers") as refused:
        DelayQConfig.from_app(make_app(celery={"broker": broker}))
    assert "delayq_redis_url" in str(refused.value) and "pw" not in str(refused.value)
    config = DelayQConfig.from_app(make_app(celery={"broker": broker},
                                            delayq_redis_url="redis://h2:6379/0"))
    assert config.redis_url == "redis://h2:6379/0"


def test_a_list_of_sentinels_is_one_sentinel_url():
    broker = ["sentinel://s1:26379", "sentinel://s2:26379"]
    config = DelayQConfig.from_app(make_app(celery={"broker": broker},
                                            delayq_redis_transport_options={"master_name": "m"}))
    assert config.redis_url == "sentinel://s1:26379;sentinel://s2:26379"


@pytest.mark.parametrize(("broker", "store"), [
    ("redis+socket:///run/redis.sock", "unix:///run/redis.sock"),
    ("redis+socket:///run/redis.sock?virtual_host=3", "unix:///run/redis.sock?db=3"),
    ("redis+socket://:pw@/run/redis.sock?virtual_host=2&socket_timeout=5",
     "unix://:pw@/run/redis.sock?db=2&socket_timeout=5"),
    ("redis://h:6379/4", "redis://h:6379/4"),
])
def test_a_store_on_the_broker_reads_kombus_socket_url_as_redis_py_does(broker, store):
    assert DelayQConfig.from_app(make_app(celery={"broker": broker})).redis_url == store


def test_the_settings_repr_shows_no_secret():
    """Error reporters (Sentry, Django's debug page) print a frame's locals by repr."""
    config = DelayQConfig.from_app(make_app(
        celery={"broker": "redis://h"}, delayq_redis_url="rediss://alice:pw-url@h:6380/0",
        delayq_redis_ssl={"ssl_keyfile": "/k.pem", "ssl_password": "pw-tls"},
        delayq_redis_transport_options={"master_name": "m",
                                        "sentinel_kwargs": {"password": "pw-sentinel"}}))
    shown = repr(config)
    assert not [pw for pw in ("pw-url", "pw-tls", "pw-sentinel") if pw in shown]
    assert "rediss://alice:***@h:6380/0" in shown and "'ssl_keyfile': '/k.pem'" in shown
    assert "'master_name': 'm'" in shown and "shards=" in shown


@pytest.mark.parametrize("name", ["redis_ssl", "redis_transport_options"])
def test_a_mapping_setting_given_as_text_is_refused_without_echoing_it(name):
    """Given as text (an environment variable, Spark's --set), it may hold a password."""
    with pytest.raises(ConfigurationError, match=f"delayq_{name} must be .*, got a str") as refused:
        DelayQConfig.from_app(make_app(celery={"broker": "redis://h"}, **{
            f"delayq_{name}": '{"ssl_password": "pw-tls", "password": "pw-sentinel"}'}))
    assert "pw-" not in str(refused.value)


@pytest.mark.parametrize(("raw", "tls"), [
    (None, None), ("", None), (False, None), ("false", None), (" Off ", None), (0, None),
    (True, {}), ("true", {}), ("yes", {}), (1, {}),
    ({"ssl_cert_reqs": "none"}, {"ssl_cert_reqs": "none"})])
def test_tls_is_on_only_when_the_setting_says_so(raw, tls):
    """An unset environment variable read as "" turned TLS on against a plain server."""
    config = DelayQConfig.from_app(make_app(celery={"broker": "redis://h"},
                                            delayq_redis_ssl=raw))
    assert config.redis_ssl == tls


@pytest.mark.parametrize("raw", ["maybe", [], ["ssl_ca_certs"], 2])
def test_a_tls_setting_that_is_neither_a_switch_nor_options_is_refused(raw):
    with pytest.raises(ConfigurationError, match="delayq_redis_ssl must be true or false, or "
                                                 "a mapping of redis-py's ssl_"):
        DelayQConfig.from_app(make_app(celery={"broker": "redis://h"}, delayq_redis_ssl=raw))


@pytest.mark.parametrize("prefix", ["{}", "app{}", "{}app", "my{}{app}"])
def test_a_prefix_with_an_empty_hash_tag_is_refused_on_a_cluster(prefix):
    """Its keys hashed whole: one shard's keys fell in different slots, every script failed
    ("all keys must map to the same key slot")."""
    with pytest.raises(ConfigurationError, match=r"delayq_prefix .* empty hash tag"):
        DelayQConfig.from_app(make_app(celery={"broker": "redis://h"}, delayq_prefix=prefix,
                                       delayq_redis_url="redis+cluster://h:7000"))


@pytest.mark.parametrize(("prefix", "url"), [
    ("{}", "redis://h"), ("{app}", "redis+cluster://h:7000"), ("my{app", "redis+cluster://h"),
    ("app}{", "redis+cluster://h")])
def test_a_prefix_with_braces_that_leaves_each_shard_one_slot_is_accepted(prefix, url):
    config = DelayQConfig.from_app(make_app(celery={"broker": "redis://h"}, delayq_prefix=prefix,
                                            delayq_redis_url=url))
    assert config.prefix == prefix


@pytest.mark.parametrize(("options", "says"), [
    ({"min_other_sentinels": "two"}, "min_other_sentinels .* a whole number"),
    ({"min_other_sentinels": -1}, "min_other_sentinels .* a whole number"),
    ({"sentinel_kwargs": "password=pw-sentinel"}, "sentinel_kwargs .* a mapping"),
], ids=["others-text", "others-negative", "kwargs-text"])
def test_sentinel_options_of_the_wrong_type_are_refused_when_read(options, says):
    """They raised a bare ValueError or TypeError at the store's first call."""
    with pytest.raises(ConfigurationError, match=says) as refused:
        DelayQConfig.from_app(make_app(
            celery={"broker": "redis://h"}, delayq_redis_url="sentinel://s1:26379",
            delayq_redis_transport_options={"master_name": "m", **options}))
    assert "pw-sentinel" not in str(refused.value)
