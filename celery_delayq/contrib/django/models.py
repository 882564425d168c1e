"""The database mirror of the delay store: one row per delayed job, its events, sync cursors."""

from __future__ import annotations

from django.db import models, router
from django.utils import timezone


class State(models.TextChoices):
    SCHEDULED = "scheduled", "scheduled"
    PROMOTED = "promoted", "promoted"
    STARTED = "started", "started"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    IGNORED = "ignored", "ignored"  # the task raised Ignore: no outcome (Celery's IGNORED)
    CANCELLED = "cancelled", "cancelled"
    DEAD = "dead", "dead"


#: A row's ending (finished, cancelled, given up) as a pending row has it: what a job
#: scheduled again under the id of one that ended must not show.
NOT_ENDED = {"finished_at": None, "cancelled_at": None, "cancelled_by": "", "dead_at": None,
             "reason": ""}


class DelayedTaskQuerySet(models.QuerySet):
    def pending(self):
        """Jobs still waiting in the store for their due time."""
        return self.filter(state=State.SCHEDULED)

    def unstored(self):
        """Pending jobs committed in the database whose Redis write has not happened."""
        return self.pending().filter(stored=False)

    def where_written(self):
        """These rows as the database written to holds them: what decides a write is read
        there, not from a replica that may lag (a primary/replica router reads from one)."""
        return self.using(router.db_for_write(self.model))


class DelayedTask(models.Model):
    """A delayed task call as the store's journal (and the committing transaction) saw it."""

    job_id = models.CharField(
        "job id", max_length=255, unique=True,
        help_text="The delayed task's own id, as logs and the delayq commands give it.")
    task_id = models.CharField(
        "task id", max_length=255, blank=True, db_index=True,
        help_text="The id Celery runs the task under: look for it in worker logs.")
    task = models.CharField(
        "task", max_length=255, db_index=True,
        help_text="Which task runs: its full Celery name.")
    args = models.JSONField(
        "args", default=list, blank=True,
        help_text="The values the task is called with, in order.")
    kwargs = models.JSONField(
        "kwargs", default=dict, blank=True,
        help_text="The named values the task is called with.")
    queue = models.CharField(
        "queue", max_length=255, blank=True, db_index=True,
        help_text="The worker queue the task is sent to when it is due.")
    key = models.CharField(
        "business key", max_length=255, blank=True, db_index=True,
        help_text='What the task is about, e.g. "order:42"; all tasks of one key can be '
                  "cancelled at once.")
    due = models.DateTimeField(
        "due", null=True, blank=True, db_index=True,
        help_text="When the task is due to run (a pause holds it longer).")
    state = models.CharField(
        "state", max_length=16, choices=State.choices, default=State.SCHEDULED, db_index=True,
        help_text="scheduled: waits for its due time; promoted: sent to a worker; dead: "
          "given up after errors.")
    retries = models.PositiveIntegerField(
        "retries", default=0, help_text="How often the task was tried again after an error.")
    stored = models.BooleanField(
        "in Redis", default=True, db_index=True,
        help_text="Yes: written to Redis. No: saved here while Redis was down; manage.py "
          "delayq_reconcile writes it.")
    store_error = models.TextField(
        "store error", blank=True,
        help_text="Why writing the task to Redis failed, if it did.")
    envelope = models.TextField(
        "stored call", blank=True,
        help_text="The task as it goes to Redis, kept to write it there again.")
    scheduled_at = models.DateTimeField(
        "scheduled at", null=True, blank=True,
        help_text="When the task was scheduled, or last given a new due time.")
    promoted_at = models.DateTimeField(
        "promoted at", null=True, blank=True,
        help_text="When the task was last sent to a worker queue.")
    started_at = models.DateTimeField(
        "started at", null=True, blank=True, help_text="When a worker last started the task.")
    finished_at = models.DateTimeField(
        "finished at", null=True, blank=True,
        help_text="When the task succeeded, or failed for good.")
    cancelled_at = models.DateTimeField(
        "cancelled at", null=True, blank=True, help_text="When the task was cancelled.")
    cancelled_by = models.CharField(
        "cancelled by", max_length=255, blank=True,
        help_text="Who cancelled the task, and why.")
    dead_at = models.DateTimeField(
        "dead at", null=True, blank=True,
        help_text="When the task was given up instead of run.")
    reason = models.TextField(
        "reason", blank=True, help_text="Why the task was given up.")
    journaled_ms = models.BigIntegerField(
        "changed in Redis at", null=True, blank=True, editable=False,
        help_text="When Redis recorded the newest event that changed this task (ms since "
                  "1970); an older one only joins its history.")
    created_at = models.DateTimeField(
        "created at", default=timezone.now, help_text="When this task first appeared here.")
    updated_at = models.DateTimeField(
        "updated at", auto_now=True, help_text="When this row last changed.")

    objects = DelayedTaskQuerySet.as_manager()

    class Meta:
        verbose_name = "delayed task"
        verbose_name_plural = "delayed tasks"
        ordering = ("due",)
        permissions = (
            ("cancel_delayedtask", "Can cancel delayed tasks"),
            ("run_now_delayedtask", "Can run delayed tasks now"),
            ("reschedule_delayedtask", "Can reschedule delayed tasks"),
            ("pause_delayedtask", "Can pause and resume the task of delayed tasks"),
        )

    def __str__(self) -> str:
        return self.job_id


class DelayedTaskEvent(models.Model):
    """One journal event of a delayed task (or a local one, such as a failed Redis write)."""

    delayed_task = models.ForeignKey(
        DelayedTask, on_delete=models.CASCADE, related_name="events",
        verbose_name="delayed task", help_text="The delayed task this event is about.")
    event = models.CharField(
        "event", max_length=32,
        help_text="What happened: scheduled, rescheduled, cancelled, promoted (sent to a "
          "worker), started, ...")
    at = models.DateTimeField("at", help_text="When it happened.")
    due = models.DateTimeField(
        "new due time", null=True, blank=True,
        help_text="The due time this event set, if it set one.")
    detail = models.TextField(
        "detail", blank=True,
        help_text="Who or why (a cancel, a give-up), the Celery task id, retries.")
    stream_id = models.CharField(
        "Redis entry id", max_length=64, blank=True,
        help_text="Where Redis records this event; empty for events recorded only here.")

    class Meta:
        verbose_name = "delayed task event"
        verbose_name_plural = "delayed task events"
        ordering = ("at", "id")

    def __str__(self) -> str:
        return f"{self.event} at {self.at:%Y-%m-%d %H:%M:%S}"


class JournalCursor(models.Model):
    """The last journal entry ``delayq_sync`` applied, per store prefix and shard."""

    prefix = models.CharField(
        "prefix", max_length=100, help_text="The store's key prefix (delayq_prefix).")
    shard = models.PositiveIntegerField("shard", help_text="Shard number of the journal.")
    last_id = models.CharField(
        "last id", max_length=64, default="0-0",
        help_text="Id of the last applied journal entry.")
    lost_until = models.CharField(
        "lost until", max_length=64, blank=True, default="",
        help_text="Journal entries after the last applied one were trimmed (or lost with "
                  "Redis's data) up to this id: rows not updated since may show an old state.")
    caught_up_at = models.DateTimeField(
        "caught up at", null=True, blank=True,
        help_text="When delayq_sync last read the journal to its end (Redis's clock): every "
                  "entry made before then is applied.")
    updated_at = models.DateTimeField(
        "updated at", auto_now=True, help_text="When the cursor last moved.")

    class Meta:
        verbose_name = "journal cursor"
        verbose_name_plural = "journal cursors"
        constraints = (
            models.UniqueConstraint(fields=("prefix", "shard"), name="delayq_cursor_unique"),
        )

    def __str__(self) -> str:
        return f"{self.prefix} shard {self.shard} at {self.last_id}"
