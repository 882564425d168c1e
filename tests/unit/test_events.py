"""Every journal event name the Lua scripts write is a member of ``events.Event``."""

from __future__ import annotations

import re
from pathlib import Path

import celery_delayq
from celery_delayq.events import Event

SCRIPTS = Path(celery_delayq.__file__).parent / "scripts"
#: A journal call: journal(n, <event>, ...) or journal_batch(n, <event>, ...), or a plain
#: XADD's 'event', <event>; <event> runs to the next comma outside parentheses.
_CALL = re.compile(r"\bjournal(?:_batch)?\(\s*\d+\s*,\s*|'event'\s*,\s*")
_LITERAL = re.compile(r"(==|~=)?\s*'([^']*)'")


def _event_expression(text: str, start: int) -> str:
    depth, end = 0, start
    while end < len(text) and not (depth == 0 and text[end] in ",)"):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    return text[start:end].strip()


def journaled_events() -> dict[str, set[str]]:
    """Script file -> the event names its journal calls write (literals of the event
    argument, leaving out values it is compared with, as in ``a == 'x' and 'y' or 'z'``)."""
    found: dict[str, set[str]] = {}
    for path in sorted(SCRIPTS.rglob("*.lua")):
        text = "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())
        for call in _CALL.finditer(text):
            expression = _event_expression(text, call.end())
            names = {name for compared, name in _LITERAL.findall(expression) if not compared}
            if expression == "event" and path.parent.name == "include":
                continue  # the include's own XADD, given the event by its caller
            assert names, f"{path.name}: a journal call whose event is not a literal: " \
                          f"{expression!r}; name it in the call so this test can check it"
            found.setdefault(path.name, set()).update(names)
    return found


def test_every_event_the_scripts_journal_is_a_member_of_the_enum():
    found = journaled_events()
    assert len(found) >= 8, found  # the scripts that journal were all read
    members = {event.value for event in Event}
    unknown = {script: names - members for script, names in found.items() if names - members}
    assert not unknown, f"journaled by scripts but missing from events.Event: {unknown}"


def test_the_reader_of_journal_calls_reads_each_form():
    text = ("journal(5, 'dead', 'job', j)\njournal_batch(4, code == 1 and 'scheduled' or "
            "'rescheduled', 'job', j)\nredis.call('XADD', KEYS[1], '*', 'event', 'paused')")
    events = set()
    for call in _CALL.finditer(text):
        expression = _event_expression(text, call.end())
        events |= {name for compared, name in _LITERAL.findall(expression) if not compared}
    assert events == {"dead", "scheduled", "rescheduled", "paused"}


def test_an_event_equals_and_prints_as_its_stored_text():
    assert Event.DEAD == "dead" and "dead" in {Event.DEAD}
    assert {"dead": 1}[Event.DEAD] == 1 and Event("dead") is Event.DEAD
    assert str(Event.DEAD) == f"{Event.DEAD}" == "dead"
