"""Fuzzing the carrier with planted data: whatever a due job holds, the others get through.

Each example empties the store, schedules healthy jobs due now, and plants, with raw Redis
commands through a bytes client, jobs Hypothesis makes up: envelopes of every JSON type in
every field, arguments that are not JSON, nested too deep, NaN, huge numbers, lone
surrogates, invalid UTF-8 (in the envelope and in the job id), a due entry with no
envelope; due scores of 0, negative, -inf, fractions. A few more are planted not due
(+inf, past the year 9999). Then a carrier (kombu and direct promotion) runs ``run_once``
until it has nothing left to do. Jobs go to the queue ``parked``, which no worker consumes.

It must never raise; every healthy job is published exactly once; every planted job that
was due is published (once) or dead-lettered (listed by ``Store.dead()``), never both or
neither; those not due stay stored; and every message pushed is JSON a worker can decode.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from dataclasses import dataclass

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_delayq.keys import unpack_id
from tests.conftest import CLUSTER, PROMOTIONS, examples
from tests.faults.test_carrier_faults import PARKED, carry_until_quiet, schedule_due_now
from tests.unit.test_envelope_fuzz import (
    DEEP,
    LINE,
    ODD_NUMBERS,
    OPTION_NAMES,
    TEXT,
    VALUES,
    dumps,
    mangle,
)

pytestmark = pytest.mark.skipif(CLUSTER, reason="planted through a single-node bytes client")

HEALTHY = 30
TASK = "tests.proj.record"
NOT_DUE = [b"+inf", b"1e300", b"253402300800001"]  # past the year 9999, in ms

#: A queue for the first line: the parked one, or a value no queue has (never absent, "" or
#: None: those mean the default queue, which a session worker may consume).
QUEUES = st.just(PARKED) | VALUES.filter(lambda v: v and not isinstance(v, str))
FIRST_LINES = st.builds(
    dumps,
    st.fixed_dictionaries(
        {"t": st.just(TASK) | VALUES, "q": QUEUES},
        optional={"i": VALUES, "y": VALUES,
                  "o": st.dictionaries(OPTION_NAMES, VALUES, max_size=3) | VALUES,
                  "h": st.dictionaries(TEXT, VALUES, max_size=3) | VALUES,
                  "p": st.dictionaries(st.sampled_from(["priority", "expiration"]) | TEXT,
                                       VALUES, max_size=2) | VALUES}),
    st.booleans()) | st.builds(dumps, VALUES, st.booleans()) | TEXT | DEEP | ODD_NUMBERS
#: Args and kwargs lines Lua's cjson reads and Python's JSON refuses: numbers with a leading
#: zero, a raw control character in a string.
CJSON_ONLY = st.sampled_from(["[01]", "[1,-00]", '{"a":07}', '["a\tb"]', '{"\x01":1}'])
ARGUMENTS = st.builds(dumps, VALUES, st.booleans()) | LINE | CJSON_ONLY | st.just("")
ENVELOPES = st.builds(lambda *lines: "\n".join(lines), FIRST_LINES, ARGUMENTS, ARGUMENTS)
INVALID_UTF8 = st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"])
STORED = (st.builds(mangle, ENVELOPES, st.lists(st.tuples(st.integers(0, 10_000), INVALID_UTF8),
                                                max_size=2))
          | st.binary(max_size=64) | st.none())  # None: a due entry with no envelope
DUE_SCORES = st.sampled_from([b"0", b"-1", b"-1e300", b"-inf", b"0.5", b"1700000000000.75"])


@dataclass(frozen=True)
class Planted:
    job_id: bytes
    envelope: bytes | None
    score: bytes

    @property
    def visible_id(self) -> str | None:
        """The id messages and dead letters show, when the stored id is UTF-8."""
        try:
            return unpack_id(self.job_id.decode())
        except UnicodeDecodeError:
            return None


#: Envelopes the fuzzer found that stopped the carrier or reached a worker unreadable.
FOUND = {
    "key-json-escaped-lone-surrogate":
        b'{"t":"tests.proj.record","q":"parked","y":"\\ud800"}\n\n{}',
    "task-json-escaped-lone-surrogate": b'{"t":"\\ud800","q":"parked"}\n\n',
    "key-not-a-string": b'{"t":"tests.proj.record","q":"parked","y":[null]}\n\n',
    "kwargs-not-json": b'{"t":"tests.proj.record","q":"parked"}\n\n[1',
    "args-nan-kwargs-infinity": b'{"t":"tests.proj.record","q":"parked"}\nNaN\n-Infinity',
}


#: Stored ids that start with "~" as packed UUIDs do, but are none (and two that are).
TILDE_IDS = [b"~", b"~ab", b"~" + b"!" * 21, b"~" + b"A" * 22, b"~" + b"A" * 20 + b"\xff",
             b"~~!", b"~" + b"A" * 21, b"~" + b"_" * 21]
PLAIN = b'{"t":"tests.proj.record","q":"parked"}\n[1]\n'


def planted(n: int, suffix: str, envelope: bytes | None, score: bytes,
            start: str = "planted-") -> Planted:
    return Planted(f"{start}{n}-{suffix}".encode("utf-8", "surrogatepass"), envelope, score)


#: Ids start with "~" too, as packed ids do (keys.pack_id).
PLANTED = st.lists(st.tuples(TEXT, STORED, DUE_SCORES, st.sampled_from(["planted-", "~"])),
                   min_size=1, max_size=6).map(
    lambda jobs: [planted(n, *job) for n, job in enumerate(jobs)])


def message_job(raw: bytes) -> str:
    """The job id of a message as a worker reads it; fails when a worker could not."""
    message = json.loads(raw)
    body = message["body"]
    if message["properties"].get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, kwargs, embed = json.loads(body)
    assert isinstance(args, list) and isinstance(kwargs, dict) and isinstance(embed, dict)
    return message["headers"]["delayq_job"]


def carrier_handles(proj, jobs: list[Planted], waiting: list[Planted], direct: bool) -> None:
    """Plant ``jobs`` (due) and ``waiting`` (not due) beside healthy jobs on an empty store,
    run a carrier until it is quiet, and check what became of every job."""
    store = proj.delayq.store
    raw_client = redis.Redis.from_url(store.config.redis_url)  # writes bytes as they are
    raw_client.delete(PARKED, *raw_client.keys(f"{store.keys.prefix}:*"))
    healthy = schedule_due_now(proj, HEALTHY, prefix="ok")
    for n, job in enumerate(jobs + waiting):
        shard = store.keys.shard(n % store.keys.shards)
        if job.envelope is not None:
            raw_client.hset(shard.jobs, job.job_id, job.envelope)
        raw_client.execute_command("ZADD", shard.due, job.score, job.job_id)

    carry_until_quiet(proj.app, direct=direct)

    published = Counter(message_job(raw) for raw in raw_client.lrange(PARKED, 0, -1))
    dead = Counter(entry["job_id"] for entry in store.dead(limit=1000))
    raw_client.close()
    assert {job: published[job] for job in healthy} == dict.fromkeys(healthy, 1)
    assert not dead.keys() & healthy
    for job in jobs:
        if job.visible_id is not None:
            assert (published[job.visible_id], dead[job.visible_id]) in ((1, 0), (0, 1)), \
                f"{job} published {published[job.visible_id]}, dead {dead[job.visible_id]}"
    assert published.total() + dead.total() == len(healthy) + len(jobs), \
        "a planted job was neither published nor dead-lettered (or both)"
    rows = store.stats()
    assert sum(r["overdue"] for r in rows) == sum(r["inflight"] for r in rows) == 0
    assert sum(r["pending"] for r in rows) == len(waiting)


@pytest.mark.parametrize("promotion", PROMOTIONS)
@pytest.mark.parametrize("found", FOUND)
def test_envelopes_found_by_fuzzing_are_dead_lettered_or_published(
        proj, redis_client, found, promotion):
    carrier_handles(proj, [planted(0, found, FOUND[found], b"0")], [],
                    direct=promotion == "direct")


@pytest.mark.parametrize("promotion", PROMOTIONS)
def test_a_stored_id_that_only_looks_packed_is_published_as_it_is(proj, redis_client,
                                                                  promotion):
    carrier_handles(proj, [Planted(job_id, PLAIN, b"0") for job_id in TILDE_IDS], [],
                    direct=promotion == "direct")


@pytest.mark.parametrize("promotion", PROMOTIONS)
def test_planted_jobs_are_published_or_dead_lettered_and_never_stop_the_others(
        proj, redis_client, promotion):
    @settings(max_examples=examples(20), deadline=None, report_multiple_bugs=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(jobs=PLANTED, not_due=st.lists(st.tuples(STORED, st.sampled_from(NOT_DUE)),
                                          max_size=2))
    def fuzzed(jobs: list[Planted], not_due: list[tuple[bytes | None, bytes]]) -> None:
        waiting = [Planted(f"waiting-{n}".encode(), envelope, score)
                   for n, (envelope, score) in enumerate(not_due)]
        carrier_handles(proj, jobs, waiting, direct=promotion == "direct")

    fuzzed()
