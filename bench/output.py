"""What every benchmark prints and writes: timestamped progress and its JSON result."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
_T0 = time.monotonic()


def say(message: str) -> None:
    """A progress line, stamped with the seconds since the benchmark started."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", flush=True)


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write a benchmark's result as JSON (``bench/results/`` keeps them out of git)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    say(f"wrote {path}")


def options(argv: list[str] | None, name: str, doc: str, size: tuple[str, int, str],
            quick: dict[str, int], quick_help: str) -> argparse.Namespace:
    """The command line of ``python -m bench.<name>``: its size option (flag, default,
    help), ``--repeat``, ``--quick`` (the values ``quick`` gives) and ``--out`` (default
    ``bench/results/<name>[-quick].json``)."""
    parser = argparse.ArgumentParser(prog=f"python -m bench.{name}",
                                     description=doc.splitlines()[0])
    flag, default, help_ = size
    parser.add_argument(flag, type=int, default=default, help=help_)
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (medians reported)")
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", type=Path, default=None)
    opts = parser.parse_args(argv)
    if opts.quick:
        vars(opts).update(quick)
    if opts.out is None:
        opts.out = RESULTS / f"{name}{'-quick' if opts.quick else ''}.json"
    return opts
