"""The ``delayq`` pytest fixture, run by pytest itself on a small user project (pytester)."""

from __future__ import annotations

import textwrap

import pytest
import redis

pytest_plugins = ["pytester"]

SHOP = '''
"""A user's project: an unpaid order is closed after 30 minutes unless it is paid."""
from datetime import timedelta

from celery import Celery

from celery_delayq import DelayedTask, DelayQ

app = Celery("shop", broker="memory://", set_as_current=False)
app.conf.task_serializer = "json"
app.conf.delayq_http_allowed_hosts = ["127.0.0.1"]
ORDERS: dict[int, str] = {}
CHARGES: list[int] = []


@app.task(base=DelayedTask, name="shop.close_unpaid_order")
def close_unpaid_order(order_id):
    if ORDERS[order_id] == "unpaid":
        ORDERS[order_id] = "closed"
    return ORDERS[order_id]


@app.task(base=DelayedTask, bind=True, name="shop.charge", max_retries=3)
def charge(self, order_id):
    CHARGES.append(self.request.retries)
    if self.request.retries == 0:
        raise self.retry(countdown=60)
    ORDERS[order_id] = "paid"


@app.task(base=DelayedTask, name="shop.broken")
def broken():
    raise ValueError("the shop is broken")


def place_order(order_id):
    ORDERS[order_id] = "unpaid"
    close_unpaid_order.apply_delayed([order_id], delay=timedelta(minutes=30),
                                     job_id=f"order:{order_id}:close", key=f"order:{order_id}")


def pay(order_id):
    ORDERS[order_id] = "paid"
    DelayQ.of(app).cancel_key(f"order:{order_id}")
'''

INI = """
[pytest]
delayq_app = shop:app
filterwarnings = error
"""


@pytest.fixture
def shop(pytester: pytest.Pytester, redis_server, monkeypatch) -> pytest.Pytester:
    """A user project in a temporary folder, its Redis the session's (database 5)."""
    pytester.makepyfile(shop=SHOP)
    pytester.makeini(INI)
    monkeypatch.setenv("DELAYQ_PYTEST_REDIS_URL", f"{redis_server.url}/5")
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)  # set by this suite's ini
    return pytester


def run(pytester: pytest.Pytester, tests: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_user=textwrap.dedent(tests))
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_order_timeout_runs_after_advancing_30_minutes_without_sleeping(shop):
    result = run(shop, """
        import time
        from shop import ORDERS, place_order

        def test_unpaid_order_closes_after_30_minutes(delayq):
            started = time.monotonic()
            place_order(42)
            [job] = delayq.pending(task="shop.close_unpaid_order")
            assert job.job_id == "order:42:close"

            assert delayq.advance(minutes=29) == []
            assert ORDERS[42] == "unpaid"

            [ran] = delayq.advance(minutes=1)
            assert (ran.job_id, ran.state, ran.result) == ("order:42:close", "SUCCESS", "closed")
            assert ORDERS[42] == "closed"
            assert delayq.pending() == []
            assert time.monotonic() - started < 5
    """)
    result.assert_outcomes(passed=1)


def test_cancelled_timeout_is_listed_and_never_runs(shop):
    result = run(shop, """
        from shop import ORDERS, pay, place_order

        def test_paid_order_is_not_closed(delayq):
            place_order(7)
            pay(7)
            assert delayq.pending() == []
            assert delayq.cancelled() == ["order:7:close"]
            assert delayq.advance(hours=2) == []
            assert ORDERS[7] == "paid"
    """)
    result.assert_outcomes(passed=1)


def test_a_dropped_dead_letter_is_not_listed_as_a_cancelled_job(shop):
    """Its id may be scheduled again meanwhile, that job pending: it was not cancelled."""
    result = run(shop, """
        from shop import place_order

        def test_drop(delayq):
            store = delayq.delayq.store
            store.bury("order:7:close", "order:7", '{"t":"shop.close_unpaid_order"}\\n[7]\\n',
                       "unknown queue")
            place_order(7)  # the same timeout id, scheduled again
            assert store.drop("order:7:close", by="ops")
            assert [job.job_id for job in delayq.pending()] == ["order:7:close"]
            assert delayq.cancelled() == []
    """)
    result.assert_outcomes(passed=1)


def test_delays_count_from_the_test_clock_after_advancing(shop):
    result = run(shop, """
        from shop import ORDERS, place_order

        def test_timeout_placed_later_still_waits_its_30_minutes(delayq):
            delayq.advance(hours=5)
            before = delayq.now()
            place_order(8)
            [job] = delayq.pending()
            assert abs((job.due - before).total_seconds() - 1800) < 5
            delayq.advance(minutes=29)
            assert ORDERS[8] == "unpaid"
            delayq.advance(minutes=1)
            assert ORDERS[8] == "closed"
    """)
    result.assert_outcomes(passed=1)


def test_a_call_that_expires_before_it_is_due_is_revoked_on_the_test_clock(shop):
    """As a worker discards it: never run, REVOKED; a relative expiry, like a delay, counts
    from the test clock."""
    result = run(shop, """
        from datetime import timedelta

        from celery import signals

        from shop import ORDERS, close_unpaid_order

        def test_expired(delayq):
            revoked = []
            signals.task_revoked.connect(
                lambda request=None, expired=False, **_: revoked.append((request.id, expired)),
                weak=False)
            ORDERS[1] = ORDERS[2] = ORDERS[3] = "unpaid"
            late = close_unpaid_order.apply_async([1], countdown=3600, expires=1800)
            close_unpaid_order.apply_delayed([2], delay=3600,
                                             expires=delayq.now() + timedelta(minutes=30))
            [late_run, _] = delayq.advance(hours=2)
            assert (late_run.job_id, late_run.state) == (late.id, "REVOKED")
            assert ORDERS[1] == ORDERS[2] == "unpaid"
            assert revoked[0] == (late.id, True)

            [ran] = (close_unpaid_order.apply_async([3], countdown=3600, expires=7200),
                     delayq.advance(hours=1))[1]
            assert ran.state == "SUCCESS" and ORDERS[3] == "closed"
    """)
    result.assert_outcomes(passed=1)


def test_a_retry_goes_back_to_the_store_and_waits_for_its_countdown(shop):
    result = run(shop, """
        from shop import CHARGES, ORDERS, charge

        def test_charge_retried_a_minute_later(delayq):
            ORDERS[9] = "unpaid"
            charge.apply_delayed([9], delay=0)
            [first] = delayq.run_due()
            assert first.state == "RETRY"
            [retry] = delayq.pending(task="shop.charge")
            assert 55 < (retry.due - delayq.now()).total_seconds() <= 60

            assert delayq.advance(seconds=50) == []
            [second] = delayq.advance(seconds=10)
            assert second.state == "SUCCESS"
            assert CHARGES == [0, 1] and ORDERS[9] == "paid"

        def test_advance_runs_a_chain_of_retries_in_one_go(delayq):
            ORDERS[10] = "unpaid"
            charge.apply_delayed([10], delay=30)
            runs = delayq.advance(minutes=2)
            assert [r.state for r in runs] == ["RETRY", "SUCCESS"]
            assert ORDERS[10] == "paid"
    """)
    result.assert_outcomes(passed=2)


def test_a_failing_task_raises_from_advance(shop):
    result = run(shop, """
        import pytest
        from shop import broken

        def test_error_surfaces(delayq):
            broken.apply_delayed(delay=10)
            with pytest.raises(ValueError, match="broken"):
                delayq.advance(seconds=10)

        def test_error_collected_without_propagate(delayq):
            broken.apply_delayed(delay=10)
            [ran] = delayq.advance(seconds=10, propagate=False)
            assert ran.state == "FAILURE" and isinstance(ran.result, ValueError)
    """)
    result.assert_outcomes(passed=2)


def test_each_test_gets_an_empty_store_and_leaves_no_keys_behind(shop, redis_server):
    result = run(shop, """
        import pytest
        from shop import place_order

        @pytest.mark.parametrize("order_id", [1, 2])
        def test_starts_empty(delayq, order_id):
            assert delayq.pending() == []
            place_order(order_id)
            assert len(delayq.pending()) == 1
    """)
    result.assert_outcomes(passed=2)
    client = redis.Redis.from_url(f"{redis_server.url}/5")
    assert list(client.scan_iter("delayq-test-*")) == []
    client.close()


def test_the_app_can_come_from_an_overridden_fixture(shop):
    shop.makeini("[pytest]\n")
    shop.makeconftest("""
        import pytest
        import shop

        @pytest.fixture
        def delayq_app():
            return shop.app
    """)
    result = run(shop, """
        from shop import ORDERS, place_order

        def test_closes(delayq):
            place_order(3)
            delayq.advance(minutes=30)
            assert ORDERS[3] == "closed"
    """)
    result.assert_outcomes(passed=1)


def test_without_an_app_the_fixture_says_how_to_name_one(shop):
    shop.makeini("[pytest]\n")
    result = run(shop, """
        def test_needs_app(delayq):
            pass
    """)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*delayq_app = \\\"module:app\\\"*"])


def test_a_redis_server_is_started_when_none_is_configured(shop, monkeypatch):
    monkeypatch.delenv("DELAYQ_PYTEST_REDIS_URL")
    result = run(shop, """
        from shop import ORDERS, place_order

        def test_own_server(delayq, delayq_redis_url):
            assert delayq_redis_url.startswith("redis://127.0.0.1:")
            place_order(4)
            delayq.advance(minutes=30)
            assert ORDERS[4] == "closed"
    """)
    result.assert_outcomes(passed=1)


def test_http_callback_retries_follow_the_default_schedule_on_the_test_clock(shop):
    result = run(shop, """
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from shop import app

        def test_failing_partner_is_retried_then_dead_lettered(delayq):
            seen = []

            class Partner(BaseHTTPRequestHandler):
                def do_POST(self):
                    seen.append(delayq.now())
                    self.send_response(500)
                    self.send_header("Content-Length", "4")
                    self.end_headers()
                    self.wfile.write(b"down")

                def log_message(self, *args):
                    pass

            server = ThreadingHTTPServer(("127.0.0.1", 0), Partner)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            try:
                app.tasks["celery_delayq.http_callback"].apply_delayed(
                    [f"http://127.0.0.1:{server.server_address[1]}/hook"],
                    {"json": {"order": 1}}, delay=60)
                runs = delayq.advance(hours=3, propagate=False)
            finally:
                server.shutdown()
                server.server_close()

            assert [r.state for r in runs] == ["RETRY"] * 5 + ["FAILURE"]
            gaps = [round((b - a).total_seconds()) for a, b in zip(seen, seen[1:])]
            assert gaps == [10, 60, 300, 1800, 7200]
            [dead] = delayq.dead()
            assert "HTTP 500: 'down'" in dead["reason"]
    """)
    result.assert_outcomes(passed=1)


def test_jobs_of_a_batch_with_a_task_not_registered_here_stay_pending(shop):
    """A job calling another service's task stops ``run_due`` with an error saying how to
    fix it: the jobs due before it run, it and the rest of its batch stay in the store."""
    result = run(shop, """
        import time

        import pytest
        from celery_delayq import DelayQ
        from celery_delayq.errors import DelayQError
        from shop import ORDERS, app, close_unpaid_order

        def test_nothing_is_lost(delayq):
            for n in range(6):
                ORDERS[n] = "unpaid"
                if n == 2:
                    DelayQ.of(app).schedule("other.service.task", [n],
                                            delay=0.001 * (n + 1), job_id=f"j{n}")
                else:
                    close_unpaid_order.apply_delayed([n], delay=0.001 * (n + 1),
                                                     job_id=f"j{n}")
            time.sleep(0.05)  # all six due on Redis's clock: one claimed batch

            with pytest.raises(DelayQError, match="'other.service.task'.*import the module"):
                delayq.run_due()
            assert [run.job_id for run in delayq.runs] == ["j0", "j1"]
            assert [job.job_id for job in delayq.pending()] == ["j2", "j3", "j4", "j5"]
            assert delayq.dead() == []
            assert [n for n, state in ORDERS.items() if state == "closed"] == [0, 1]

            @app.task(name="other.service.task")  # the fix the error names
            def other(n):
                return n

            assert sorted(run.job_id for run in delayq.run_due()) == ["j2", "j3", "j4", "j5"]
            assert delayq.pending() == []
            assert all(state == "closed" for n, state in ORDERS.items() if n != 2)
    """)
    result.assert_outcomes(passed=1)


def test_a_job_advance_pulled_in_that_cannot_run_keeps_its_due_time(shop):
    """``advance`` makes a job due on Redis's clock to run it: one given back kept that
    moved time (35 s early in the review's run)."""
    result = run(shop, """
        import pytest
        from celery_delayq import DelayQ
        from celery_delayq.errors import DelayQError
        from shop import app

        def test_kept(delayq):
            DelayQ.of(app).schedule("other.service.task", [1], delay=3600, job_id="j")
            due = delayq.get("j").due

            with pytest.raises(DelayQError, match="'other.service.task'"):
                delayq.advance(hours=2)

            assert [(job.job_id, job.due) for job in delayq.pending()] == [("j", due)]
    """)
    result.assert_outcomes(passed=1)


PLAIN = '''
"""Tasks of the user's project that are not delayed tasks."""
from shop import app


@app.task(name="shop.plain")
def plain(x):
    return x
'''


def test_after_the_fixture_an_app_that_had_not_opted_in_is_as_before(shop):
    """A later test without the fixture sees the app as it was: a countdown and a revoke
    on memory:// work without a Redis URL, and nothing of celery-delayq is left on it."""
    shop.makepyfile(plain=PLAIN)
    result = run(shop, """
        from celery import Celery
        from celery.app.control import Control
        from celery_delayq import DelayQ
        from plain import plain
        from shop import app, place_order

        def test_a_uses_the_fixture(delayq):
            place_order(1)  # opts in too (the same DelayQ)
            app.send_task("shop.plain", (1,), countdown=600)  # parked in the test store
            app.control.revoke("4b7c0a3e-0000-0000-0000-000000000000")
            assert len(delayq.pending()) == 2
            assert "celery_delayq.http_callback" in app.tasks  # the app is finalized

        def test_b_countdown_without_the_fixture():
            assert DelayQ.lookup(app) is None
            assert "send_task" not in vars(app)
            assert app.send_task("shop.plain", (1,), countdown=600).id
            assert plain.apply_async((1,), countdown=600).id
            assert DelayQ.lookup(app) is None

        def test_c_revoke_without_the_fixture():
            assert type(app.control) is Control
            app.control.revoke("4b7c0a3e-0000-0000-0000-000000000000")
            assert "celery_delayq.http_callback" not in app.tasks
            assert DelayQ.lookup(app) is None
    """)
    result.assert_outcomes(passed=3)


def test_an_app_the_project_opted_in_during_the_test_stays_opted_in(shop):
    """A module doing ``DelayQ(app)`` imported while the test ran (lazily, or by Celery's
    autodiscovery at finalize): the project opted in, not only the fixture."""
    shop.makepyfile(opting_in="""
        from celery_delayq import DelayQ
        from shop import app

        DelayQ(app)
    """)
    result = run(shop, """
        from celery_delayq import DelayQ
        from shop import app

        def test_a_imports_the_module_that_opts_in(delayq):
            import opting_in  # noqa: F401

        def test_b_the_app_is_still_opted_in():
            assert DelayQ.lookup(app) is not None
            assert "send_task" in vars(app)
    """)
    result.assert_outcomes(passed=2)


def test_after_the_fixture_the_apps_own_send_task_and_control_class_are_back(shop):
    """What the user had set on the app before the test is theirs again afterwards."""
    shop.makepyfile(plain=PLAIN)
    shop.makeconftest("""
        import pytest
        from celery.app.control import Control
        import shop

        SENT = []

        class AuditedControl(Control):
            pass

        def own_send_task(name, *args, **kwargs):
            SENT.append(name)
            return type(shop.app).send_task(shop.app, name, *args, **kwargs)

        @pytest.fixture
        def delayq_app():
            shop.app.send_task = own_send_task
            shop.app.control_cls = AuditedControl
            return shop.app
    """)
    result = run(shop, """
        from conftest import SENT, AuditedControl, own_send_task
        from celery_delayq import DelayQ
        from shop import app

        def test_a_uses_the_fixture(delayq):
            app.send_task("shop.plain", (1,), countdown=600)
            assert [job.task for job in delayq.pending()] == ["shop.plain"]
            assert type(app.control) is not AuditedControl

        def test_b_without_the_fixture():
            assert DelayQ.lookup(app) is None
            assert vars(app)["send_task"] is own_send_task
            assert app.control_cls is AuditedControl and type(app.control) is AuditedControl
            app.send_task("shop.plain", (1,), countdown=600)
            assert SENT == ["shop.plain"]
    """)
    result.assert_outcomes(passed=2)


def test_after_the_fixture_an_already_created_control_is_celerys_again(shop):
    shop.makepyfile(plain=PLAIN)
    result = run(shop, """
        from celery.app.control import Control
        from shop import app

        CONTROL = app.control  # created before any test

        def test_a_uses_the_fixture(delayq):
            assert app.control is CONTROL and type(CONTROL) is not Control

        def test_b_without_the_fixture():
            assert app.control is CONTROL and type(CONTROL) is Control
            CONTROL.revoke("4b7c0a3e-0000-0000-0000-000000000000")
            assert not app.finalized
            assert "celery_delayq.http_callback" not in app.tasks  # finalized only now
    """)
    result.assert_outcomes(passed=2)


def test_an_app_that_opted_in_before_the_test_stays_opted_in(shop):
    result = run(shop, """
        from celery_delayq import DelayQ
        from shop import app

        OPTED_IN = DelayQ(app)
        app.conf.delayq_redis_url = "redis://127.0.0.1:1/0"  # the app's own store

        def test_a_uses_the_fixture(delayq):
            assert delayq.delayq is OPTED_IN

        def test_b_without_the_fixture():
            assert DelayQ.lookup(app) is OPTED_IN
            assert "send_task" in vars(app)
            assert "celery_delayq.http_callback" in app.tasks
            assert OPTED_IN.config.redis_url == "redis://127.0.0.1:1/0"
    """)
    result.assert_outcomes(passed=2)
