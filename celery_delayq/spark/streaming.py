"""``schedule_stream``: ``schedule_dataframe`` on every micro-batch of a streaming query.

Spark runs a micro-batch again after a restart when it stopped before the checkpoint
recorded the batch as committed; the batch then has the same id and, from a replayable
source (files, Kafka), the same rows. Each batch's call is named after the checkpoint, the
query's id (kept in the checkpoint) and the batch id (``schedule_dataframe(run=...)``), so
a replayed batch answers what its first run did, row by row: nothing is written twice and
what was written counts as scheduled; a new query on a deleted checkpoint writes anew.
A batch's outcome is kept until the next batch starts (the batch before it is committed
by then), or 24 h after its last write.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..conf import DelayQConfig
from ..errors import InvalidOption
from .schedule import Summary, forget_run, schedule_dataframe

if TYPE_CHECKING:
    from celery import Celery
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

logger = logging.getLogger(__name__)

OnBatch = Callable[[int, Summary, "DataFrame"], None]


def schedule_stream(df: DataFrame, app: Celery, *, checkpoint: str,
                    on_batch: OnBatch | None = None, rejects_path: str | None = None,
                    trigger: dict[str, Any] | None = None, query_name: str | None = None,
                    **keywords: Any) -> StreamingQuery:
    """Start a query that schedules one call per row of the streaming ``df``.

    ``keywords`` are those of ``schedule_dataframe`` (``task=``, ``id_col=``, ``delay_col=``
    or ``eta_col=``, ...): ids from the data make a replayed batch idempotent.
    ``checkpoint`` is the query's checkpoint location (required: without it a restart
    cannot replay). Each batch's summary is logged; ``on_batch(batch_id, summary,
    rejects)`` is called after the batch's write and before Spark commits it (if it
    raises, the query stops and the batch is replayed on restart); rejects are also
    written, when there are any, to ``<rejects_path>/batch_id=<id>`` as Parquet
    (overwritten by a replay). ``trigger`` is passed to ``DataStreamWriter.trigger``
    (e.g. ``{"processingTime": "10 seconds"}`` or ``{"availableNow": True}``).
    """
    if not df.isStreaming:
        raise InvalidOption("schedule_stream takes a streaming DataFrame (spark.readStream); "
                            "schedule a batch DataFrame with schedule_dataframe")
    if not isinstance(checkpoint, str) or not checkpoint:
        raise InvalidOption("checkpoint must be the query's checkpoint location, e.g. "
                            "'s3a://bucket/checkpoints/refunds'")
    if "run" in keywords:
        raise InvalidOption("schedule_stream names each batch's run itself (checkpoint, "
                            "query id and batch id); leave run= out")
    spark = df.sparkSession
    # The arguments are checked now, on no rows, rather than in the first batch.
    schedule_dataframe(spark.createDataFrame(spark.sparkContext.emptyRDD(), df.schema), app,
                       **keywords)
    writer = df.writeStream.foreachBatch(
        BatchWriter(app, checkpoint, keywords, on_batch, rejects_path))
    writer = writer.option("checkpointLocation", checkpoint)
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    return writer.start()


class BatchWriter:
    """The ``foreachBatch`` function of ``schedule_stream`` (usable on its own with a
    ``writeStream`` you configure, given the same checkpoint location)."""

    def __init__(self, app: Celery, checkpoint: str, keywords: dict[str, Any],
                 on_batch: OnBatch | None = None, rejects_path: str | None = None) -> None:
        self.app, self.keywords = app, keywords
        self.on_batch, self.rejects_path = on_batch, rejects_path
        self._stream = hashlib.sha256(checkpoint.encode()).hexdigest()[:16]

    def run(self, batch_id: int, query: str | None = None) -> str:
        """The name of a batch's call: the same when the batch is replayed, another for
        a new query (``query``: its id) on a deleted checkpoint at the same path."""
        return f"stream-{self._stream}-{query or ''}-{batch_id}"

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        # Kept in the checkpoint: a restart keeps it, a deleted checkpoint changes it.
        query = batch.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        # batch_id - 1 is committed, or Spark would have replayed it instead
        forget_run(DelayQConfig.from_app(self.app), self.run(batch_id - 1, query))
        batch.persist()  # read more than once (duplicate ids, write, rejects), from a source
        try:             # that may be costly to read; a lost block is read again, exactly
            summary, rejects = schedule_dataframe(batch, self.app,
                                                  run=self.run(batch_id, query),
                                                  **self.keywords)
        finally:
            batch.unpersist()
        logger.info("batch %d: %d scheduled, %d existed, %d rejected (%d with an eta past)",
                    batch_id, summary.scheduled, summary.existed, summary.rejected,
                    summary.past)
        if self.rejects_path and summary.rejected:
            rejects.write.mode("overwrite").parquet(
                f"{self.rejects_path.rstrip('/')}/batch_id={batch_id}")
        if self.on_batch is not None:
            self.on_batch(batch_id, summary, rejects)
