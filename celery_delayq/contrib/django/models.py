"""The database mirror of the delay store: one row per delayed job, its events, sync cursors."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class State(models.TextChoices):
    SCHEDULED = "scheduled", "scheduled"
    PROMOTED = "promoted", "promoted"
    STARTED = "started", "started"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"
    DEAD = "dead", "dead"


class DelayedTaskQuerySet(models.QuerySet):
    def pending(self):
        """Jobs still waiting in the store for their due time."""
        return self.filter(state=State.SCHEDULED)

    def unstored(self):
        """Pending jobs committed in the database whose Redis write has not happened."""
        return self.pending().filter(stored=False)


class DelayedTask(models.Model):
    """A delayed task call as the store's journal (and the committing transaction) saw it."""

    job_id = models.CharField(
        "job id", max_length=255, unique=True,
        help_text="Id of the job in the delay store (the task id unless one was given).")
    task_id = models.CharField(
        "task id", max_length=255, blank=True, db_index=True,
        help_text="Celery task id the worker runs the call under.")
    task = models.CharField(
        "task", max_length=255, db_index=True, help_text="Registered name of the Celery task.")
    args = models.JSONField(
        "args", default=list, blank=True, help_text="Positional arguments of the call.")
    kwargs = models.JSONField(
        "kwargs", default=dict, blank=True, help_text="Keyword arguments of the call.")
    queue = models.CharField(
        "queue", max_length=255, blank=True, db_index=True,
        help_text="Celery queue the call is published to when due.")
    key = models.CharField(
        "business key", max_length=255, blank=True, db_index=True,
        help_text='Business key such as "order:42", used to cancel all jobs of one object.')
    due = models.DateTimeField(
        "due", null=True, blank=True, db_index=True,
        help_text="When the carrier hands the call to the workers.")
    state = models.CharField(
        "state", max_length=16, choices=State.choices, default=State.SCHEDULED, db_index=True,
        help_text="Last known state of the job.")
    retries = models.PositiveIntegerField(
        "retries", default=0, help_text="How many times the task has been retried.")
    stored = models.BooleanField(
        "in Redis", default=True, db_index=True,
        help_text="False while the Redis write of a job scheduled in a transaction has not "
                  "succeeded; delayq_reconcile pushes such jobs.")
    store_error = models.TextField(
        "store error", blank=True,
        help_text="Why the last Redis write of this job failed, if it did.")
    envelope = models.TextField(
        "envelope", blank=True,
        help_text="The stored call as JSON, kept so delayq_reconcile can write it again.")
    scheduled_at = models.DateTimeField(
        "scheduled at", null=True, blank=True,
        help_text="When the job was last scheduled or re-timed.")
    promoted_at = models.DateTimeField(
        "promoted at", null=True, blank=True,
        help_text="When a carrier last published the job to the broker.")
    started_at = models.DateTimeField(
        "started at", null=True, blank=True, help_text="When a worker last started the task.")
    finished_at = models.DateTimeField(
        "finished at", null=True, blank=True,
        help_text="When the task succeeded or failed for good.")
    cancelled_at = models.DateTimeField(
        "cancelled at", null=True, blank=True, help_text="When the job was cancelled.")
    cancelled_by = models.CharField(
        "cancelled by", max_length=255, blank=True,
        help_text="Who cancelled the job and why.")
    dead_at = models.DateTimeField(
        "dead at", null=True, blank=True,
        help_text="When a carrier dead-lettered the job.")
    reason = models.TextField(
        "reason", blank=True, help_text="Why the job was dead-lettered.")
    created_at = models.DateTimeField(
        "created at", default=timezone.now, help_text="When this row was created.")
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
        verbose_name="delayed task", help_text="The job this event belongs to.")
    event = models.CharField(
        "event", max_length=32,
        help_text="scheduled, rescheduled, cancelled, promoted, started, succeeded, ...")
    at = models.DateTimeField("at", help_text="When the event happened.")
    due = models.DateTimeField(
        "due", null=True, blank=True, help_text="Due time the event set, if any.")
    detail = models.TextField(
        "detail", blank=True, help_text="Who or why (cancel, dead letter), task id, retries.")
    stream_id = models.CharField(
        "stream id", max_length=64, blank=True,
        help_text="Id of the journal entry in Redis; empty for local events.")

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
