"""Every Lua script documents its contract, and the registry enforces the key count."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from celery_delayq.keys import KEY_TYPES, Keyspace
from celery_delayq.scripts import SCRIPTS, SHARD_KEYS

#: A call of include/journal.lua's helpers, which take the journal's KEYS index.
_JOURNAL_CALL = r"\b(?:journal|journal_batch|trim_journal)\((\d+)"
_COUNT_CALL = r"\badd_count\((\d+)"  # include/counts.lua: the counts HASH KEYS[n]
_ANSWER_CALL = r"\banswer(?:ed)?\((\d+)"  # include/answer.lua: a call's own STRING KEYS[n]
_RELEASE_CALL = r"\bnote_release\((\d+)"  # include/releasing.lua: the releasing HASH KEYS[n]

EXPECTED = {"schedule", "claim_due", "ack", "unindex", "recover", "cancel", "reschedule", "dead",
            "own", "replay", "drop", "exists", "repair", "reserve", "pause", "limit", "release",
            "supersede", "worker_events", "export_forward"}


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
    used = {int(n) for n in [*re.findall(r"KEYS\[(\d+)\]", body),
                             *re.findall(_JOURNAL_CALL, body), *re.findall(_COUNT_CALL, body),
                             *re.findall(_ANSWER_CALL, body),
                             *re.findall(_RELEASE_CALL, body)]}
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
    with pytest.raises(TypeError, match="takes 5 keys"):
        SCRIPTS["recover"].call(None, ["a"], [])
    with pytest.raises(TypeError, match="takes 9\\+ keys"):
        SCRIPTS["claim_due"].call(None, ["a"], [])


# The type of key a command works on, by its name (generic commands: TYPE, DEL, PEXPIRE
# are left out).
_COMMAND_TYPES = {"Z": "zset", "H": "hash", "X": "stream"}
_STRING_COMMANDS = {"GET", "SET"}
NOT_SHARD_KEYS = {"reserve", "export_forward"}  # reservation keys; the store-wide positions


@pytest.mark.parametrize("name", sorted(EXPECTED - NOT_SHARD_KEYS))
def test_header_names_the_shard_keys_in_the_order_the_script_uses_them(name):
    """Script.keys_for builds KEYS from the header: each KEYS[i] line names a ShardKeys
    field, its type column is that key's type, and every use of KEYS[i] in the script (a
    command, damaged()'s type check, the journal helpers) is of that type."""
    script = SCRIPTS[name]
    assert script.shard_keys is not None and len(script.shard_keys) == script.numkeys
    assert set(script.shard_keys) <= SHARD_KEYS
    header, body = script.source.split("]]", 1)
    for n, field in enumerate(script.shard_keys, 1):
        line = re.search(rf"^KEYS\[{n}\]\s+{field}\s+(\w+)", header, re.M)
        assert line and line[1].lower() == KEY_TYPES[field], (n, field)

    def type_of(index: str) -> str | None:  # the key a KEYS index names, None past N
        n = int(index)
        return KEY_TYPES[script.shard_keys[n - 1]] if n <= script.numkeys else None

    uses = 0
    for command, index in re.findall(r"'([A-Z]+)', KEYS\[(\d+)\]", body):
        expected = "string" if command in _STRING_COMMANDS else _COMMAND_TYPES.get(command[0])
        if expected and type_of(index):
            assert type_of(index) == expected, (command, index)
            uses += 1
    for call in re.findall(r"damaged\(\{([^}]*)\}\)", body):
        for index, kind in re.findall(r"(\d+), '(\w+)'", call):
            assert type_of(index) == kind, ("damaged", index, kind)
            uses += 1
    for index in re.findall(_JOURNAL_CALL, body):
        assert type_of(index) == "stream", ("journal", index)
        uses += 1
    for index in re.findall(_COUNT_CALL, body):
        assert type_of(index) == "hash", ("add_count", index)
        uses += 1
    assert uses, "no use of its keys was checked"


def test_keys_for_builds_a_shards_keys_in_header_order_then_the_extra_ones():
    shard = Keyspace("delayq", 4).shard(3)
    assert SCRIPTS["recover"].keys_for(shard) == [
        "delayq:{3}:inflight", "delayq:{3}:due", "delayq:{3}:journal", "delayq:{3}:jobs",
        "delayq:{3}:bykey"]
    keys = SCRIPTS["claim_due"].keys_for(shard, "celery", "refunds")
    assert keys[:2] == ["delayq:{3}:due", "delayq:{3}:inflight"] and len(keys) == 11
    assert keys[-2:] == ["celery", "refunds"]
    with pytest.raises(TypeError, match="reserve takes no shard keys"):
        SCRIPTS["reserve"].keys_for(shard)


def _lua_files() -> dict[str, str]:
    """Each script's own text (includes not expanded), by script name."""
    folder = resources.files("celery_delayq.scripts")
    return {entry.name.split("-")[0]: entry.read_text() for entry in folder.iterdir()
            if entry.name.endswith(".lua")}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_script_that_journals_takes_the_maxlen_as_argv_1_and_uses_the_shared_snippets(name):
    """The journal XADD, Redis's clock in ms and the first-line decode are each written once,
    in scripts/include/; the journal maxlen is ARGV[1] of every script that journals."""
    text = _lua_files()[name]
    for snippet in ("'XADD'", "'XTRIM'", "'TIME'", "pcall(cjson.decode"):
        assert snippet not in text, f"{snippet}: use the include that has it"
    journals = "-- include: journal.lua" in text
    assert journals == ("journal" in (SCRIPTS[name].shard_keys or ()))
    if journals:
        assert re.search(r"^ARGV\[1\]\s+journal maxlen", text, re.M)
        assert re.search(_JOURNAL_CALL, text), "it includes the journal but never writes it"
