"""Admin pages of delayed tasks: list, filter, read-only detail, cancel / run now / reschedule,
pause / resume the selected rows' tasks and a banner while anything is paused."""

from __future__ import annotations

import contextlib
import json
import logging
from collections import defaultdict
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

from django import forms
from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote
from django.core.exceptions import ValidationError
from django.db.models.constants import LOOKUP_SEP
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import ngettext

from celery_delayq import DelayQError, InvalidDelay, StoreUnavailable
from celery_delayq.conf import as_written

from . import operations, times
from .chart import pending_chart
from .models import DelayedTask, State
from .runtime import delayq as project_delayq
from .runtime import key_models, resume_command
from .sync import revoked_by
from .times import from_db

logger = logging.getLogger("celery_delayq.contrib.django.admin")

_BADGE_COLOURS = {
    State.SCHEDULED: "#417690", State.PROMOTED: "#8a6d3b", State.STARTED: "#c77c02",
    State.SUCCEEDED: "#2e7d32", State.FAILED: "#ba2121", State.CANCELLED: "#666",
    State.DEAD: "#000",
}
_LISTED_IDS = 10
#: The most rows one admin action takes: each is a Redis call (~4 ms), and a request must
#: end before a proxy's timeout cuts it short, done nobody knows how far.
MOST_ROWS = 1_000
_NO_BANNER = "What is paused is unknown (no banner): Redis could not say"


class RescheduleForm(forms.Form):
    """A new due time: a delay from now, or a date and time."""

    delay_minutes = forms.FloatField(
        label="Delay from now (minutes)", required=False, min_value=0,
        help_text="e.g. 30 for half an hour from now")
    due_at = forms.DateTimeField(
        label="Or at (date and time)", required=False,
        help_text="YYYY-MM-DD HH:MM in the site's time zone")

    def clean_due_at(self):
        """Without ``USE_TZ``, refuse a time a clock change skips or repeats, as Django's
        field does with it."""
        at = self.cleaned_data["due_at"]
        if at is not None and timezone.is_naive(at) and not times.one_instant(at):
            raise forms.ValidationError(
                f"{at} could not be interpreted in time zone "
                f"{timezone.get_default_timezone_name()}; it may be ambiguous or it may "
                "not exist.")
        return at

    def clean(self):
        data = super().clean()
        if self.errors:  # a field's own error says what is wrong
            return data
        delay, at = data.get("delay_minutes"), data.get("due_at")
        if delay is None and at is None:
            raise forms.ValidationError("Give a delay in minutes or a date and time.")
        if delay is not None and at is not None:
            raise forms.ValidationError("Give either a delay or a date and time, not both.")
        if at is not None and at <= timezone.now():
            raise forms.ValidationError(
                f"{timezone.localtime(from_db(at)):%Y-%m-%d %H:%M} has passed; give a later "
                "time, or use “Run selected delayed tasks now”.")
        delayq = project_delayq()
        try:
            max_delay = delayq.config.max_delay
        except DelayQError as exc:  # a setting the store refuses: said, not a server error
            raise forms.ValidationError(str(exc)) from None
        ahead = delay * 60 if at is None else (from_db(at) - times.utc_now()).total_seconds()
        if ahead > max_delay:  # else each row fails in the store
            field = "due_at" if delay is None else "delay_minutes"
            raise forms.ValidationError({field: _too_far(delayq)})
        return data

    def due(self) -> datetime:
        """One due time for every selected task: a delay counts from when the form is applied."""
        if self.cleaned_data.get("due_at") is not None:
            return from_db(self.cleaned_data["due_at"])  # naive without USE_TZ
        return times.utc_now() + timedelta(minutes=self.cleaned_data["delay_minutes"])


def _too_far(delayq) -> str:
    """The form's error for a time past ``delayq_max_delay``, naming the setting as the
    app's settings write it."""
    limit = delayq.config.max_delay
    message = f"More than {limit / 60:,.15g} minutes ahead: delayq_max_delay is {limit:,.15g} s"
    if delayq.app.namespace:
        message = as_written(message, delayq.app.namespace)
    return f"{message}. Give an earlier time."


@admin.register(DelayedTask)
class DelayedTaskAdmin(admin.ModelAdmin):
    list_display = ("task_name", "key_link", "due_in", "state_badge", "retries", "stored")
    list_display_links = ("task_name",)
    list_filter = ("state", "task", "queue", "stored")
    date_hierarchy = "due"
    search_fields = ("key", "job_id", "task_id", "args", "kwargs")
    search_help_text = "A business key, job id or task id, or a value it was called with."
    actions = ("cancel_tasks", "run_now", "reschedule_tasks", "replay_tasks", "drop_tasks",
               "pause_tasks", "resume_tasks")
    list_per_page = 50
    fieldsets = (
        (None, {"fields": ("job_id", "task", "key_link", "state_badge", "due_at", "queue",
                           "retries", "task_id")}),
        ("Call", {"fields": ("pretty_args", "pretty_kwargs")}),
        ("Store", {"fields": ("stored", "store_error", "cancelled_by", "reason")}),
        ("Timeline", {"fields": ("timeline",)}),
    )
    readonly_fields = ("key_link", "state_badge", "due_at", "pretty_args", "pretty_kwargs",
                       "timeline")
    #: The fields a changelist URL may filter on: the sidebar's, the date bar's, and the key
    #: and ids the pages show. Not the stored call (``envelope``): it holds the arguments an
    #: ``argsrepr`` hides here, and a filter on it answers yes or no to each guess.
    url_filters = frozenset({"state", "task", "queue", "stored", "due", "key", "job_id",
                             "task_id"})

    def lookup_allowed(self, lookup, value, request=None) -> bool:
        """Only lookups on :attr:`url_filters`, none by regular expression (a pattern
        the database cannot compile was a 500; on SQLite any ran row by row): Django
        answers any other with a 400. Django 4.2 passes no ``request``; 5.0 and later do."""
        given = () if request is None else (request,)
        return (lookup.split(LOOKUP_SEP, 1)[0] in self.url_filters
                and lookup.rsplit(LOOKUP_SEP, 1)[-1] not in ("regex", "iregex")
                and super().lookup_allowed(lookup, value, *given))

    # -- read-only pages ---------------------------------------------------------------

    def changelist_view(self, request, extra_context=None):
        """The changelist, with a chart of the listed rows' pending work in the next 24 h
        and, while anything is paused, a banner saying what (due rows it holds say so)."""
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None) or {}
        if "cl" in context:  # not a redirect or an action's own page
            context["delayq_chart"] = pending_chart(context["cl"].queryset)
            paused = self._paused(request)
            context["delayq_paused"] = self._banner(request, paused, with_actions=True)
            if paused:
                _mark_held(context["cl"].result_list, paused)
            self._link_keys(request, context["cl"].result_list)
        return response

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The read-only detail, with the banner while anything is paused."""
        response = super().change_view(request, object_id, form_url, extra_context)
        context = getattr(response, "context_data", None)
        if context is not None:  # not a redirect (a row that is gone)
            paused = self._paused(request)
            context["delayq_paused"] = self._banner(request, paused, with_actions=False)
            if context.get("original") is not None:
                _mark_held([context["original"]], paused or {"tasks": [], "queues": []})
                self._link_keys(request, [context["original"]])
        return response

    def _link_keys(self, request, rows) -> None:
        """Give each row whose business key names an object (``DELAYQ_KEY_MODELS``) the
        URL of that object's admin page, where this user may view it."""
        for row in rows:
            row.delayq_key_url = self._key_url(request, row.key)

    def _key_url(self, request, key: str) -> str | None:
        prefix, colon, pk = key.partition(":")
        label = key_models().get(prefix) if colon else None
        if not label:
            return None
        try:
            model = apps.get_model(label)
            model_admin = self.admin_site._registry.get(model)
            if model_admin is None or not model_admin.has_view_or_change_permission(request):
                return None
            opts = model._meta
            if str(opts.pk.to_python(pk)) != pk:  # "+42" reads as 42: not that object's key
                return None
            return reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change",
                           args=[quote(pk)])
        except (LookupError, ValueError, ValidationError, NoReverseMatch):
            return None  # no such model, or not its kind of primary key

    def _paused(self, request, failure=_NO_BANNER) -> dict[str, list[str]] | None:
        """What is paused (one Redis read); None when Redis cannot say, and ``failure``
        says so (a warning, or an error if it starts with "error")."""
        try:
            return project_delayq().paused()
        except DelayQError as exc:
            logger.warning("%s: %s", failure, exc)
            self.message_user(request, f"{failure}: {exc}", level=_level(False, failure))
            return None

    def _banner(self, request, paused, with_actions: bool) -> dict | None:
        """The banner's context: what is paused and how to resume it (the resume action
        too, on a page that offers it); None if nothing is."""
        if not paused or not (paused["tasks"] or paused["queues"]):
            return None
        held = [(kind, name) for kind in ("task", "queue") for name in paused[f"{kind}s"]]
        return {"held": held,
                "commands": [resume_command(kind, name) for kind, name in held],
                "action": with_actions and bool(paused["tasks"])
                and self.has_pause_permission(request)}

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_cancel_permission(self, request):
        return request.user.has_perm("delayq.cancel_delayedtask")

    def has_run_now_permission(self, request):
        return request.user.has_perm("delayq.run_now_delayedtask")

    def has_reschedule_permission(self, request):
        return request.user.has_perm("delayq.reschedule_delayedtask")

    def has_pause_permission(self, request):
        return request.user.has_perm("delayq.pause_delayedtask")

    # -- columns -----------------------------------------------------------------------

    @admin.display(description="task", ordering="task")
    def task_name(self, obj):
        """The task's full name, as the filters and the chart give it; the module quieter."""
        module, dot, name = obj.task.rpartition(".")
        if not name:
            return obj.job_id
        return format_html('<span class="delayq-module">{}</span><wbr>{}', module + dot, name)

    @admin.display(description="business key", ordering="key")
    def key_link(self, obj):
        """The business key, linked to its object's admin page where one is known."""
        url = getattr(obj, "delayq_key_url", None)
        if url:
            return format_html('<a href="{}">{}</a>', url, obj.key)
        return obj.key or "-"

    @admin.display(description="due", ordering="due")
    def due_in(self, obj):
        """How long until (or since) the due time, which the list sorts by, for every row;
        the date and time on hover."""
        if obj.due is None:
            return "-"
        return format_html('<span title="{}" class="delayq-due">{}</span>',
                           when(obj.due), _relative_due(obj))

    @admin.display(description="due")
    def due_at(self, obj):
        if obj.due is None:
            return "-"
        return f"{when(obj.due)} ({_relative_due(obj)})"

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj):
        return format_html(
            '<span class="delayq-state" style="background:{};color:#fff;padding:2px 8px;'
            'border-radius:9px;font-size:11px;white-space:nowrap">{}</span>',
            _BADGE_COLOURS.get(obj.state, "#666"), obj.get_state_display())

    @admin.display(description="args")
    def pretty_args(self, obj):
        return _pretty(obj.args)

    @admin.display(description="kwargs")
    def pretty_kwargs(self, obj):
        return _pretty(obj.kwargs)

    @admin.display(description="events")
    def timeline(self, obj):
        rows = format_html_join(
            "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            ((when(e.at), e.event, when(e.due) if e.due else "", e.detail)
             for e in obj.events.all()))
        if not rows:
            return "no events yet (is manage.py delayq_sync running?)"
        return format_html('<div class="delayq-scroll"><table class="delayq-timeline"><thead>'
                           '<tr><th>at</th><th>event</th><th>new due time</th><th>detail</th>'
                           '</tr></thead><tbody>{}</tbody></table></div>', rows)

    # -- actions -----------------------------------------------------------------------

    @admin.action(description="Cancel selected delayed tasks", permissions=["cancel"])
    def cancel_tasks(self, request, queryset):
        by = f"{request.user.get_username()} in the Django admin"
        self._each(request, queryset, lambda row: operations.cancel(row, by))

    @admin.action(description="Run selected delayed tasks now", permissions=["run_now"])
    def run_now(self, request, queryset):
        self._each(request, queryset, operations.run_now)

    @admin.action(description="Reschedule selected delayed tasks", permissions=["reschedule"])
    def reschedule_tasks(self, request, queryset):
        if not self._within_limit(request, queryset):
            return None
        form = RescheduleForm(request.POST if "apply" in request.POST else None)
        if form.is_bound and form.is_valid():
            due = form.due()
            self._each(request, queryset, lambda row: operations.reschedule(row, eta=due))
            return None
        return TemplateResponse(request, "admin/delayq/delayedtask/reschedule.html", {
            **self.admin_site.each_context(request),
            "title": "Reschedule delayed tasks",
            "opts": self.model._meta,
            "form": form,
            "queryset": queryset,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            **_selection(request, queryset),
        })

    @admin.action(description="Replay selected dead-lettered tasks", permissions=["run_now"])
    def replay_tasks(self, request, queryset):
        self._each(request, queryset, operations.replay)

    @admin.action(description="Drop selected dead-lettered tasks for good",
                  permissions=["cancel"])
    def drop_tasks(self, request, queryset):
        by = f"{request.user.get_username()} in the Django admin: dropped dead letter"
        self._each(request, queryset, lambda row: operations.drop(row, by))

    @admin.action(description="Pause the task of the selected rows", permissions=["pause"])
    def pause_tasks(self, request, queryset):
        by = f"admin:{request.user.get_username()}"
        self._each_task(request, queryset,
                        lambda task, queues, paused: operations.pause(task, by, paused))

    @admin.action(description="Resume the task of the selected rows", permissions=["pause"])
    def resume_tasks(self, request, queryset):
        by = f"admin:{request.user.get_username()}"
        self._each_task(request, queryset,
                        lambda task, queues, paused: operations.resume(task, by, paused, queues))

    def _each_task(self, request, queryset, operation) -> None:
        """Run ``operation(task, its rows' queues, what is paused)`` once per distinct task
        of the selection; one message each."""
        queues: dict[str, list[str]] = defaultdict(list)
        for task, queue in queryset.order_by("task", "queue").values_list("task", "queue"):
            if queue not in queues[task]:
                queues[task].append(queue)
        paused = self._paused(request, "error: nothing done, Redis could not say what is paused")
        if paused is None:
            return
        for task, its_queues in queues.items():
            try:
                done, message = operation(task, its_queues, paused)
            except DelayQError as exc:
                logger.exception("admin action on the delayed task %s failed", task)
                done, message = False, f"error: {task}: {exc}"
            self.message_user(request, message, level=_level(done, message))

    def _each(self, request, queryset, operation) -> None:
        """Run ``operation`` on every row, until Redis is unavailable (each row left would
        wait for it again: the request would outlast any proxy's timeout); one message per
        distinct outcome. A row acted on gets an entry in its admin history (who, what)."""
        if not self._within_limit(request, queryset):
            return
        outcomes: dict[tuple[bool, str], list[str]] = defaultdict(list)
        rows = list(queryset)
        for n, row in enumerate(rows):
            try:
                done, message = operation(row)
                outcomes[(done, message)].append(row.job_id)
                if done:
                    self.log_change(request, row, message)
            except StoreUnavailable as exc:
                logger.error("admin action stopped at delayed job %s: %s", row.job_id, exc)
                outcomes[(False, f"error: {exc}; nothing done")] += [r.job_id for r in rows[n:]]
                break
            except InvalidDelay as exc:  # what the user gave, not a fault: no traceback
                logger.warning("admin action on delayed job %s refused: %s", row.job_id, exc)
                outcomes[(False, f"error: {exc}")].append(row.job_id)
            except DelayQError as exc:
                logger.exception("admin action on delayed job %s failed", row.job_id)
                outcomes[(False, f"error: {exc}")].append(row.job_id)
        for (done, message), job_ids in outcomes.items():
            listed = ", ".join(job_ids[:_LISTED_IDS])
            if len(job_ids) > _LISTED_IDS:
                listed += f" and {len(job_ids) - _LISTED_IDS} more"
            count = ngettext("%(n)d task", "%(n)d tasks", len(job_ids)) % {"n": len(job_ids)}
            self.message_user(request, f"{message}: {count} ({listed})",
                              level=_level(done, message))


    def _within_limit(self, request, queryset) -> bool:
        """Whether the selection is at most :data:`MOST_ROWS` rows; else say what to do."""
        count = queryset.count()
        if count <= MOST_ROWS:
            return True
        self.message_user(request, (
            f"{count:,} delayed tasks selected: an action takes at most {MOST_ROWS:,}, so "
            "that its request ends before a proxy's timeout. Narrow the list with its "
            "filters and search, or use the command line for a whole business key or "
            "task: `celery -A proj delayq cancel --key KEY`, `delayq replay --all --task "
            "TASK`, `delayq drop --all --task TASK`"), level=messages.ERROR)
        return False


def _selection(request, queryset) -> dict:
    """What the reschedule form posts back to select its rows again: their keys, or with
    "select all" the rows the page ticked and ``select_across`` (the list's filters, in
    the URL, select the rest): one field per row went past Django's 1,000 fields."""
    if request.POST.get("select_across") == "1":
        return {"select_across": True,
                "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)}
    return {"select_across": False, "selected": [row.pk for row in queryset]}


def _level(done: bool, message: str) -> int:
    """An action's outcome as a message level: done, failed ("error: ..."), or not done."""
    if done:
        return messages.SUCCESS
    return messages.ERROR if message.startswith("error") else messages.WARNING


def when(moment: datetime) -> str:
    """A date and time as every delayq admin page writes it: local, with the time zone (in
    the zone it is held in where the local one has no date for it: near year 1 or 9999)."""
    moment = from_db(moment)
    with contextlib.suppress(OverflowError):
        moment = timezone.localtime(moment)
    return f"{moment:%Y-%m-%d %H:%M:%S %Z}"


def _relative_due(row) -> str:
    """"in 12 minutes", "3 s ago"; ", held by a pause", ", not run" or ", stopped while
    running" (a run a worker terminated) where so."""
    # both in UTC: timesince counts wall-clock fields, which a clock change shifts
    now, due = times.utc_now(), from_db(row.due).astimezone(dt_timezone.utc)
    seconds = (due - now).total_seconds()
    if abs(seconds) < 60:
        text = f"in {seconds:.0f} s" if seconds >= 0 else f"{-seconds:.0f} s ago"
    elif seconds > 0:
        text = f"in {timeuntil(due, now, depth=1)}"
    else:
        text = f"{timesince(due, now, depth=1)} ago"
    if row.state == State.CANCELLED and row.cancelled_by == revoked_by("terminated"):
        return f"{text}, stopped while running"
    if row.state in (State.CANCELLED, State.DEAD):
        return f"{text}, not run"
    if getattr(row, "delayq_held", False):
        return f"{text}, held by a pause"
    return text


def _mark_held(rows, paused: dict[str, list[str]]) -> None:
    """Mark the listed rows a pause holds: scheduled, due, of a paused task or queue."""
    now = timezone.now()
    for row in rows:
        row.delayq_held = (row.state == State.SCHEDULED and row.due is not None
                           and row.due <= now and (row.task in paused["tasks"]
                                                   or row.queue in paused["queues"]))


def _pretty(value) -> str:
    return format_html('<pre style="margin:0">{}</pre>',
                       json.dumps(value, indent=2, sort_keys=True, default=str))
