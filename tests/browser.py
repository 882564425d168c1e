"""Headless Chromium (Debian's ``chromium`` and ``chromium-driver``) for browser tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--window-size=1280,860")


@contextmanager
def chromium() -> Iterator:
    """A Selenium driver of headless Chromium that keeps the console log; the test is
    skipped, saying what to install, when Chromium or chromedriver is missing."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_binary = shutil.which("chromedriver")
    if not (binary and driver_binary):
        pytest.skip("headless Chromium not found; to run this test install it with "
                    "`apt-get install -y chromium chromium-driver`")
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is in the dev extra: pip install -e '.[dev]'")

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options,
                              service=webdriver.ChromeService(executable_path=driver_binary))
    driver.implicitly_wait(5)
    try:
        yield driver
    finally:
        driver.quit()
