"""Every Lua script documents its contract, and the registry enforces the key count."""

from __future__ import annotations

import re

import pytest

from celery_delayq.scripts import SCRIPTS

EXPECTED = {"schedule", "claim_due", "ack", "recover", "cancel", "reschedule", "dead", "own",
            "replay", "exists", "repair", "reserve", "pause", "limit"}


def test_every_operation_has_a_script():
    assert set(SCRIPTS) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_header_documents_each_key_and_argument(name):
    script = SCRIPTS[name]
    header = script.source.split("]]", 1)[0]
    documented = [int(n) for n in re.findall(r"^KEYS\[(\d+)\]", header, re.M)]
    # a variadic script (name-N+) may document optional keys after its N
    assert documented[:script.numkeys] == list(range(1, script.numkeys + 1)), \
        "KEYS in header vs file name"
    assert script.variadic or len(documented) == script.numkeys
    body = script.source.split("]]", 1)[1]
    used = {int(n) for n in re.findall(r"KEYS\[(\d+)\]", body)}
    if "#KEYS" in body:  # it loops over all its keys
        assert used <= set(documented), "no key it does not declare"
    else:
        assert used == set(documented), "every declared key is used and no other"
    assert re.search(r"^ARGV\[1\]", header, re.M)
    assert "Returns" in header


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_scripts_never_build_key_names(name):
    body = SCRIPTS[name].source.split("]]", 1)[1]
    for call in re.findall(r"redis\.call\('(\w+)', ([^,)]+)", body):
        assert call[1].startswith("KEYS[") or call[0] in ("TIME", "PUBLISH"), call


def test_wrong_key_count_is_refused_before_redis_is_called():
    with pytest.raises(TypeError, match="takes 6 keys"):
        SCRIPTS["ack"].call(None, ["a"], [])
    with pytest.raises(TypeError, match="takes 9\\+ keys"):
        SCRIPTS["claim_due"].call(None, ["a"], [])
