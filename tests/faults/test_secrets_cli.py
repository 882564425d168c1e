"""The ``delayq`` commands not covered by tests/store/test_security.py (``check``,
``replay``, ``export``, a carrier starting on a failing store) never print the store's
password, in either URL form, whether the store is down or refuses the password.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess

import pytest

from celery_delayq.testing.redis_server import RedisServer, free_port
from tests.conftest import CLUSTER, ROOT, celery_cli, wait_for

PASSWORD, WRONG = "pw" + secrets.token_hex(8), "pw" + secrets.token_hex(8)
FORMS = ("redis://:{pw}@127.0.0.1:{port}/0", "redis://127.0.0.1:{port}/0?password={pw}")


@pytest.mark.skipif(CLUSTER, reason="the store URL here is a single Redis")
def test_check_replay_export_and_a_starting_carrier_never_print_the_password(
        redis_server, tmp_path):
    with RedisServer(extra=("--requirepass", PASSWORD)) as server:
        stores = [form.format(pw=pw, port=port) for form in FORMS
                  for pw, port in ((PASSWORD, free_port()), (WRONG, server.port))]
        runs = [(url, command) for url in stores for command in
                (["check"], ["replay", "j1"], ["export", "--to", str(tmp_path / "x")])]
        logs = [tmp_path / f"{n}.log" for n in range(len(runs) + 1)]
        processes = [_cli(url, redis_server.url, *command, log=log)
                     for (url, command), log in zip(runs, logs, strict=False)]
        carrier = _cli(stores[-1], redis_server.url, "carrier", "-l", "DEBUG", log=logs[-1])
        try:
            codes = [process.wait(60) for process in processes]
            wait_for(lambda: "WRONGPASS" in logs[-1].read_text() or "carrier paused"
                     in logs[-1].read_text(), timeout=30, what="the carrier to log the refusal")
        finally:
            carrier.send_signal(signal.SIGTERM)
            carrier.wait(30)
    printed = "".join(log.read_text() for log in logs)
    # (the CLI's own lines: redis-py 8.2's DEBUG log holds "error: " too)
    assert codes == [1] * len(runs) and len(re.findall("^error: ", printed, re.M)) == len(runs)
    assert printed.count("password=***") >= 6 and printed.count(":***@") >= 6
    assert PASSWORD not in printed and WRONG not in printed


def _cli(store_url: str, broker_url: str, *args: str, log) -> subprocess.Popen:
    env = dict(os.environ, DELAYQ_TEST_REDIS_URL=broker_url, DELAYQ_TEST_STORE_URL=store_url,
               PYTHONPATH=ROOT)
    with open(log, "w") as out:
        return subprocess.Popen(celery_cli("delayq", *args), cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
