"""What every benchmark prints and writes: timestamped progress and its JSON result."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

_T0 = time.monotonic()


def say(message: str) -> None:
    """A progress line, stamped with the seconds since the benchmark started."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", flush=True)


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write a benchmark's result as JSON (``bench/results/`` keeps them out of git)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    say(f"wrote {path}")
