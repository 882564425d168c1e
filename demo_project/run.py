"""``make demo``: Redis, a Celery worker, the carrier, the journal sync and the shop's admin.

Starts (or reuses) Redis at ``REDIS_URL`` (default ``redis://127.0.0.1:6379``), migrates the
SQLite database, creates the user ``admin`` with a new random password printed once,
starts the processes, seeds a few orders and refunds (into an empty shop only: a later
start adds none) and serves the admin on http://127.0.0.1:8000/admin/ until Ctrl-C.
``--smoke`` runs everything on free ports with short timeouts, checks that an unpaid order
closes, two with long timeouts stay pending, the refund check on the paused queue is held
until resumed and the admin answers (showing the pause), and exits.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import redis

from celery_delayq.testing.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / ".data"
DEFAULT_REDIS = "redis://127.0.0.1:6379"


class Demo:
    """The demo's processes; ``stop()`` ends them in reverse order of start."""

    def __init__(self, data: Path, redis_url: str, port: int, env: dict[str, str]) -> None:
        self.data = data
        self.redis_url = redis_url
        self.port = port
        self.env = env
        self.redis: RedisServer | None = None
        self.processes: list[tuple[str, subprocess.Popen]] = []

    def start_redis(self) -> str:
        """Use a Redis already answering at ``redis_url``, else start one there."""
        try:
            redis.Redis.from_url(self.redis_url, socket_connect_timeout=0.5).ping()
            return f"using the Redis already running at {self.redis_url}"
        except redis.ConnectionError:
            pass
        parts = urllib.parse.urlsplit(self.redis_url)
        if parts.hostname not in ("127.0.0.1", "localhost"):
            raise SystemExit(f"no Redis answers at {self.redis_url}; start it or unset REDIS_URL")
        directory = self.data / "redis"
        directory.mkdir(parents=True, exist_ok=True)
        self.redis = RedisServer(parts.port or 6379, appendonly=True, directory=str(directory),
                                 own_session=True).start()  # stopped last, by us
        return f"started redis-server at {self.redis_url} (data in {directory})"

    def spawn(self, name: str, *argv: str) -> None:
        log = open(self.data / "logs" / f"{name}.log", "ab")  # noqa: SIM115 (closed in stop)
        process = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=self.env,
                                   stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # Ctrl-C reaches only us
        log.close()
        self.processes.append((name, process))

    def start_processes(self) -> None:
        (self.data / "logs").mkdir(parents=True, exist_ok=True)
        celery = ("-m", "celery", "-A", "demo_project.celery_app")
        # the default queue, and "refunds" (seed_demo.PAUSED) once the seed's pause ends
        self.spawn("worker", *celery, "worker", "--pool", "threads", "--concurrency", "4",
                   "--queues", "celery,refunds", "--loglevel", "INFO")
        self.spawn("carrier", *celery, "delayq", "carrier")
        self.spawn("sync", "-m", "django", "delayq_sync")
        self.spawn("web", "-m", "django", "runserver", f"127.0.0.1:{self.port}", "--noreload")

    def dead(self) -> list[str]:
        return [name for name, process in self.processes if process.poll() is not None]

    def stop(self) -> None:
        for _name, process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for name, process in reversed(self.processes):
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                print(f"{name} did not stop in 15 s; killing it", flush=True)
                process.kill()
                process.wait(5)
        self.processes.clear()
        if self.redis is not None:
            self.redis.stop()  # keeps its data directory: pending tasks survive a restart
            self.redis = None


def setup_django(password: str) -> str:
    """Migrate, create or reset the ``admin`` superuser; returns its user name."""
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(
        username="admin", defaults={"is_staff": True, "is_superuser": True})
    user.is_staff = user.is_superuser = True
    user.set_password(password)
    user.save()
    return user.get_username()


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {timeout:g} s")
        time.sleep(0.2)


def admin_page(base: str, user: str, password: str, path: str) -> str:
    """Log into the admin like a browser and return the HTML of ``path``."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    login = f"{base}/admin/login/"
    html = opener.open(login, timeout=10).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)
    data = urllib.parse.urlencode({"csrfmiddlewaretoken": token, "username": user,
                                   "password": password, "next": path}).encode()
    request = urllib.request.Request(login, data=data, headers={"Referer": login})
    return opener.open(request, timeout=10).read().decode()


def smoke_check(base: str, user: str, password: str, timeout: float = 60.0) -> None:
    """The seeded order on ``SHOP_ORDER_TIMEOUT`` closes, the two with long timeouts stay
    pending, paid ones stay paid, two refunds get decided, the admin lists the mirrored
    tasks under the banner of the paused queue whose refund check it holds, and that refund
    is decided once the queue is resumed."""
    from shop.management.commands.seed_demo import PAUSED
    from shop.models import Order, Refund

    from celery_delayq.contrib.django.models import DelayedTask
    from demo_project.celery_app import delayq

    deadline = time.monotonic() + timeout
    while True:
        closed = Order.objects.filter(status=Order.Status.CLOSED).count()
        decided = Refund.objects.exclude(status=Refund.Status.REQUESTED).count()
        mirrored = DelayedTask.objects.filter(task="shop.tasks.close_unpaid_order",
                                              state="succeeded").count()
        if closed == 1 and decided == 2 and mirrored == 1:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"after {timeout:g} s: {closed}/1 orders closed, {decided}/2 "
                               f"refunds decided, {mirrored}/1 timeouts mirrored as succeeded")
        time.sleep(0.3)
    assert Order.objects.filter(status=Order.Status.PAID).count() == 3, "a paid order closed"
    assert Order.objects.filter(status=Order.Status.UNPAID).count() == 2, "an order closed early"
    assert DelayedTask.objects.pending().filter(task="shop.tasks.close_unpaid_order").count() == 2
    [held] = [job for job in delayq.pending(task="shop.tasks.check_refund_status")
              if job.queue == PAUSED]
    assert held.paused, f"the check on the paused queue is due but not held: {held}"
    html = admin_page(base, user, password, "/admin/delayq/delayedtask/")
    assert "close_unpaid_order" in html and "check_refund_status" in html, html[:500]
    assert 'class="delayq-paused"' in html and f"queue <code>{PAUSED}</code>" in html, html[:500]
    released = delayq.resume(queue=PAUSED, by="smoke check")
    while Refund.objects.exclude(status=Refund.Status.REQUESTED).count() < 3:
        if time.monotonic() > deadline:
            raise RuntimeError(f"after {timeout:g} s: the refund held by the pause of {PAUSED} "
                               f"was not decided once resumed ({released} released)")
        time.sleep(0.3)
    print(f"smoke: ok ({closed} orders closed on time, {decided} refunds decided, 1 held by "
          f"the pause of {PAUSED} until resumed, admin lists "
          f"{DelayedTask.objects.count()} delayed tasks)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="run on free ports with short timeouts, check, stop, exit")
    parser.add_argument("--port", type=int, default=8000, help="runserver port (default 8000)")
    opts = parser.parse_args(argv)

    env = dict(os.environ, DJANGO_SETTINGS_MODULE="demo_project.settings",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    env.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))  # one key for all processes
    data = DATA
    port = opts.port
    if opts.smoke:
        data = Path(tempfile.mkdtemp(prefix="delayq-demo-"))
        port = free_port()
        env.update(REDIS_URL=f"redis://127.0.0.1:{free_port()}", DEMO_DB=str(data / "db.sqlite3"),
                   SHOP_ORDER_TIMEOUT="2", SHOP_REFUND_GAPS="0.5,1")
    env.setdefault("REDIS_URL", DEFAULT_REDIS)
    data.mkdir(parents=True, exist_ok=True)
    os.environ.update(env)  # this process seeds and checks through the same settings

    demo = Demo(data, env["REDIS_URL"], port, env)
    stop = {"requested": False}

    def request_stop(*_):
        stop["requested"] = True

    signal.signal(signal.SIGTERM, request_stop)
    try:
        print(demo.start_redis(), flush=True)
        password = secrets.token_urlsafe(12)
        user = setup_django(password)
        demo.start_processes()
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/admin/login/", 30)
        from django.conf import settings
        from django.core.management import call_command

        call_command("seed_demo")
        print(f"\nThe demo shop runs at {base}/admin/\n"
              f"  user:     {user}\n"
              f"  password: {password}   (new and random each start; shown only here)\n"
              f"  logs:     {data / 'logs'}\n"
              f"An order you add closes after {settings.SHOP_ORDER_TIMEOUT:g} s unless paid "
              "(SHOP_ORDER_TIMEOUT); the seeded ones at the times above.\n"
              "Orders and tasks persist across starts (the README says how to start afresh).\n"
              "Ctrl-C stops everything.\n", flush=True)
        if opts.smoke:
            smoke_check(base, user, password)
            return 0
        while not stop["requested"]:
            dead = demo.dead()
            if dead:
                print(f"{', '.join(dead)} stopped unexpectedly; see {data / 'logs'}", flush=True)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping the demo ...", flush=True)
        demo.stop()
        if opts.smoke:
            shutil.rmtree(data, ignore_errors=True)
        print("stopped.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
