"""Headless Chromium (Debian's ``chromium`` and ``chromium-driver``) for browser tests."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
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


def screenshot(driver, tmp_path: Path, name: str, *, relayout: bool = False) -> Path:
    """Save the whole page as ``tmp_path / name`` (the window made as tall as the page,
    then back; ``relayout`` reloads it at that size first, for pages that size their charts
    on load); copied into docs/img when DELAYQ_UPDATE_SCREENSHOT=1, so a test run changes
    the docs' pictures only when asked to."""
    size = driver.get_window_size()
    page, chrome = driver.execute_script(
        "return [document.documentElement.scrollHeight, window.outerHeight - innerHeight]")
    driver.set_window_size(size["width"], min(page + chrome, 2400))
    if relayout:
        driver.refresh()
    shot = tmp_path / name
    driver.save_screenshot(str(shot))
    driver.set_window_size(size["width"], size["height"])
    if os.environ.get("DELAYQ_UPDATE_SCREENSHOT"):
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMG / name)
    return shot
