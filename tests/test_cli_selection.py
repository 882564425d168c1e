"""What the CLI selects and refuses before it reads or writes: ``ls --dead`` filters,
``ls --task``, ``export --to ''``, ``rate-limit`` names; and what it prints for a store's
contents."""

from __future__ import annotations

import pytest

from tests.store.test_replay import make_dead
from tests.test_cli_interrupted import invoke


def test_ls_dead_lists_only_the_dead_letters_of_task_and_key(proj, delayq):
    make_dead(proj, delayq, ["rec-1", "rec-2"], "unknown queue")
    make_dead(proj, delayq, ["flaky-1"], "unknown queue", task=proj.flaky)
    listed = invoke(proj, "ls", "--dead", "--task", proj.flaky.name)
    assert listed.exit_code == 0
    assert [line.split()[0] for line in listed.output.splitlines()] == ["flaky-1"]
    listed = invoke(proj, "ls", "--dead", "--key", "no-such-key")
    assert (listed.exit_code, listed.output) == (0, "no dead letters\n")


def test_ls_dead_refuses_args_contains_saying_what_to_use(proj, delayq):
    listed = invoke(proj, "ls", "--dead", "--args-contains", "42")
    assert listed.exit_code == 2
    assert "--args-contains searches pending jobs only" in listed.output


def test_export_to_an_empty_path_is_refused_writing_nothing(proj, delayq, tmp_path,
                                                            monkeypatch):
    proj.record.apply_delayed(args=(1,), delay=600)
    monkeypatch.chdir(tmp_path)
    done = invoke(proj, "export", "--to", "", "--format", "jsonl")
    assert done.exit_code == 1
    assert "(--to) is empty: name the folder to export into" in done.output
    assert list(tmp_path.iterdir()) == []
    assert delayq.store.export_positions() == {}


def test_final_counts_have_thousands_separators():
    from celery_delayq.reading import counted

    assert (counted(57_499, "job"), counted(1, "job"), counted(999, "job")) == (
        "57,499 jobs", "1 job", "999 jobs")


def test_show_prints_non_ascii_as_it_is_and_forbidden_characters_escaped(proj, delayq):
    import json

    proj.record.apply_delayed(args=(["Zürich €", "\u202eforged"],), delay=600, job_id="zürich",
                              key="clé")
    shown = invoke(proj, "show", "zürich")
    assert shown.exit_code == 0, shown.output
    assert "Zürich €" in shown.output and '"clé"' in shown.output
    assert "\u202e" not in shown.output and "\\u202e" in shown.output
    assert json.loads(shown.output)["args"] == [["Zürich €", "\u202eforged"]]


def test_carrier_help_shows_each_default_once_without_doubled_brackets(proj):
    text = " ".join(invoke(proj, "carrier", "--help").output.split())
    assert "(app.conf." not in text
    assert "app.conf.delayq_claim_batch (built in: 500)" in text


def test_cancel_of_an_empty_key_says_the_key_is_empty_and_cancels_nothing(proj, delayq):
    proj.record.apply_delayed(args=(1,), delay=600, key="order:1")
    cancelled = invoke(proj, "cancel", "--key", "")
    assert cancelled.exit_code == 2
    assert "--key is empty: give the business key whose jobs to cancel" in cancelled.output
    assert len(delayq.pending()) == 1


@pytest.mark.parametrize("counts", ["lost", "zero"])
def test_ls_of_a_task_lists_its_jobs_whatever_the_counts_say(proj, delayq, redis_client,
                                                              counts):
    """The counts are what ``delayq check`` compares, an evicting Redis or a hand may lose
    them: a filter only narrows what ``ls`` lists."""
    for n in range(3):
        proj.record.apply_delayed(args=(n,), delay=600, job_id=f"rec-{n}")
    for shard in delayq.store.keys:
        if counts == "lost":
            redis_client.delete(shard.counts)
        else:
            redis_client.hset(shard.counts, proj.record.name, 0)
    listed = invoke(proj, "ls", "--task", proj.record.name)
    assert sorted(line.split()[1] for line in listed.output.splitlines()) == [
        "rec-0", "rec-1", "rec-2"]


@pytest.mark.parametrize("queue, says", [("", "needs a non-empty name"),
                                         ("a\tb", "holds U+0009")])
def test_rate_limit_of_an_empty_or_unprintable_queue_names_the_argument(proj, delayq,
                                                                         queue, says):
    done = invoke(proj, "rate-limit", queue, "1/s")
    said = done.output.replace(f" {queue!r}", "")
    assert done.exit_code == 2 and f"QUEUE {says}" in said and "queue=" not in said, said
    assert delayq.rate_limits() == {}
