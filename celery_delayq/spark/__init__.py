"""Spark jobs of celery-delayq: bulk scheduling from DataFrames and streams, lateness report.

Needs the ``spark`` extra: ``pip install 'celery-delayq[spark]'``.
"""

from .schedule import PartitionProgress, Summary, schedule_dataframe
from .streaming import BatchWriter, schedule_stream

__all__ = ["BatchWriter", "PartitionProgress", "Summary", "schedule_dataframe",
           "schedule_stream"]
