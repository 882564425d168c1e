"""delayq_http_allowed_hosts is checked when it is configured, and a callback URL or header
that could never be sent is refused at the call, before anything is stored."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_delayq import DelayQ
from celery_delayq.conf import DelayQConfig
from celery_delayq.errors import ConfigurationError, DelayQError
from celery_delayq.http import TASK_NAME, CallbackRefused, check_url


def configured(*allowed: str) -> DelayQConfig:
    """The settings of a new app allowing ``allowed``, read (and checked) as on first use."""
    app = Celery("allow-list", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.delayq_http_allowed_hosts = list(allowed)
    return DelayQ(app).config


@pytest.mark.parametrize("entry, problem", [
    ("api.example.com:80a", "port"),
    ("api.example.com:99999", "port"),
    ("api.example.com:0", "port"),
    ("api.example.com:", "port"),
    ("https://api.example.com", "URL"),
    ("api.example.com/hooks", "URL"),
    ("api.*.example.com", "host"),
    ("*example.com", "host"),
    ("api..example.com", "host"),
    ("api example.com", "host"),
    ("[::1", "]"),
    ("[nothost]:80", "IPv6"),
    ("fe80::1::2", "IPv6"),
])
def test_an_invalid_allow_list_entry_is_refused_when_configured(entry, problem):
    with pytest.raises(ConfigurationError) as refused:
        configured("127.0.0.1", entry)
    message = str(refused.value)
    assert repr(entry) in message and problem in message
    assert "'api.example.com:8443'" in message  # the accepted forms


def test_every_documented_allow_list_form_is_accepted():
    config = configured("api.example.com", "API.example.com:8443", "*.example.com", "*",
                        "*:8443", "10.0.0.5:8080", "[::1]:8080", "::1", "my_service")
    assert config.http_allowed_hosts[1] == "api.example.com:8443"


@pytest.mark.parametrize("allowed, url, ok", [
    ("127.0.0.1:8443", "http://127.0.0.1:8443/hook", True),
    ("127.0.0.1:8443", "http://127.0.0.1/hook", False),
    ("127.0.0.1:8443", "https://127.0.0.1/hook", False),
    ("*.example.com", "https://a.b.example.com/hook", True),
    ("*.example.com", "https://example.com/hook", False),
    ("*.example.com", "https://badexample.com/hook", False),
    ("[::1]:8080", "http://[0:0::1]:8080/hook", True),
    ("::1", "http://[::1]:9/hook", True),
    ("*:8443", "https://anything.example:8443/", True),
    ("*:8443", "https://anything.example/", False),
    ("*.example.com", "https://xn--caf-dma.example.com/hook", True),
    ("my_service", "http://my_service/hook", True),
    ("*", "http://[fe80::1%25eth0]/hook", True),
])
def test_allow_list_entries_match_host_and_port(allowed, url, ok):
    allowed_hosts = configured(allowed).http_allowed_hosts
    if ok:
        assert check_url(url, allowed_hosts) == url
    else:
        with pytest.raises(CallbackRefused, match="not in delayq_http_allowed_hosts"):
            check_url(url, allowed_hosts)


@pytest.mark.parametrize("url, problem", [
    ("http://127.0.0.1:99999/hook", "port"),
    ("http://127.0.0.1:80a/hook", "port"),
    ("http://127.0.0.1:0/hook", "port"),
    ("http://127.0.0.1/a hook", "space or control character"),
    ("http://127.0.0.1/hook\r\nX-Injected: 1", "space or control character"),
    ("http://[::1/hook", "malformed"),
    ("http://127.0.0.1/café?token=s", "percent-encode"),
    ("http://127.0.0.1/hook?name=ü", "percent-encode"),
    ("https://café.example.com/hook", "xn--"),
    # urllib decodes %xx in a host: a proxy would be asked to CONNECT 169.254.169.254:80
    ("https://169.254.169.254%3a80%20HTTP%2f1.0%0d%0a%09x%5d%0d%0a%09.example.com/hook",
     "letters, digits"),
    ("https://169.254.169.254%2f.example.com/hook", "letters, digits"),
    ("https://a%2eexample.com/hook", "letters, digits"),
    ("https://[v1.a.example.com]/hook", "letters, digits"),
])
def test_a_url_that_could_never_be_called_is_refused_at_the_call(http_delayq, url, problem):
    task = http_delayq.app.tasks[TASK_NAME]
    with pytest.raises(CallbackRefused, match=problem) as refused:
        task.apply_delayed([url], delay=60)
    assert isinstance(refused.value, DelayQError)
    with pytest.raises(CallbackRefused, match=problem):
        task.apply_async([url], countdown=60)
    assert http_delayq.pending() == []


@pytest.mark.parametrize("headers", [
    {"X-A\r\nInjected": "1"},
    {"X A": "1"},
    {"": "1"},
    {"X-A": "1\r\nInjected: 1"},
    {"X-A": "\x00"},
    {"X-A": "€"},
    {"Host": "admin.internal.example:8080"},  # past the allow-list, to a vhost behind it
    {"content-length": "2"},  # a length other than the body's: request smuggling
    {"Transfer-Encoding": "chunked"},
    {"Connection": "close, X-Signature"},
    {"Proxy-Authorization": "Basic eA=="},
])
def test_a_header_that_could_never_be_sent_is_refused_at_the_call(http_delayq, headers):
    task = http_delayq.app.tasks[TASK_NAME]
    with pytest.raises(CallbackRefused, match="header"):
        task.apply_delayed(["http://127.0.0.1/hook"], {"headers": headers}, delay=60)
    assert http_delayq.pending() == []


def test_a_refusal_shows_no_url_secrets():
    app = Celery("allow-list", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.delayq_http_allowed_hosts = ["127.0.0.1"]
    DelayQ(app)
    task = app.tasks[TASK_NAME]
    for url in ("ftp://user:pw-secret@127.0.0.1/?password=q-secret",
                "http://127.0.0.1:99999/?token=q-secret",
                "http://10.0.0.9/hook?password=q-secret"):
        with pytest.raises(CallbackRefused) as refused:
            task.apply_delayed([url], delay=60)
        assert "secret" not in str(refused.value)


def test_a_batch_with_one_url_that_could_never_be_called_is_refused_whole(http_delayq):
    task = http_delayq.app.tasks[TASK_NAME]
    with pytest.raises(CallbackRefused, match="delayq_http_allowed_hosts"):
        task.apply_delayed_many([{"args": ["http://127.0.0.1/hook"], "delay": 60},
                                 {"args": ["http://169.254.169.254/latest"], "delay": 60}])
    assert http_delayq.pending() == []
