"""Headless Chromium: the pending-work chart, cancelling an order timeout in the admin, and
the admin's pages readable at 1400 and 800 px on the data the demo seeds (the screenshots in
docs/img, refreshed with ``DELAYQ_UPDATE_SCREENSHOT=1``)."""

from __future__ import annotations

import io
import secrets

import pytest

from tests.browser import chromium, screenshot
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

WIDTHS = (1400, 800)
REFUND_CHECK = "shop.tasks.check_refund_status"

#: Problems of each element matched by arguments[0] that a reader would meet: no size, text
#: wider than its cell, cut by an ancestor with ``overflow: hidden`` (past a scroll container,
#: what must fit is that container's box: the element is reached by scrolling it), or, once
#: scrolled into view, covered or outside the viewport. [text, problem or null] per element.
VISIBILITY = """
const out = [];
for (const el of document.querySelectorAll(arguments[0])) {
  const text = el.textContent.trim();
  let r = el.getBoundingClientRect(), problem = null, box = r;
  if (r.width < 1 || r.height < 1) problem = "has no size";
  else if (el.scrollWidth > el.clientWidth + 1) problem = "text wider than its cell";
  for (let a = el.parentElement; a && !problem; a = a.parentElement) {
    const s = getComputedStyle(a), b = a.getBoundingClientRect();
    if ([s.overflowX, s.overflowY].some(o => o === "auto" || o === "scroll")) box = b;
    else if ([s.overflowX, s.overflowY].some(o => o === "hidden" || o === "clip")
             && (box.left < b.left - 1 || box.right > b.right + 1 || box.top < b.top - 1
                 || box.bottom > b.bottom + 1)) problem = `cut off by ${a.tagName}.${a.className}`;
  }
  if (!problem) {
    el.scrollIntoView({block: "center", inline: "nearest"});
    r = el.getBoundingClientRect();
    const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    if (r.left < 0 || r.right > window.innerWidth) problem = "outside the viewport";
    else if (!hit || !(hit === el || el.contains(hit))) problem = "covered";
  }
  out.push([text, problem]);
}
window.scrollTo(0, 0);
document.querySelectorAll("*").forEach(e => { if (e.scrollLeft) e.scrollLeft = 0; });
return out;
"""


@pytest.fixture
def browser():
    with chromium() as driver:
        yield driver


def _log_in(browser, url: str, username: str, password: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(url)
    browser.find_element(By.NAME, "username").send_keys(username)
    browser.find_element(By.NAME, "password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()


def _unreadable(browser, selector: str) -> list[list]:
    """The elements matched by ``selector`` a reader cannot see whole, with the reason."""
    checked = browser.execute_script(VISIBILITY, selector)
    assert checked, f"nothing matches {selector}"
    return [item for item in checked if item[1]]


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

    _log_in(browser, f"{live_server.url}/admin/delayq/delayedtask/", "support", password)
    filters = (By.CSS_SELECTOR, "#changelist-filter")  # the table links the same names
    browser.find_element(*filters).find_element(By.LINK_TEXT, "scheduled").click()
    browser.find_element(*filters).find_element(
        By.LINK_TEXT, "shop.tasks.close_unpaid_order").click()
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


def test_admin_pages_show_every_column_and_readable_chart_text_at_1400_and_800_px_on_the_seeded_demo(  # noqa: E501
        live_server, browser, settings, shop_delayq, shop_worker, shop_carrier, sync,
        tmp_path):
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from selenium.webdriver.common.by import By
    from shop.models import Refund

    from celery_delayq.contrib.django.models import DelayedTask

    settings.SHOP_ORDER_TIMEOUT = 60  # the demo's own timings: what a newcomer sees
    settings.SHOP_REFUND_GAPS = [10, 30, 120, 300]
    call_command("seed_demo", stdout=io.StringIO())
    checks = {refund.order.customer: f"{refund.key}:check:0"
              for refund in Refund.objects.select_related("order")}

    def ten_seconds_in() -> bool:  # the first checks ran; Margaret's is held by the pause
        sync.run_once()
        ran = DelayedTask.objects.filter(job_id__in=[checks["Ken"], checks["Barbara"]],
                                         state="succeeded").count() == 2
        held = shop_delayq.get(checks["Margaret"])
        return ran and held is not None and held.paused

    wait_for(ten_seconds_in, timeout=30, what="the seeded first refund checks run or held")
    password = secrets.token_urlsafe(16)
    User.objects.create_superuser("admin", password=password)
    changelist = f"{live_server.url}/admin/delayq/delayedtask/"
    detail = (f"{live_server.url}/admin/delayq/delayedtask/"
              f"{DelayedTask.objects.get(job_id=checks['Ken']).pk}/change/")
    _log_in(browser, changelist, "admin", password)

    for width in WIDTHS:
        suffix = "" if width == WIDTHS[0] else f"-{width}"
        browser.set_window_size(width, 1100)
        browser.get(changelist)
        assert "held by a pause" in browser.find_element(By.ID, "result_list").text
        assert _unreadable(browser, "#result_list thead th") == [], f"changelist at {width}"
        assert _unreadable(browser, "#result_list tbody tr:first-child td") == []
        assert browser.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth"), \
            f"at {width} px the page scrolls sideways (only tables may)"
        heights = browser.execute_script(
            "return [...document.querySelectorAll('svg.delayq-chart text')]"
            ".map(t => t.getBoundingClientRect().height)")
        assert heights and min(heights) >= 11, f"chart text shrunk at {width} px: {heights}"
        screenshot(browser, tmp_path, f"admin-changelist{suffix}.png")

        browser.get(detail)
        assert _unreadable(browser, ".delayq-timeline th") == [], f"timeline at {width}"
        assert _unreadable(browser, ".delayq-timeline tbody tr:first-child td") == []
        assert _unreadable(browser, "fieldset .form-row label") == []
        assert browser.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth"), \
            f"at {width} px the detail page scrolls sideways"
        screenshot(browser, tmp_path, f"admin-detail{suffix}.png")
