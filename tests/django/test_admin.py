"""The delayed-task admin through Django's test client: list, detail, actions, permissions."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from celery_delayq.contrib.django.models import DelayedTask

pytestmark = pytest.mark.django_db(transaction=True)
CHANGELIST = "admin:delayq_delayedtask_changelist"


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
    assert [r.job_id for r in searched.context["cl"].result_list] == ["refund:9:check:1"]


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
    assert b"Ensure this value is less than or equal to" in response.content
    assert shop_delayq.get("order:1:close").due == pending["order:1:close"].due


def test_staff_without_action_permissions_sees_tasks_but_cannot_act(
        client, pending, shop_delayq):
    client.force_login(_staff())
    response = client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert response.context["cl"].result_count == 3
    assert 'name="action"' not in response.content.decode(), "no actions offered"
    for action in ("cancel_tasks", "run_now", "reschedule_tasks"):
        _act(client, action, "order:1:close", apply="Reschedule", delay_minutes="1")
    job = shop_delayq.get("order:1:close")
    assert job is not None and job.due == pending["order:1:close"].due, "nothing happened"
    assert DelayedTask.objects.get(job_id="order:1:close").state == "scheduled"


def test_each_action_needs_its_own_permission(client, pending, shop_delayq):
    client.force_login(_staff("cancel_delayedtask"))
    choices = [c[0] for c in client.get(reverse(CHANGELIST)).context["action_form"]
               .fields["action"].choices]
    assert "cancel_tasks" in choices
    assert "run_now" not in choices and "reschedule_tasks" not in choices
    _act(client, "run_now", "order:1:close")
    assert shop_delayq.get("order:1:close").due == pending["order:1:close"].due
    _act(client, "cancel_tasks", "order:1:close")
    assert shop_delayq.get("order:1:close") is None


def test_staff_without_view_permission_gets_no_list(client, pending):
    client.force_login(User.objects.create_user("intern", password="x", is_staff=True))
    assert client.get(reverse(CHANGELIST)).status_code == 403
