"""The delayed-task admin through Django's test client: list, detail, actions, permissions,
pause / resume and the banner while anything is paused."""

from __future__ import annotations

import logging
import re
import sys
from datetime import datetime
from datetime import timezone as dt_timezone
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone

from celery_delayq import DelayQ
from celery_delayq.contrib.django.models import DelayedTask, State
from celery_delayq.testing.redis_server import RedisServer
from tests.conftest import wait_for
from tests.hanging_up import HangingUp

pytestmark = pytest.mark.django_db(transaction=True)
CHANGELIST = "admin:delayq_delayedtask_changelist"
REFUND_CHECK, ORDER_TIMEOUT = "shop.tasks.check_refund_status", "shop.tasks.close_unpaid_order"
NOTHING_PAUSED = {"tasks": [], "queues": []}

#: The app the Django app works with when a test points settings.DELAYQ_CELERY_APP here.
project_app: Celery | None = None


@pytest.fixture
def pending(shop_delayq, sync):
    """Three mirrored pending jobs: two order timeouts and a refund check."""
    for n in (1, 2):
        shop_delayq.schedule("shop.tasks.close_unpaid_order", args=(n,), delay=1800,
                             key=f"order:{n}", job_id=f"order:{n}:close")
    shop_delayq.schedule("shop.tasks.check_refund_status", args=(3, 0), delay=600,
                         key="refund:3", job_id="refund:3:check:0")
    sync.run_once()
    return {row.job_id: row for row in DelayedTask.objects.all()}


def _act(client, action, *job_ids, **extra):
    pks = [DelayedTask.objects.get(job_id=j).pk for j in job_ids]
    return client.post(reverse(CHANGELIST), {"action": action, "_selected_action": pks,
                                             **extra}, follow=True)


def _messages(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def _staff(*perms: str) -> User:
    user = User.objects.create_user("support", password="unused-in-tests", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="delayq", codename__in=["view_delayedtask", *perms]))
    return user


def test_changelist_shows_task_key_relative_due_time_and_state(admin_client, pending):
    html = admin_client.get(reverse(CHANGELIST)).content.decode().replace("\xa0", " ")
    assert "close_unpaid_order" in html and "order:1" in html and "refund:3" in html
    assert "in 30 minutes" in html or "in 29 minutes" in html
    assert 'class="delayq-state"' in html and ">scheduled<" in html


def test_changelist_filters_by_task_and_searches_by_business_key(admin_client, pending):
    url = reverse(CHANGELIST)
    filtered = admin_client.get(url, {"task": "shop.tasks.check_refund_status"})
    assert [r.job_id for r in filtered.context["cl"].result_list] == ["refund:3:check:0"]
    searched = admin_client.get(url, {"q": "order:2"})
    assert [r.job_id for r in searched.context["cl"].result_list] == ["order:2:close"]
    by_state = admin_client.get(url, {"state__exact": "scheduled"})
    assert by_state.context["cl"].result_count == 3


def test_changelist_search_finds_a_task_by_its_arguments(
        admin_client, pending, shop_delayq, sync):
    shop_delayq.schedule("shop.tasks.check_refund_status", args=(777, 1), delay=600,
                         key="refund:9", job_id="refund:9:check:1")
    sync.run_once()
    searched = admin_client.get(reverse(CHANGELIST), {"q": "777"})
    found = searched.context["cl"].result_list
    assert "refund:9:check:1" in [r.job_id for r in found]
    # the box matches task ids too: a random UUID may hold "777" (the only other hits)
    assert all("777" in r.task_id for r in found if r.job_id != "refund:9:check:1")


def test_detail_page_is_read_only_with_pretty_args_and_the_event_timeline(
        admin_client, pending):
    row = pending["refund:3:check:0"]
    response = admin_client.get(reverse("admin:delayq_delayedtask_change", args=[row.pk]))
    html = response.content.decode()
    assert response.status_code == 200
    assert "<pre" in html and "3,\n  0" in html  # args as indented JSON
    assert 'class="delayq-timeline"' in html and "scheduled" in html
    assert 'name="_save"' not in html, "the detail page must be read-only"


def test_cancel_action_cancels_pending_jobs_and_says_what_happened_to_each(
        admin_client, pending, shop_delayq):
    DelayedTask.objects.filter(job_id="order:2:close").update(state="started")
    response = _act(admin_client, "cancel_tasks", "order:1:close", "order:2:close")
    assert "cancelled: 1 task (order:1:close)" in _messages(response)
    assert "too late: already running: 1 task (order:2:close)" in _messages(response)
    assert shop_delayq.get("order:1:close") is None
    row = DelayedTask.objects.get(job_id="order:1:close")
    assert (row.state, row.cancelled_by) == ("cancelled", "admin in the Django admin")


def test_cancel_reports_too_late_when_the_carrier_already_holds_the_job(
        admin_client, pending, shop_delayq):
    shop_delayq.run_now("order:1:close")
    # a carrier has claimed it and is publishing it
    shop_delayq.store.claim(list(shop_delayq.store.keys), batch=10, lease_ms=60_000)
    response = _act(admin_client, "cancel_tasks", "order:1:close")
    assert _messages(response) == ["too late: already promoted: 1 task (order:1:close)"]
    assert DelayedTask.objects.get(job_id="order:1:close").state == "scheduled"


def test_run_now_action_makes_the_job_due_now(admin_client, pending, shop_delayq):
    before = shop_delayq.get("order:1:close").due
    response = _act(admin_client, "run_now", "order:1:close")
    assert _messages(response) == ["due now: 1 task (order:1:close)"]
    assert (before - shop_delayq.get("order:1:close").due).total_seconds() > 1700


@pytest.fixture
def dead(pending, shop_delayq, sync):
    """The pending jobs made due and dead-lettered, as a carrier does, and mirrored."""
    store = shop_delayq.store
    for job_id in pending:
        shop_delayq.run_now(job_id)
    for claim in store.claim(list(store.keys), 100, 60_000):
        for job in claim.jobs:
            store.dead_letter(claim.shard, job, "unknown queue: gone")
    sync.run_once()
    assert set(DelayedTask.objects.values_list("state", flat=True)) == {"dead"}
    return pending


def test_replay_and_drop_actions_settle_dead_letters_and_say_what_happened(
        admin_client, dead, shop_delayq, sync):
    response = _act(admin_client, "replay_tasks", "order:1:close")
    assert _messages(response) == ["replayed: due now: 1 task (order:1:close)"]
    assert shop_delayq.get("order:1:close").due is not None
    response = _act(admin_client, "drop_tasks", "order:2:close", "order:1:close")
    assert "dropped: 1 task (order:2:close)" in _messages(response)
    assert "not dead-lettered: 1 task (order:1:close)" in _messages(response)
    assert [d["job_id"] for d in shop_delayq.store.dead()] == ["refund:3:check:0"]
    sync.run_once()  # the journal agrees with what the actions wrote
    rows = {row.job_id: row for row in DelayedTask.objects.all()}
    assert (rows["order:1:close"].state, rows["order:2:close"].state) == (
        "scheduled", "cancelled")
    assert rows["order:2:close"].cancelled_by == (
        "admin in the Django admin: dropped dead letter")


def test_a_replay_leaves_a_row_the_journal_moved_on_meanwhile(
        admin_client, dead, shop_delayq, monkeypatch):
    """The replayed job may run before the action writes its row (a sync pass mirroring
    it first): the row said "scheduled" for good, and ``delayq_reconcile --missing``
    then wrote the job again, which ran twice."""
    store_type = type(shop_delayq.store)
    replay = store_type.replay

    def replay_then_mirrored(self, *args, **kwargs):
        replayed = replay(self, *args, **kwargs)
        DelayedTask.objects.filter(job_id="order:1:close").update(state="succeeded")
        return replayed

    monkeypatch.setattr(store_type, "replay", replay_then_mirrored)
    response = _act(admin_client, "replay_tasks", "order:1:close")

    assert _messages(response) == ["replayed: due now: 1 task (order:1:close)"]
    assert DelayedTask.objects.get(job_id="order:1:close").state == "succeeded"


@pytest.mark.parametrize("state", [s for s in State if s != State.SCHEDULED])
@pytest.mark.parametrize("action", ["cancel_tasks", "run_now"])
def test_an_action_on_a_row_that_is_not_pending_says_why_it_did_nothing(
        admin_client, pending, shop_delayq, state, action):
    """Every state has its reason ("ignored", added later, raised a KeyError: a 500 after
    the selection's earlier rows were acted on)."""
    DelayedTask.objects.filter(job_id="order:2:close").update(state=state)
    response = _act(admin_client, action, "order:1:close", "order:2:close")

    assert response.status_code == 200
    said = " | ".join(_messages(response))
    assert "1 task (order:1:close)" in said and ": 1 task (order:2:close)" in said
    assert shop_delayq.get("order:2:close") is not None


def test_each_row_an_action_changed_says_who_did_what_in_its_history(admin_client, pending):
    """Only a cancel's journal entry said who; a run now or a reschedule left no trace."""
    _act(admin_client, "run_now", "order:1:close")
    _act(admin_client, "reschedule_tasks", "order:2:close", apply="Reschedule",
         delay_minutes="5")
    _act(admin_client, "cancel_tasks", "order:1:close", "refund:3:check:0")

    history = [(entry.user.get_username(), entry.object_id, entry.get_change_message())
               for entry in LogEntry.objects.order_by("pk")]
    pk = {row.job_id: str(row.pk) for row in pending.values()}
    assert history[0] == ("admin", pk["order:1:close"], "due now")
    assert history[1][:2] == ("admin", pk["order:2:close"])
    assert history[1][2].startswith("due 20")
    assert sorted(history[2:]) == sorted([("admin", pk["order:1:close"], "cancelled"),
                                          ("admin", pk["refund:3:check:0"], "cancelled")])


def test_dead_letter_actions_need_the_run_now_and_cancel_permissions(client, dead):
    client.force_login(_staff("run_now_delayedtask"))
    choices = [c[0] for c in client.get(reverse(CHANGELIST)).context["action_form"]
               .fields["action"].choices]
    assert "replay_tasks" in choices and "drop_tasks" not in choices
    _act(client, "drop_tasks", "order:1:close")
    assert DelayedTask.objects.get(job_id="order:1:close").state == "dead"


def test_reschedule_action_asks_for_a_new_time_then_moves_the_due_time(
        admin_client, pending, shop_delayq):
    form = _act(admin_client, "reschedule_tasks", "order:1:close", "order:2:close")
    assert b"Delay from now (minutes)" in form.content
    assert shop_delayq.get("order:1:close").due == pending["order:1:close"].due

    done = _act(admin_client, "reschedule_tasks", "order:1:close", "order:2:close",
                apply="Reschedule", delay_minutes="120")
    [message] = _messages(done)
    assert message.startswith("due ") and "2 tasks" in message
    for job_id in ("order:1:close", "order:2:close"):
        moved = shop_delayq.get(job_id).due - pending[job_id].due
        assert 89 * 60 < moved.total_seconds() < 91 * 60
        assert DelayedTask.objects.get(job_id=job_id).due == shop_delayq.get(job_id).due


def test_reschedule_by_delay_gives_every_selected_task_the_same_due_time(
        admin_client, pending, shop_delayq):
    job_ids = ("order:1:close", "order:2:close", "refund:3:check:0")
    done = _act(admin_client, "reschedule_tasks", *job_ids, apply="Reschedule",
                delay_minutes="45")
    assert len(_messages(done)) == 1, _messages(done)
    assert len({shop_delayq.get(job_id).due for job_id in job_ids}) == 1


def test_reschedule_form_refuses_both_a_delay_and_a_date(admin_client, pending):
    response = _act(admin_client, "reschedule_tasks", "order:1:close", apply="Reschedule",
                    delay_minutes="5", due_at="2030-01-01 10:00")
    assert b"Give either a delay or a date and time, not both." in response.content


def test_reschedule_form_shows_each_tasks_current_due_time(admin_client, pending):
    form = _act(admin_client, "reschedule_tasks", "order:1:close")
    due = pending["order:1:close"].due
    assert f"now due {due:%Y-%m-%d %H:%M:%S} UTC" in form.content.decode()


def test_reschedule_form_asks_for_a_time_when_given_none(admin_client, pending):
    response = _act(admin_client, "reschedule_tasks", "order:1:close", apply="Reschedule")
    assert b"Give a delay in minutes or a date and time." in response.content


def test_reschedule_form_refuses_a_time_that_has_passed(admin_client, pending, shop_delayq):
    response = _act(admin_client, "reschedule_tasks", "order:1:close", apply="Reschedule",
                    due_at="2020-01-01 10:00")
    assert b"2020-01-01 10:00 has passed; give a later time, or use" in response.content
    assert shop_delayq.get("order:1:close").due == pending["order:1:close"].due


def test_reschedule_form_refuses_a_delay_past_any_date(admin_client, pending, shop_delayq):
    response = _act(admin_client, "reschedule_tasks", "order:1:close", apply="Reschedule",
                    delay_minutes="1e12")
    assert response.status_code == 200
    assert b"More than 527,040 minutes ahead" in response.content
    assert shop_delayq.get("order:1:close").due == pending["order:1:close"].due


@pytest.mark.parametrize("given", [
    {"due_at": f"{datetime.now(dt_timezone.utc).year + 2}-06-01 09:00"},
    {"delay_minutes": str(400 * 24 * 60)}], ids=["date", "delay"])
def test_reschedule_form_refuses_a_time_past_delayq_max_delay_naming_the_limit(
        admin_client, pending, shop_delayq, given):
    """The store takes due times up to the app's ``delayq_max_delay`` ahead (366 days by
    default): the form says so, rather than each row fail."""
    response = _act(admin_client, "reschedule_tasks", "order:1:close", apply="Reschedule",
                    **given)
    [field] = given
    assert response.context["form"].errors[field] == [
        "More than 527,040 minutes ahead: delayq_max_delay is 31,622,400 s "
        "(CELERY_DELAYQ_MAX_DELAY in this app's settings). Give an earlier time."]
    assert shop_delayq.get("order:1:close").due == pending["order:1:close"].due


def test_a_time_the_store_refuses_after_the_form_is_a_warning_and_a_message(
        admin_client, pending, shop_delayq, monkeypatch, caplog):
    """What a user gave is no server error: logged at WARNING, without a traceback."""
    from django import forms

    from celery_delayq.contrib.django.admin import RescheduleForm

    monkeypatch.setattr(RescheduleForm, "clean", forms.Form.clean)  # lets any time through
    with caplog.at_level(logging.INFO, logger="celery_delayq"):
        response = _act(admin_client, "reschedule_tasks", "order:1:close", apply="Reschedule",
                        due_at="9000-01-01 00:00")
    [message] = _messages(response)
    assert message.startswith("error: eta 9000-01-01") and "delayq_max_delay" in message
    assert message.endswith(": 1 task (order:1:close)")
    [record] = [r for r in caplog.records if "order:1:close" in r.getMessage()]
    assert (record.levelno, record.exc_info) == (logging.WARNING, None)
    assert shop_delayq.get("order:1:close").due == pending["order:1:close"].due


def test_reschedule_form_says_a_setting_the_store_refuses_as_its_error(
        shop_app, shop_delayq, monkeypatch):
    """The form reads ``delayq_max_delay``: a setting refused there was a server error."""
    from celery_delayq.contrib.django.admin import RescheduleForm

    for name in ("CELERY_DELAYQ_SHARDS", "delayq_shards"):  # (either, by Celery release)
        monkeypatch.setitem(shop_app.conf.changes, name, 5000)
    shop_delayq.__dict__.pop("config", None)  # read again
    try:
        form = RescheduleForm(data={"delay_minutes": "30"})
        assert not form.is_valid()
        assert "delayq_shards must be at most" in str(form.errors)
    finally:
        monkeypatch.undo()
        shop_delayq.__dict__.pop("config", None)


def test_staff_without_action_permissions_sees_tasks_but_cannot_act(
        client, pending, shop_delayq):
    client.force_login(_staff())
    response = client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert response.context["cl"].result_count == 3
    assert 'name="action"' not in response.content.decode(), "no actions offered"
    for action in ("cancel_tasks", "run_now", "reschedule_tasks", "pause_tasks"):
        _act(client, action, "order:1:close", apply="Reschedule", delay_minutes="1")
    job = shop_delayq.get("order:1:close")
    assert job is not None and job.due == pending["order:1:close"].due, "nothing happened"
    assert DelayedTask.objects.get(job_id="order:1:close").state == "scheduled"
    assert shop_delayq.paused() == NOTHING_PAUSED


def test_each_action_needs_its_own_permission(client, pending, shop_delayq):
    client.force_login(_staff("cancel_delayedtask"))
    choices = [c[0] for c in client.get(reverse(CHANGELIST)).context["action_form"]
               .fields["action"].choices]
    assert "cancel_tasks" in choices
    assert "run_now" not in choices and "reschedule_tasks" not in choices
    assert "pause_tasks" not in choices and "resume_tasks" not in choices
    _act(client, "run_now", "order:1:close")
    assert shop_delayq.get("order:1:close").due == pending["order:1:close"].due
    _act(client, "cancel_tasks", "order:1:close")
    assert shop_delayq.get("order:1:close") is None


@pytest.mark.parametrize("lookup", ["key__regex", "job_id__iregex", "task_id__regex"])
def test_a_url_filter_by_regular_expression_is_refused(client, pending, lookup):
    """A pattern the database cannot compile answered 500 (``(``), and any pattern ran row
    by row on SQLite: a staff user's slow query."""
    client.force_login(_staff())

    assert client.get(reverse(CHANGELIST), {lookup: "("}).status_code == 400
    assert client.get(reverse(CHANGELIST), {"key__startswith": "order:"}).status_code == 200


@pytest.mark.parametrize("lookup", ["envelope__contains", "envelope__regex",
                                    "store_error__contains", "events__detail__contains"])
def test_a_url_filter_on_a_column_the_admin_does_not_offer_is_refused(client, pending,
                                                                       shop_delayq, sync,
                                                                       lookup):
    """The stored call (envelope) holds the arguments an ``argsrepr`` hides from the admin:
    a filter on it answered yes or no for each guess, and a view-only user read a card
    number a digit at a time (~160 requests)."""
    shop_delayq.schedule(ORDER_TIMEOUT, args=("card-4111111111111111",), delay=600,
                         job_id="secret:1", argsrepr="('card-****',)")
    sync.run_once()
    client.force_login(_staff())

    assert client.get(reverse(CHANGELIST), {lookup: "card-4"}).status_code == 400
    offered = {"state__exact": "scheduled", "task__exact": ORDER_TIMEOUT,
               "stored__exact": "1", "due__year": str(pending["order:1:close"].due.year)}
    for name, value in offered.items():
        assert client.get(reverse(CHANGELIST), {name: value}).status_code == 200, name


def test_staff_without_view_permission_gets_no_list(client, pending):
    client.force_login(User.objects.create_user("intern", password="x", is_staff=True))
    assert client.get(reverse(CHANGELIST)).status_code == 403


# -- pause and resume ------------------------------------------------------------------


def _page(client, name: str = CHANGELIST, *args) -> str:
    response = client.get(reverse(name, args=args))
    assert response.status_code == 200
    return response.content.decode().replace("\xa0", " ")


def _journaled(delayq: DelayQ, event: str) -> list[dict[str, str]]:
    return [fields for shard in delayq.store.keys
            for _, fields in delayq.store.read_journal(shard) if fields.get("event") == event]


def test_pause_action_pauses_each_task_of_the_selection_once_and_journals_the_admin_user(
        admin_client, pending, shop_delayq):
    response = _act(admin_client, "pause_tasks", "order:1:close", "order:2:close",
                    "refund:3:check:0")
    assert _messages(response) == [
        f"Paused {REFUND_CHECK}: its due tasks wait until it is resumed.",
        f"Paused {ORDER_TIMEOUT}: its due tasks wait until it is resumed."]
    assert shop_delayq.paused() == {"tasks": [REFUND_CHECK, ORDER_TIMEOUT], "queues": []}
    assert sorted((f["task"], f["by"]) for f in _journaled(shop_delayq, "paused")) == [
        (REFUND_CHECK, "admin:admin"), (ORDER_TIMEOUT, "admin:admin")]


def test_pausing_a_paused_task_again_changes_nothing_and_says_so(
        admin_client, pending, shop_delayq):
    shop_delayq.pause(task=ORDER_TIMEOUT, by="ops")
    response = _act(admin_client, "pause_tasks", "order:1:close")
    assert _messages(response) == [f"{ORDER_TIMEOUT} was already paused"]
    assert [f["by"] for f in _journaled(shop_delayq, "paused")] == ["ops"]


def test_resume_action_releases_the_held_tasks_and_says_how_many(
        admin_client, pending, shop_delayq, shop_carrier):
    _act(admin_client, "pause_tasks", "refund:3:check:0")
    _act(admin_client, "run_now", "refund:3:check:0")
    wait_for(lambda: (job := shop_delayq.get("refund:3:check:0")) and job.paused,
             what="the carrier holding the due refund check")
    assert ", held by a pause" in _page(admin_client)

    response = _act(admin_client, "resume_tasks", "refund:3:check:0")
    assert _messages(response) == [
        f"Resumed {REFUND_CHECK}: 1 held task released, due now (oldest first)."]
    assert shop_delayq.paused() == NOTHING_PAUSED
    assert ", held by a pause" not in _page(admin_client)
    wait_for(lambda: shop_delayq.get("refund:3:check:0") is None,
             what="the carrier promoting the released refund check")
    assert [f["by"] for f in _journaled(shop_delayq, "resumed")] == ["admin:admin"]


def test_resuming_a_task_that_is_not_paused_names_its_paused_queue_and_the_command(
        admin_client, pending, shop_delayq):
    queue = pending["refund:3:check:0"].queue
    shop_delayq.pause(queue=queue, by="ops")
    response = _act(admin_client, "resume_tasks", "refund:3:check:0")
    assert _messages(response) == [
        f"{REFUND_CHECK} was not paused, but its queue {queue} is: resume with "
        f"`celery -A demo_project.celery_app:app delayq resume --queue {queue}`"]
    assert shop_delayq.paused() == {"tasks": [], "queues": [queue]}


def test_banner_shows_what_is_paused_on_list_and_detail_and_goes_after_resume(
        admin_client, pending, shop_delayq):
    assert 'class="delayq-paused"' not in _page(admin_client)
    shop_delayq.pause(task=REFUND_CHECK, by="ops")
    shop_delayq.pause(queue="refunds", by="ops")

    listed = _page(admin_client)
    assert 'class="delayq-paused"' in listed
    assert f"task <code>{REFUND_CHECK}</code>, queue <code>refunds</code>" in listed
    assert "the action “Resume the task of the selected rows” below" in listed
    assert (f"celery -A demo_project.celery_app:app delayq resume --task {REFUND_CHECK}\n"
            "celery -A demo_project.celery_app:app delayq resume --queue refunds") in listed
    detail = _page(admin_client, "admin:delayq_delayedtask_change",
                   pending["order:1:close"].pk)
    assert f"task <code>{REFUND_CHECK}</code>, queue <code>refunds</code>" in detail
    assert "Resume the task of the selected rows" not in detail, "no actions on that page"

    _act(admin_client, "resume_tasks", "refund:3:check:0")
    shop_delayq.resume(queue="refunds", by="ops")
    assert 'class="delayq-paused"' not in _page(admin_client)


def test_staff_with_the_pause_permission_may_pause_and_resume_and_nothing_else(
        client, pending, shop_delayq):
    client.force_login(_staff("pause_delayedtask"))
    choices = [c[0] for c in client.get(reverse(CHANGELIST)).context["action_form"]
               .fields["action"].choices]
    assert {"pause_tasks", "resume_tasks"} <= set(choices)
    assert not {"cancel_tasks", "run_now", "reschedule_tasks"} & set(choices)
    _act(client, "pause_tasks", "order:1:close")
    assert shop_delayq.paused()["tasks"] == [ORDER_TIMEOUT]
    assert [f["by"] for f in _journaled(shop_delayq, "paused")] == ["admin:support"]
    _act(client, "resume_tasks", "order:1:close")
    assert shop_delayq.paused() == NOTHING_PAUSED


def test_staff_without_the_pause_permission_cannot_resume_and_sees_only_the_command(
        client, pending, shop_delayq):
    shop_delayq.pause(task=ORDER_TIMEOUT, by="ops")
    client.force_login(_staff("cancel_delayedtask"))
    page = _page(client)
    assert f"task <code>{ORDER_TIMEOUT}</code>" in page and "delayq resume --task" in page
    assert "Resume the task of the selected rows" not in page
    _act(client, "resume_tasks", "order:1:close")
    assert shop_delayq.paused()["tasks"] == [ORDER_TIMEOUT], "a forged POST resumes nothing"


@pytest.fixture
def store_gone_down(pending, shop_delayq, settings, monkeypatch):
    """The project's store paused a task, then its redis-server stopped (the rows of
    ``pending`` stay in the database)."""
    with RedisServer() as server:
        app = Celery("gone", broker="redis://127.0.0.1:1/0", set_as_current=False)
        app.conf.update(delayq_redis_url=f"{server.url}/0", delayq_redis_retries=1,
                        delayq_redis_socket_timeout=0.5)
        delayq = DelayQ(app)
        delayq.pause(task=ORDER_TIMEOUT, by="ops")
        server.stop()
        monkeypatch.setattr(sys.modules[__name__], "project_app", app)
        settings.DELAYQ_CELERY_APP = f"{__name__}:project_app"
        yield delayq
        delayq.store.close()


def test_pages_render_without_banner_but_with_a_warning_while_redis_is_down(
        admin_client, store_gone_down):
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200 and response.context["cl"].result_count == 3
    assert 'class="delayq-paused"' not in response.content.decode()
    [warning] = response.context["messages"]
    assert warning.level_tag == "warning"
    assert str(warning).startswith("What is paused is unknown (no banner): Redis could not "
                                   f"say: Redis at {store_gone_down.store.config.redis_url} "
                                   "is unavailable")
    row = DelayedTask.objects.get(job_id="order:1:close")
    detail = admin_client.get(reverse("admin:delayq_delayedtask_change", args=[row.pk]))
    assert detail.status_code == 200 and "What is paused is unknown" in _messages(detail)[0]


def test_pause_and_resume_while_redis_is_down_give_an_error_message_not_a_500(
        admin_client, store_gone_down):
    for action in ("pause_tasks", "resume_tasks"):
        response = _act(admin_client, action, "order:1:close")
        assert response.status_code == 200
        error, warning = response.context["messages"]  # the action's, the list page's
        assert error.level_tag == "error" and str(error).startswith(
            "error: nothing done, Redis could not say what is paused: Redis at")
        assert warning.level_tag == "warning"


@pytest.fixture
def store_hanging_up(pending, settings, monkeypatch):
    """The project's store at an address that accepts each connection and closes it at once
    (a Redis restarting, a proxy with no server behind it), and that address."""
    hanging_up = HangingUp()
    app = Celery("hanging", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.update(delayq_redis_url=f"{hanging_up.url}/0", delayq_redis_retries=1,
                    delayq_redis_socket_timeout=0.5)
    monkeypatch.setattr(sys.modules[__name__], "project_app", app)
    settings.DELAYQ_CELERY_APP = f"{__name__}:project_app"
    yield DelayQ(app), hanging_up
    hanging_up.close()


def test_an_action_stops_at_the_first_row_redis_is_unavailable_for(
        admin_client, store_hanging_up):
    delayq, hanging_up = store_hanging_up
    _act(admin_client, "cancel_tasks", "order:1:close")
    one_row = hanging_up.accepted()  # its action and the list page after it
    response = _act(admin_client, "cancel_tasks", "order:1:close", "order:2:close",
                    "refund:3:check:0")
    error = response.context["messages"]._loaded_messages[0]
    assert error.level_tag == "error" and str(error).startswith(
        f"error: Redis at {delayq.store.config.redis_url} is unavailable")
    # in due order; the two orders may fall due in the same millisecond (either first)
    listed = re.search(r"nothing done: 3 tasks \((.*)\)$", str(error))
    assert listed and sorted(listed[1].split(", ")) == [
        "order:1:close", "order:2:close", "refund:3:check:0"]
    assert hanging_up.accepted() - one_row == one_row, "each row waited for Redis again"
    assert DelayedTask.objects.filter(state="scheduled").count() == 3


# -- what a newcomer reads -------------------------------------------------------------


def _cells(html: str, column: str) -> list[str]:
    """The text of one changelist column's cells (``field-<column>``), tags stripped."""
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in
            re.findall(rf'<t[dh] class="field-{column}[^"]*">(.*?)</t[dh]>', html, re.S)]


def test_a_calls_own_argsrepr_is_what_the_mirror_and_its_pages_show(
        admin_client, shop_delayq, sync, fast_shop):
    """Celery's way to keep secrets out of logs and monitoring (``argsrepr`` /
    ``kwargsrepr``) keeps them out of the admin, as django-celery-results does: the rows
    hold the call's own text, whether the journal sync or a transaction wrote them."""
    from django.db import transaction
    from shop.tasks import close_unpaid_order

    close_unpaid_order.apply_delayed(args=("card-4111",), delay=600, job_id="secret:1",
                                     argsrepr="('card-****',)")
    sync.run_once()
    with transaction.atomic():
        close_unpaid_order.apply_delayed(kwargs={"order_id": "card-4222"}, delay=600,
                                         job_id="secret:2", kwargsrepr="{'order_id': '***'}")
    rows = {row.job_id: row for row in DelayedTask.objects.filter(job_id__startswith="secret")}
    assert (rows["secret:1"].args, rows["secret:1"].kwargs) == ("('card-****',)", {})
    assert (rows["secret:2"].args, rows["secret:2"].kwargs) == ([], "{'order_id': '***'}")
    pages = _page(admin_client) + "".join(
        _page(admin_client, "admin:delayq_delayedtask_change", row.pk) for row in rows.values())
    assert "card-****" in pages and "card-4111" not in pages and "card-4222" not in pages
    assert shop_delayq.get("secret:1").args == ["card-4111"], "the store keeps the call"


def test_business_key_links_to_the_admin_page_of_its_object_through_the_setting(
        admin_client, shop_delayq, sync, settings):
    from shop import services

    settings.DELAYQ_KEY_MODELS = {"order": "shop.Order", "refund": "shop.Refund"}
    order = services.place_order("Ada", "19.90")
    shop_delayq.schedule(ORDER_TIMEOUT, args=(1,), delay=60, key="wave:1", job_id="wave:1")
    sync.run_once()
    link = f'<a href="{reverse("admin:shop_order_change", args=[order.pk])}">order:{order.pk}</a>'
    assert link in _page(admin_client)
    row = DelayedTask.objects.get(key=order.key)
    assert link in _page(admin_client, "admin:delayq_delayedtask_change", row.pk)
    assert "wave:1" in _cells(_page(admin_client), "key_link"), "no model for it: plain text"

    settings.DELAYQ_KEY_MODELS = {}
    assert link not in _page(admin_client) and order.key in _cells(_page(admin_client),
                                                                    "key_link")


def test_business_key_is_plain_text_for_staff_who_may_not_view_its_object(
        client, shop_delayq, sync, settings):
    from shop import services

    settings.DELAYQ_KEY_MODELS = {"order": "shop.Order"}
    order = services.place_order("Ada", "19.90")
    sync.run_once()
    client.force_login(_staff())
    page = _page(client)
    assert order.key in _cells(page, "key_link")
    assert reverse("admin:shop_order_change", args=[order.pk]) not in page


def test_detail_page_has_one_due_row_and_every_time_in_one_format_with_the_time_zone(
        admin_client, pending, settings):
    settings.TIME_ZONE = "Europe/Paris"
    row = pending["refund:3:check:0"]
    html = _page(admin_client, "admin:delayq_delayedtask_change", row.pk)
    labels = re.findall(r"<label>([^<]*):</label>", html)
    assert len(labels) == len(set(labels)), f"labels given twice: {labels}"
    due = timezone.localtime(row.due, ZoneInfo("Europe/Paris"))
    assert f"{due:%Y-%m-%d %H:%M:%S %Z}" in html and due.tzname() in ("CET", "CEST")
    timeline = html[html.index('class="delayq-timeline"'):]
    times = re.findall(r"<td>(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^<]*)</td>", timeline)
    assert times and all(re.fullmatch(r"[-\d]+ [:\d]+ CES?T", t) for t in times), times
    assert not re.search(r"\b(a\.m\.|p\.m\.|Jan\.|Feb\.|March|Nov\.|Dec\.)", html)


def test_cancelled_rows_show_the_due_time_the_list_sorts_them_by(admin_client, pending):
    _act(admin_client, "cancel_tasks", "order:1:close")
    response = admin_client.get(reverse(CHANGELIST), {"o": "3"})  # by the due column
    html = response.content.decode().replace("\xa0", " ")
    dues = dict(zip(_cells(html, "key_link"), _cells(html, "due_in"), strict=True))
    assert re.fullmatch(r"in (29|30) minutes, not run", dues["order:1"]), dues
    assert re.fullmatch(r"in (29|30) minutes", dues["order:2"]), dues
    listed = response.context["cl"].result_list
    assert [r.due for r in listed] == sorted(r.due for r in listed)
    assert listed[0].job_id == "refund:3:check:0", "due first, cancelled or not"


def test_runs_a_worker_revoked_show_cancelled_by_it_and_a_terminated_one_as_stopped(
        admin_client, pending, sync):
    """The journal's ``revoked`` (a worker discarded or stopped the run) mirrored."""
    for job_id, events in (("order:1:close", ("promoted", "revoked")),
                           ("order:2:close", ("promoted", "started", "revoked"))):
        row = pending[job_id]
        shard = sync.delayq.store.keys.shard_for(job_id).shard
        for event in events:
            reason = "expired" if job_id == "order:1:close" else "terminated"
            sync.delayq.store.journal(shard, event, {
                "job": job_id, "task_id": row.task_id, "reason": reason,
                "due": round(row.due.timestamp() * 1000)})
    sync.run_once()
    html = _page(admin_client).replace("\xa0", " ")
    dues = dict(zip(_cells(html, "key_link"), _cells(html, "due_in"), strict=True))
    assert re.fullmatch(r"in (29|30) minutes, not run", dues["order:1"]), dues
    assert re.fullmatch(r"in (29|30) minutes, stopped while running", dues["order:2"]), dues
    detail = _page(admin_client, "admin:delayq_delayedtask_change", pending["order:2:close"].pk)
    assert "worker: terminated" in detail and "reason: terminated" in detail


def test_task_names_read_the_same_in_the_table_and_in_the_filter(admin_client, pending):
    html = _page(admin_client)
    assert set(_cells(html, "task_name")) == {ORDER_TIMEOUT, REFUND_CHECK}
    filter_links = re.findall(r'<a href="\?task=[^"]*"[^>]*>([^<]+)</a>', html)
    assert set(filter_links) == {ORDER_TIMEOUT, REFUND_CHECK}


def test_action_messages_say_task_and_tasks(admin_client, pending):
    one = _act(admin_client, "run_now", "order:1:close")
    two = _act(admin_client, "run_now", "order:2:close", "refund:3:check:0")
    assert _messages(one) == ["due now: 1 task (order:1:close)"]
    assert _messages(two)[0].startswith("due now: 2 tasks (")


# -- times at the edge of the calendar -------------------------------------------------

_LAST_MS = 253_402_300_799_999  # 9999-12-31 23:59:59.999 UTC
_FIRST_MS = -62_135_596_800_000  # 0001-01-01 00:00 UTC


@pytest.mark.parametrize("zone, due_ms", [
    ("Europe/Berlin", _LAST_MS),  # past year 9999 there
    ("Pacific/Kiritimati", _LAST_MS - 86_400_000 * 180),  # year 9999: no year after it
    ("America/New_York", _FIRST_MS + 1),  # before year 1 there
])
def test_every_page_and_date_the_changelist_offers_opens_after_syncing_a_far_due_time(
        admin_client, pending, shop_delayq, shop_redis, sync, settings, zone, due_ms):
    settings.TIME_ZONE = zone
    shop_redis.xadd(shop_delayq.store.keys.shard_for("edge:1").journal,
                    {"event": "scheduled", "job": "edge:1", "task": ORDER_TIMEOUT,
                     "due": str(due_ms)})
    sync.run_once()

    assert not DelayedTask.objects.filter(job_id="edge:1").exists(), "no time: skipped"
    html = _page(admin_client)
    dates = re.findall(r'href="(\?[^"]*due__[^"]*)"', html)
    assert dates
    for query in dates:
        assert admin_client.get(reverse(CHANGELIST) + query.replace("&amp;", "&")
                                ).status_code == 200
    for row in DelayedTask.objects.all():
        _page(admin_client, "admin:delayq_delayedtask_change", row.pk)


def test_detail_page_writes_a_time_the_local_zone_has_no_date_for_in_its_own_zone(
        admin_client, pending, settings):
    """Times no sync writes any more, in rows an older one (or a hand) wrote."""
    settings.TIME_ZONE = "Europe/Berlin"
    row = pending["order:1:close"]
    last = datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt_timezone.utc)
    DelayedTask.objects.filter(pk=row.pk).update(due=last)
    row.events.update(at=last, due=last)

    html = _page(admin_client, "admin:delayq_delayedtask_change", row.pk)

    assert html.count("9999-12-31 23:59:59 UTC") == 3  # due, and the event's time and due


def test_an_action_on_more_rows_than_a_request_may_take_is_refused_saying_what_to_do(
        admin_client, pending, shop_delayq, monkeypatch):
    """Each row is a Redis call: "select all" over 100,000 rows would outlast any proxy's
    timeout, stopped nobody knows where. Past ``MOST_ROWS`` nothing is done, and the
    message says how to narrow the selection or which command does it in bulk."""
    from celery_delayq.contrib.django import admin as delayq_admin

    monkeypatch.setattr(delayq_admin, "MOST_ROWS", 2)
    ticked = [row.pk for row in pending.values()]  # the page's rows, as a browser posts them
    for action in ("cancel_tasks", "reschedule_tasks", "run_now"):
        done = admin_client.post(reverse(CHANGELIST), {
            "action": action, "select_across": "1", "index": "0", "_selected_action": ticked,
            "apply": "Reschedule", "delay_minutes": "5"}, follow=True)
        [message] = _messages(done)
        assert message.startswith("3 delayed tasks selected: an action takes at most 2"), message
        assert "filters" in message and "celery -A" in message
    assert {job.job_id: job.due for job in shop_delayq.pending()} == {
        job_id: row.due for job_id, row in pending.items()}


def test_reschedule_of_all_rows_of_a_filtered_list_carries_the_selection_not_its_rows(
        admin_client, pending, shop_delayq):
    """A form holding one field per selected row went over Django's 1,000 fields past
    1,000 rows (400 Bad Request, nothing done): "select all" carries the list's filters."""
    url = reverse(CHANGELIST) + "?task__exact=shop.tasks.close_unpaid_order"
    ticked = pending["order:1:close"].pk  # the page's rows, as a browser posts them
    form = admin_client.post(url, {"action": "reschedule_tasks", "select_across": "1",
                                   "index": "0", "_selected_action": [ticked]})
    html = form.content.decode()
    assert html.count('name="_selected_action"') == 1
    assert 'name="select_across" value="1"' in html
    done = admin_client.post(url, {"action": "reschedule_tasks", "select_across": "1",
                                   "_selected_action": [ticked], "apply": "Reschedule",
                                   "delay_minutes": "300"}, follow=True)
    assert "2 tasks" in _messages(done)[0]
    assert [job.job_id for job in shop_delayq.pending()][-2:] == ["order:1:close",
                                                                   "order:2:close"]


@pytest.mark.parametrize("written", ["+{pk}", " {pk}", "0{pk}"])
def test_a_business_key_that_only_reads_as_an_objects_key_is_not_linked_to_it(
        admin_client, shop_delayq, sync, settings, written):
    from shop import services

    settings.DELAYQ_KEY_MODELS = {"order": "shop.Order"}
    order = services.place_order("Ada", "19.90")
    key = "order:" + written.format(pk=order.pk)
    shop_delayq.schedule(ORDER_TIMEOUT, args=(1,), delay=60, key=key, job_id="look-alike")
    sync.run_once()
    page = _page(admin_client)
    assert reverse("admin:shop_order_change", args=[order.pk]) in page  # its own row's
    assert key in _cells(page, "key_link")
    assert f'">{key}</a>' not in page
