"""``make demo`` in its non-interactive smoke mode: every process, real ports, clean stop."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_demo_smoke_mode_runs_the_whole_shop_and_stops_cleanly():
    done = subprocess.run([sys.executable, "-m", "demo_project.run", "--smoke"], cwd=ROOT,
                          capture_output=True, text=True, timeout=110)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "smoke: ok" in out and "password: " in out
    assert out.count("password: ") == 1, "the admin password is printed once"
    assert done.stdout.rstrip().endswith("stopped."), out[-1000:]  # stderr: the logs
    assert "1 held by the pause of refunds until resumed" in out
