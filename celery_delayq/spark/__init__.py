"""Spark jobs of celery-delayq: bulk scheduling from DataFrames, lateness report.

Needs the ``spark`` extra: ``pip install 'celery-delayq[spark]'``.
"""

from .schedule import PartitionProgress, Summary, schedule_dataframe

__all__ = ["PartitionProgress", "Summary", "schedule_dataframe"]
