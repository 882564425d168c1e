"""Shift this process's wall clock by ``DELAYQ_TEST_CLOCK_SKEW`` seconds (a skewed host)."""

import os
import time

_skew = float(os.environ.get("DELAYQ_TEST_CLOCK_SKEW", "0"))
if _skew:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _skew
    time.time_ns = lambda: _time_ns() + int(_skew * 1e9)
