"""URLs printed without secrets; TLS and Sentinel options read as kombu reads them; script
calls sent as the bytes redis-py packs."""

from __future__ import annotations

import ssl
from urllib.parse import quote, unquote

import pytest
from celery import Celery
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.connection import Connection, parse_url

from celery_delayq.conf import DelayQConfig
from celery_delayq.connection import (
    holds_password,
    packed,
    redact,
    sentinel_nodes,
    ssl_options,
)
from celery_delayq.errors import ConfigurationError
from tests.conftest import examples


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
    ("rediss://user:s3cret@h/0", "rediss://user:***@h/0"),
    ("redis://s3cret@h/0", "redis://***@h/0"),
    ("redis://h:6379/0?password=s3cret", "redis://h:6379/0?password=***"),
    ("redis://h/0?username=u&password=s3cret&db=1", "redis://h/0?username=u&password=***&db=1"),
    ("redis://:a/s3cret@h/0", "redis://:***@h/0"),
    ("redis://h/0?password=a@s3cret", "redis://***"),
    ("sentinel://:s3cret@a:26379;sentinel://:s3cret@b:26379/0",
     "sentinel://:***@a:26379;sentinel://:***@b:26379/0"),
    ("unix://:s3cret@/run/redis.sock?db=0", "unix://:***@/run/redis.sock?db=0"),
    ("redis://h:6379/0", "redis://h:6379/0"),
])
def test_redact_hides_every_password_form(url, shown):
    assert redact(url) == shown and "s3cret" not in redact(url)


@pytest.mark.parametrize(("url", "holds"), [
    ("redis://:s3cret@h/0", True), ("redis://user:s3cret@h/0", True),
    ("redis://h/0?password=s3cret", True), ("sentinel://a:1;sentinel://:s3cret@b:2/0", True),
    ("redis://user@h/0", False),  # a user name alone (redis-py sends no AUTH)
    ("redis://:@h/0", False), ("redis://h/0?password=", False), ("redis://h/0", False),
])
def test_holds_password_finds_one_in_the_userinfo_or_the_query(url, holds):
    assert holds_password(url) is holds


@given(password=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1),
       form=st.sampled_from(["redis://user:{pw}@h:6379/0", "redis://h:6379/0?password={pw}",
                             "sentinel://:{pw}@a:26379;sentinel://b:26379/0"]))
def test_any_password_quoted_into_a_url_is_found_and_never_printed(password, form):
    url = form.format(pw=quote(password, safe=""))
    assert holds_password(url)
    assert redact(url) == form.format(pw="***")


def test_redact_takes_a_list_of_failover_urls():
    assert redact(["redis://:s3cret@a/0", "redis://b/0?password=s3cret"]) == \
        "redis://:***@a/0;redis://b/0?password=***"


def test_sentinel_url_gives_the_sentinels_and_the_masters_options():
    nodes, master = sentinel_nodes("sentinel://:pw@a:26380;sentinel://b/2?ssl_cert_reqs=none")
    assert nodes == [("a", 26380), ("b", 26379)]
    assert master == {"password": "pw", "db": 2, "ssl_cert_reqs": "none"}


def test_sentinel_url_parts_that_disagree_are_refused():
    with pytest.raises(ConfigurationError, match="two values of 'db'"):
        sentinel_nodes("sentinel://a/1;sentinel://b/2")


def test_tls_options_map_to_redis_py_as_kombu_passes_broker_use_ssl():
    assert ssl_options({"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/ca"}) == {
        "ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/ca"}
    assert ssl_options({"ssl_cert_reqs": "CERT_NONE"}) == {"ssl_cert_reqs": "none"}
    assert ssl_options(None) is None
    with pytest.raises(ConfigurationError, match="ssl_cert_reqs"):
        ssl_options({"cert_reqs": ssl.CERT_REQUIRED})


def app(broker: str, **conf) -> Celery:
    celery = Celery("conn", broker=broker, set_as_current=False)
    celery.conf.update(**conf)
    return celery


def test_a_store_on_the_broker_url_inherits_broker_use_ssl_and_sentinel_options():
    tls = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/ca.crt"}
    config = DelayQConfig.from_app(app(
        "sentinel://s1:26379;sentinel://s2:26379/0", broker_use_ssl=tls,
        broker_transport_options={"master_name": "mymaster", "visibility_timeout": 60}))
    assert config.redis_ssl == tls
    assert config.redis_transport_options == {"master_name": "mymaster"}


def test_a_store_with_its_own_url_ignores_the_brokers_tls_options():
    config = DelayQConfig.from_app(app("rediss://broker/0", broker_use_ssl={"ssl_ca_certs": "x"},
                                       delayq_redis_url="redis://store/0"))
    assert config.redis_ssl is None


def test_a_sentinel_store_without_master_name_says_how_to_set_it():
    with pytest.raises(ConfigurationError, match="master_name"):
        DelayQConfig.from_app(app("redis://b/0", delayq_redis_url="sentinel://s1:26379/0"))


@pytest.mark.parametrize("url", [
    "redis://:Zm9vYmFy/c2VjcmV0@h:6379/0",  # redis-py: "Port could not be cast ... 'Zm9vYmFy'"
    "redis://user:Zm9vYmFy/c2VjcmV0@h:6379/0",
    "redis://:1234/c2VjcmV0@h:6379/0",  # redis-py: port 1234 on localhost, no password
    "redis://:Zm9v?YmFy@h:6379/0",
    "redis://:Zm9v[YmFy@h:6379/0",
    "redis+cluster://:Zm9vYmFy/c2VjcmV0@h:7000",
    "sentinel://:Zm9vYmFy/c2VjcmV0@s1:26379;sentinel://s2:26379/0",
])
def test_a_url_with_a_password_left_unencoded_is_refused_without_printing_it(url):
    """A base64 password (Azure Cache keys hold ``/``) put in the URL as it is: refused as
    the store's configuration, its text nowhere in the message, which says how to fix it."""
    with pytest.raises(ConfigurationError, match="percent-encode") as refused:
        DelayQConfig.from_app(app("memory://", delayq_redis_url=url,
                                  delayq_redis_transport_options={"master_name": "m"}))
    assert not {"Zm9v", "YmFy", "c2Vj", "1234"} & set(_words(str(refused.value)))


@pytest.mark.parametrize(("url", "says"), [
    ("redis://127.0.0.1:6391/0?socket_timeout=abc", "Invalid value for .socket_timeout."),
    ("redis://:Zm9vYmFy@h:99999/0", "Port out of range"),
])
def test_a_url_unreadable_past_its_userinfo_says_what_is_wrong_not_to_encode_a_password(
        url, says):
    with pytest.raises(ConfigurationError, match=says) as refused:
        DelayQConfig.from_app(app("memory://", delayq_redis_url=url))
    assert "percent-encode" not in str(refused.value)
    assert "Zm9v" not in str(refused.value) and "fix" in str(refused.value)


def _words(text: str) -> list[str]:
    """Every 4-character piece of ``text``."""
    return [text[i:i + 4] for i in range(len(text) - 3)]


_URL_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1)


@settings(max_examples=examples(300), deadline=None)
@given(password=_URL_TEXT,
       form=st.sampled_from(["redis://:{pw}@host:6379/0", "redis://user:{pw}@host:6379/0",
                             "rediss://:{pw}@host/0"]))
def test_a_password_in_the_url_is_read_as_written_or_refused(password, form):
    """Never read as some other server or password: what redis-py reads is the password
    as the URL spells it (percent-decoded) on the host it names, or the URL is refused."""
    url = form.format(pw=password)
    try:
        config = DelayQConfig.from_app(app("memory://", delayq_redis_url=url))
    except ConfigurationError as refused:
        assert "percent-encode" in str(refused)
        return
    read = parse_url(config.redis_url)
    assert (read.get("host"), read.get("password")) == ("host", unquote(password) or None)


@pytest.mark.parametrize("name", ["p%61ssword", "%70assword"])
def test_a_password_under_a_percent_encoded_query_name_is_found_and_never_printed(name):
    """redis-py decodes query names, so ``?p%61ssword=`` authenticates as ``?password=``."""
    url = f"redis://h:6379/0?{name}=s3cret"
    assert parse_url(url)["password"] == "s3cret"
    assert holds_password(url)
    assert redact(url) == f"redis://h:6379/0?{name}=***"


@settings(max_examples=examples(400))
@given(st.lists(st.one_of(st.text(), st.binary(), st.integers(), st.floats(allow_nan=False),
                          st.sampled_from(["\udcff", "id-\udc80", 1e16, -0.0, 2**64])),
                min_size=1, max_size=30))
def test_a_script_call_is_sent_as_the_bytes_redis_py_packs(args):
    """The store's client packs its script calls with hiredis in one C call: the same bytes
    redis-py's own packing sends, surrogate-escaped ids (read back from bytes) included."""
    connection = Connection(encoding_errors="surrogateescape")
    command = ("EVALSHA", "0" * 40, 0, *args)
    assert b"".join(packed(connection, command)) == b"".join(
        connection.pack_command(*command))
