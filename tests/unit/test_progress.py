"""A long command's running count: said at most once a second, never before the first."""

from __future__ import annotations

from celery_delayq import progress


def test_progress_says_the_running_count_at_most_once_a_second(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    said: list[str] = []
    tell = progress.Progress(said.append, "replayed")
    for seconds, done in ((0.5, 500), (1.0, 1000), (1.5, 1500), (2.5, 2500), (2.6, 3000)):
        now[0] = 100.0 + seconds
        tell(done)
    assert said == ["replayed 1,000 so far", "replayed 2,500 so far"]
