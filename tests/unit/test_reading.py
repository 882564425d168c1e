"""How reading.py words values for people (counts and durations) and reads ISO times."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest

from celery_delayq.reading import (
    FORBIDDEN,
    Unreadable,
    count_of,
    counted,
    elapsed,
    iso_time,
    shown,
)


@pytest.mark.parametrize(("ms", "text"), [
    (0, "0.0 ms"), (3.25, "3.2 ms"), (999.9, "999.9 ms"), (1_500, "1.5 s"),
    (59_940, "59.9 s"), (90_000, "1.5 min"), (5_400_000, "1.5 h"),
    (28_434_775_300, "329.1 d"), (-2_000, "-2.0 s"),
])
def test_a_duration_is_worded_in_the_unit_that_reads_best(ms, text):
    """A job scheduled with an eta years past is promoted at once; the carrier's log says
    '329.1 d' late, not '28434775300.0 ms'."""
    assert elapsed(ms) == text


def test_counts_are_singular_for_one():
    assert (counted(1, "job"), counted(2, "job"), counted(0, "job")) == ("1 job", "2 jobs",
                                                                          "0 jobs")


@pytest.mark.parametrize(("text", "count"), [
    ("0", 0), ("42", 42), ("-7", -7), ("9223372036854775807", 2**63 - 1),
    ("-9223372036854775808", -2**63), ("9223372036854775808", None), ("007", None),
    ("-0", None), ("+5", None), ("--5", None), ("1.5", None), (" 5", None), ("٣", None),
    ("", None), ("abc", None),
])
def test_a_count_reads_as_redis_adds_to_it(text, count):
    assert count_of(text) == count


@pytest.mark.parametrize("text", ["2030-01-31T08:00:00Z", "2030-01-31T08:00:00.000Z",
                                  "2030-01-31T08:00:00z", "2030-01-31T09:00:00+01:00"])
def test_iso_times_with_z_read_as_utc_on_every_python(text):
    """JavaScript's toISOString writes "Z", which Python 3.10's fromisoformat refuses."""
    assert iso_time(text) == datetime(2030, 1, 31, 8, tzinfo=timezone.utc)


def test_iso_times_without_an_offset_stay_naive_and_others_are_refused():
    assert iso_time("2030-01-31 08:00") == datetime(2030, 1, 31, 8)
    assert iso_time("2030-01-31T08:00:00-05:30").utcoffset() == -timedelta(hours=5, minutes=30)
    for text in ("Z", "next tuesday", "2030-13-01", ""):
        with pytest.raises(ValueError):
            iso_time(text)


@pytest.mark.parametrize(("stored", "text"), [
    ("reports.daily\x1b]0;owned\x07", "reports.daily\\x1b]0;owned\\x07"),
    ("tenant-acme\r\nforged", "tenant-acme\\x0d\\x0aforged"),
    ("order:\x9b2J\x85", "order:\\x9b2J\\x85"),
    ("order:1\u2028x\u2029", "order:1\\u2028x\\u2029"),
    ("order:\u202egnp.exe\u2066\u061c", "order:\\u202egnp.exe\\u2066\\u061c"),
    ("not utf-8: \udcff\udc9b", "not utf-8: \\xff\\x9b"),  # bytes as read from Redis
    ("Müller 注文 \xa0 \U0001f600 \\ tab", "Müller 注文 \xa0 \U0001f600 \\ tab"),
])
def test_shown_escapes_what_could_move_colour_or_forge_a_terminal_line(stored, text):
    assert shown(stored) == text


def test_nothing_shown_holds_a_character_no_name_may_hold():
    everything = "".join(map(chr, range(0x3000)))
    assert FORBIDDEN.search(shown(everything)) is None
    escaped = 65 + 1 + 2 + 2 + 5 + 4  # C0, DEL, C1; U+061C, U+200E-F, U+2028-9, U+202A-E, U+2066-9
    assert shown(everything.replace("\\", "")).count("\\") == escaped


def test_a_reader_logs_what_it_skipped_escaped(caplog):
    """``delayq ls`` logs the entries it skips on stderr: their text is stored text."""
    skipped = Unreadable("pending jobs", logging.getLogger("celery_delayq.test"))
    skipped.add("job 'x' on shard 1", "task reports.\x1b]0;owned\x07\r\nforged")
    with caplog.at_level(logging.WARNING):
        skipped.log()
    assert "reports.\\x1b]0;owned\\x07\\x0d\\x0aforged" in caplog.text
