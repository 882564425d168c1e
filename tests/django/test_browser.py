"""Headless Chromium sees the pending-work chart and cancels an order timeout in the admin."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import pytest

from tests.browser import chromium
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "admin-changelist.png"


@pytest.fixture
def browser():
    with chromium() as driver:
        yield driver


def test_support_user_filters_order_timeouts_and_cancels_one_in_the_browser(
        live_server, browser, settings, shop_delayq, shop_worker, shop_carrier, sync,
        tmp_path):
    from django.contrib.auth.models import User
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    from shop import services
    from shop.models import Order

    from celery_delayq.contrib.django.models import DelayedTask

    settings.SHOP_ORDER_TIMEOUT = 1800
    orders = [services.place_order(name, total) for name, total in
              [("Ada", "19.90"), ("Grace", "249.00"), ("Linus", "5.50")]]
    paid = services.place_order("Ken", "120.00")
    services.pay(paid)
    services.request_refund(paid, "120.00")
    sync.run_once()
    password = secrets.token_urlsafe(16)
    User.objects.create_superuser("support", password=password)
    doomed = orders[1]

    browser.get(f"{live_server.url}/admin/delayq/delayedtask/")
    browser.find_element(By.NAME, "username").send_keys("support")
    browser.find_element(By.NAME, "password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    browser.find_element(By.LINK_TEXT, "scheduled").click()
    browser.find_element(By.LINK_TEXT, "shop.tasks.close_unpaid_order").click()
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 3, "filtered to the three pending order timeouts"
    chart = browser.find_element(By.CSS_SELECTOR, "svg.delayq-chart")
    assert chart.is_displayed() and chart.size["height"] > 100
    bars = chart.find_elements(By.CSS_SELECTOR, "rect.bar")
    assert all(bar.is_displayed() and bar.size["height"] > 0 for bar in bars)
    assert sum(int(bar.get_attribute("data-count")) for bar in bars) == 3
    assert {bar.get_attribute("data-task") for bar in bars} == {
        "shop.tasks.close_unpaid_order"}, "the chart follows the list's filters"
    browser.save_screenshot(str(tmp_path / "filtered.png"))

    pk = DelayedTask.objects.get(job_id=f"order:{doomed.pk}:close").pk
    browser.find_element(By.CSS_SELECTOR, f"input[name=_selected_action][value='{pk}']").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("cancel_tasks")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    message = browser.find_element(By.CSS_SELECTOR, "ul.messagelist li").text
    assert message.lower() == f"cancelled: 1 task (order:{doomed.pk}:close)"

    assert shop_delayq.get(f"order:{doomed.pk}:close") is None, "the store still holds it"
    assert shop_delayq.run_now(f"order:{doomed.pk}:close") is False
    for order in (orders[0], orders[2]):  # the others still run, right now
        assert shop_delayq.run_now(f"order:{order.pk}:close") is True
    wait_for(lambda: Order.objects.filter(status="closed").count() == 2, what="2 closed")
    wait_for(lambda: sync.run_once() >= 0 and DelayedTask.objects.filter(
        state="succeeded").count() == 2, what="mirror shows 2 succeeded")
    assert Order.objects.get(pk=doomed.pk).status == "unpaid", "the cancelled task ran"
    assert not DelayedTask.objects.get(job_id=f"order:{doomed.pk}:close").events.filter(
        event__in=["promoted", "started"]).exists()

    for hours, task, count in [(2, "close_unpaid_order", 3), (3, "close_unpaid_order", 6),
                               (3, "check_refund_status", 1), (4, "close_unpaid_order", 2)]:
        for n in range(count):  # a wave of pending work for the chart in the screenshot
            shop_delayq.schedule(f"shop.tasks.{task}", args=(900 + n,), key=f"wave:{900 + n}",
                                 delay=hours * 3600 + n * 60, job_id=f"wave:{hours}:{task}:{n}")
    sync.run_once()
    browser.set_window_size(1280, 1200)
    browser.get(f"{live_server.url}/admin/delayq/delayedtask/?o=-3")
    bars = browser.find_elements(By.CSS_SELECTOR, "svg.delayq-chart rect.bar")
    assert sum(int(bar.get_attribute("data-count")) for bar in bars) >= 12
    shot = tmp_path / "changelist.png"
    browser.save_screenshot(str(shot))
    if os.environ.get("DELAYQ_UPDATE_SCREENSHOT"):  # refresh the README's picture
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)
