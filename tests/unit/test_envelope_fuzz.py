"""Fuzzing: whatever a stored envelope holds, reading it raises PayloadError or nothing.

The carrier dead-letters a job on PayloadError and serves the others; any other exception
(RecursionError, UnicodeEncodeError, AttributeError from deep inside Celery ...) would stop
promotion for every job. So ``split``, ``decode_fields``, ``decode_arguments``, ``decode``
and ``MessageBuilder.build`` are fed arbitrary text and bytes: invalid UTF-8, lone
surrogates, nesting far deeper than the recursion limit, numbers too big for Python's int
parser, NaN / Infinity tokens, fields of every JSON type, kombu's ``__type__`` objects.
"""

from __future__ import annotations

import contextlib
import functools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_delayq import decoding
from celery_delayq.errors import PayloadError
from celery_delayq.message import MessageBuilder
from tests.conftest import examples

FUZZ = settings(max_examples=examples(200), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

#: Any code point, lone surrogates included, with the troublesome ones drawn often.
ANY_CHAR = st.sampled_from(["\ud800", "\udfff", "\x00", "\n", '"', "\\", "\u2028", "\x85",
                            "\ufeff", "\U0001f642"]) | st.characters(exclude_categories=())
TEXT = st.lists(ANY_CHAR, max_size=40).map("".join)  # st.text would spread the odd ones thin
#: Tokens Python's json accepts (NaN, Infinity) or chokes on (ints over 4,300 digits).
ODD_NUMBERS = st.sampled_from([
    "NaN", "-NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999", "-0", "0e0",
    "1" * 4301, "-" + "9" * 10_000, "1." + "0" * 5000, "1" * 400 + "e" + "9" * 400,
])
LEAVES = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**64)
          | st.floats() | TEXT)
#: kombu's JSON object for a datetime, UUID, Decimal ..., its value of any type.
KOMBU_TYPES = st.sampled_from(["datetime", "date", "time", "decimal", "uuid", "bytes",
                               "base64", "set", "no such type"]) | TEXT
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4)
    | st.fixed_dictionaries({"__type__": KOMBU_TYPES, "__value__": inner}),
    max_leaves=24)
#: Option names create_task_message takes, and headers / properties the builder merges.
OPTION_NAMES = st.sampled_from([
    "expires", "group_id", "group_index", "retries", "chord", "callbacks", "errbacks",
    "time_limit", "soft_time_limit", "root_id", "parent_id", "shadow", "chain",
    "ignore_result", "replaced_task_nesting", "reply_to", "origin", "stamped_headers",
    "eta", "countdown", "task_id", "argsrepr", "headers",
]) | TEXT
FIELDS = st.fixed_dictionaries(
    {"t": st.sampled_from(["unit.plain", "unit.routed"]) | VALUES},
    optional={
        "i": VALUES, "y": VALUES, "q": st.sampled_from(["celery", "refunds", "nowhere"]) | VALUES,
        "x": VALUES, "r": VALUES, "a": VALUES, "k": VALUES,
        "o": st.dictionaries(OPTION_NAMES, VALUES, max_size=4) | VALUES,
        "h": st.dictionaries(TEXT, VALUES, max_size=3) | VALUES,
        "p": st.dictionaries(st.sampled_from(["priority", "content_type", "expiration"]) | TEXT,
                             VALUES, max_size=3) | VALUES,
    })


#: (opener, closer) pairs; a first line's "o" field nested deep, too.
NESTS = [("[", "]"), ('{"a":', "}"), ('[{"b":', "}]"), ('{"t":"unit.plain","o":{"x":', "}}")]


def deep(depth: int, nest: tuple[str, str], inner: str, closed: bool) -> str:
    """JSON nested ``depth`` levels (unterminated unless ``closed``)."""
    opener, closer = nest
    return opener * depth + inner + (closer * depth if closed else "")


DEEP = st.builds(deep, st.integers(0, 30_000), st.sampled_from(NESTS),
                 st.sampled_from(["1", "[]", '"x"', "null", "NaN"]), st.booleans())


def dumps(value, ascii_only: bool) -> str:
    return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True, separators=(",", ":"))


JSON_TEXT = st.builds(dumps, VALUES | FIELDS, st.booleans())
LINE = JSON_TEXT | st.builds(dumps, FIELDS, st.booleans()) | ODD_NUMBERS | DEEP | TEXT
#: A stored envelope as text: one to four lines, any of them broken.
ENVELOPE_TEXT = st.lists(LINE, min_size=1, max_size=4).map("\n".join) | TEXT


def mangle(text: str, garbage: list[tuple[int, bytes]]) -> bytes:
    """The text as bytes, lone surrogates kept as such, with invalid UTF-8 spliced in."""
    data = text.encode("utf-8", "surrogatepass")
    for at, bad in garbage:
        at %= len(data) + 1
        data = data[:at] + bad + data[at:]
    return data


INVALID_UTF8 = st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                                b"\xc0\xaf", b"\x80"]) | st.binary(min_size=1, max_size=4)
ENVELOPE_BYTES = st.builds(mangle, ENVELOPE_TEXT,
                           st.lists(st.tuples(st.integers(0, 10_000), INVALID_UTF8),
                                    max_size=3)) | st.binary(max_size=200)
RAW = st.none() | ENVELOPE_TEXT | ENVELOPE_BYTES


def only_payload_errors(read, *args, **kwargs) -> None:
    with contextlib.suppress(PayloadError):
        read(*args, **kwargs)


@functools.cache
def builder_of(app) -> MessageBuilder:
    """One builder per app, as a carrier keeps one: its shape cache is fuzzed too."""
    return MessageBuilder(app)


#: Envelopes the fuzzers found (or the issue reported) that raised something else.
FOUND = [
    "[" * 100_000,
    '{"t":"unit.plain"}\n' + "[" * 985 + "]" * 985,
    '{"t":"unit.plain"}\n["\ud800"]',
    b'{"t":"unit.plain"}\n["\xff"]',
    '{"t":"unit.plain"}\n[' + "1" * 5000 + "]",
    '{"t":"unit.plain"}\n[NaN,Infinity,-Infinity]',
    '{"t":"unit.plain","o":{"expires":[1]}}',
    '{"t":"unit.plain","o":{"eta":5}}',
    '{"t":"unit.plain","o":{"stamped_headers":"x"}}',
    '{"t":"unit.plain","o":{"countdown":1e308}}',
    '{"t":"unit.plain","o":{"expires":1e308}}',
    '{"t":"unit.plain","o":{"callbacks":NaN}}',
]


@pytest.mark.parametrize("raw", FOUND, ids=lambda raw: repr(raw)[:40])
def test_envelopes_found_by_fuzzing_raise_nothing_but_payload_error(app, raw):
    only_payload_errors(decoding.decode, raw)
    only_payload_errors(MessageBuilder(app).build, "job", raw, shard=0, due_ms=0)


@FUZZ
@given(raw=RAW)
def test_decode_raises_nothing_but_payload_error(raw):
    only_payload_errors(decoding.decode, raw)
    try:
        line, args, kwargs = decoding.split(raw)
    except PayloadError:
        return
    only_payload_errors(decoding.decode_fields, line)
    only_payload_errors(decoding.decode_arguments, args, kwargs)


@FUZZ
@given(line=LINE, args=LINE, kwargs=LINE)
def test_decode_parts_raise_nothing_but_payload_error(line, args, kwargs):
    only_payload_errors(decoding.decode_fields, line)
    only_payload_errors(decoding.decode_arguments, args, kwargs)
    only_payload_errors(decoding.decode_arguments, args, "")


@FUZZ
@given(raw=RAW, job_id=TEXT, shard=st.integers(0, 64), due_ms=st.integers(-2**63, 2**63))
def test_message_build_raises_nothing_but_payload_error(app, raw, job_id, shard, due_ms):
    only_payload_errors(builder_of(app).build, job_id, raw, shard=shard, due_ms=due_ms)


@FUZZ
@given(fields=FIELDS, args=VALUES, kwargs=VALUES, ascii_only=st.booleans())
def test_message_build_of_json_fields_raises_nothing_but_payload_error(
        app, fields, args, kwargs, ascii_only):
    """Well-formed JSON with every field of every type: the options reach Celery's own
    create_task_message, which must not fail in any other way."""
    raw = "\n".join([dumps(fields, ascii_only), dumps(args, ascii_only),
                     dumps(kwargs, ascii_only)])
    only_payload_errors(MessageBuilder(app).build, "job", raw, shard=0, due_ms=0)
