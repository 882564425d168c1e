"""A delayed call behaves as the same call through Celery's own countdown, side by side.

One opted-in project (``parityproj``, written to a temporary directory) runs a real worker
and a real carrier in processes of their own. Each test makes a call twice from this
process: natively (Celery's own ``Task.apply_async`` / ``Celery.send_task``, which leave
the countdown to the broker and the worker) and delayed (``DelayedTask.apply_async`` /
the opted-in ``app.send_task``, through the store and the carrier), and compares what the
installed Celery made of each: no expected value is written down where Celery decides.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator

import pytest
from celery import Celery, Task

from celery_delayq import DelayedTask, DelayQ
from tests.compat.test_do_no_harm_imports import plain_environ
from tests.conftest import sent_natively, wait_for

DB, OWN_BACKEND_DB = 6, 10  # databases of the session's Redis no other suite uses
DONE = "parity:done"  # task ids, pushed when a run has ended (its result stored or not)

PROJECT = '''
"""The project of tests/compat/test_native_parity.py."""
import os

import redis
from celery import Celery, signals
from celery.backends.redis import RedisBackend

from celery_delayq import DelayedTask, DelayQ

URL = os.environ["PARITY_URL"]
app = Celery("parityproj", broker=URL, backend=URL)
app.conf.update(broker_connection_retry_on_startup=True, task_default_queue="parity",
                delayq_shards=2, delayq_idle_timeout=0.2, worker_hijack_root_logger=False,
                task_inherit_parent_priority=True)
DelayQ(app)
done = redis.Redis.from_url(URL)


@signals.task_postrun.connect
def _done(task_id, **_):
    done.rpush("{done}", task_id)


@app.task(base=DelayedTask, name="parity.echo")
def echo(x):
    return ["echo", x]


@app.task(base=DelayedTask, name="parity.quiet", ignore_result=True)
def quiet(x):
    return ["quiet", x]


@app.task(base=DelayedTask, bind=True, name="parity.special", queue="special", time_limit=40)
def special(self, x):
    return [self.request.delivery_info.get("routing_key"), self.request.timelimit]


own_backend = RedisBackend(app=app, url=os.environ["PARITY_OWN_BACKEND_URL"])


@app.task(base=DelayedTask, name="parity.own_backend", backend=own_backend)
def with_own_backend(x):
    return ["own", x]


@app.task(base=DelayedTask, bind=True, name="parity.shadowed",
          shadow_name=lambda task, args, kwargs, options: f"shadow:{args[0]}")
def shadowed(self, x):
    return self.request.shadow


@app.task(base=DelayedTask, name="parity.parent")
def parent(natively):
    """Delays a child (Celery's own send_task, or DelayedTask's) and returns its id."""
    if natively:
        return Celery.send_task(app, "parity.priority", countdown=0.3).id
    return priority.apply_async(countdown=0.3).id


@app.task(base=DelayedTask, bind=True, name="parity.priority")
def priority(self):
    return self.request.delivery_info.get("priority")


try:
    import pydantic
except ImportError:  # the test of pydantic=True skips
    pydantic = None
if pydantic is not None and hasattr(DelayedTask, "_dump_pydantic_arguments"):  # Celery 5.7+
    class Order(pydantic.BaseModel):
        id: int
        note: str

    @app.task(base=DelayedTask, name="parity.order", pydantic=True)
    def order(o: Order) -> str:
        return f"{type(o).__name__}:{o.id}:{o.note}"
'''.replace("{done}", DONE)


@dataclasses.dataclass
class Parity:
    """The project, imported here, with a worker and a carrier running."""

    module: object
    app: Celery
    client: object

    def done(self, *task_ids: str, timeout: float = 20.0) -> None:
        """Wait until each of these tasks has run to its end."""
        wait_for(lambda: set(task_ids) <= set(self.client.lrange(DONE, 0, -1)),
                 timeout=timeout, what=f"runs of {task_ids}")

    def stored(self, task_id: str, backend=None) -> bool:
        """Whether a result of ``task_id`` is in ``backend`` (the app's by default)."""
        backend = backend or self.app.backend
        return backend.get(backend.get_key_for_task(task_id)) is not None

    def natively(self) -> contextlib.AbstractContextManager[None]:
        return sent_natively(self.app)


@pytest.fixture(scope="module")
def parity(redis_server, tmp_path_factory) -> Iterator[Parity]:
    import redis

    home = tmp_path_factory.mktemp("parityproj")
    (home / "parityproj.py").write_text(PROJECT)
    url = f"{redis_server.url}/{DB}"
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    with pytest.MonkeyPatch.context() as patch, _Services(home) as processes:
        patch.setenv("PARITY_URL", url)
        patch.setenv("PARITY_OWN_BACKEND_URL", f"{redis_server.url}/{OWN_BACKEND_DB}")
        patch.syspath_prepend(str(home))
        module = importlib.import_module("parityproj")
        processes.start(os.environ)
        parity = Parity(module, module.app, client)
        warm = module.echo.apply_async(("warm",), countdown=0.1)  # both are up
        parity.done(warm.id, timeout=60)
        yield parity
        gc.collect()  # results unsubscribe now (on Celery 5.3, at exit they wait for Redis)
    sys.modules.pop("parityproj", None)
    client.flushdb()
    client.close()


class _Services(contextlib.AbstractContextManager):
    """The project's worker (its default queue and ``special``) and carrier, ended on exit."""

    def __init__(self, home) -> None:
        self.home, self.processes = home, []

    def start(self, environ) -> None:
        env = dict(plain_environ(), PYTHONPATH=str(self.home),
                   **{k: v for k, v in environ.items() if k.startswith("PARITY_")})
        celery = [sys.executable, "-m", "celery", "-A", "parityproj"]
        for n, args in enumerate((
                ["worker", "-Q", "parity,special", "-P", "threads", "-c", "4", "-l", "INFO",
                 "--without-heartbeat", "--without-gossip", "--without-mingle"],
                ["delayq", "carrier"])):
            with open(self.home / f"process-{n}.log", "w") as out:
                self.processes.append(subprocess.Popen(
                    celery + args, cwd=self.home, env=env, stdout=out,
                    stderr=subprocess.STDOUT))

    def __exit__(self, *exc) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()


# -- ignore_result ---------------------------------------------------------------------------

IGNORING_CALLS = {
    "of a task with ignore_result": lambda p, apply: apply(p.module.quiet, (1,), {}),
    "with ignore_result=True": lambda p, apply: apply(p.module.echo, (2,),
                                                      {"ignore_result": True}),
    "with ignore_result=False": lambda p, apply: apply(p.module.quiet, (3,),
                                                       {"ignore_result": False}),
}


def _native_apply(task, args, options):
    return Task.apply_async(task, args, countdown=0.3, **options)


def _delayed_apply(task, args, options):
    return task.apply_async(args, countdown=0.3, **options)


def _native_send(task, args, options):
    return Celery.send_task(task.app, task.name, args, countdown=0.3, **options)


def _delayed_send(task, args, options):
    return task.app.send_task(task.name, args, countdown=0.3, **options)


@pytest.mark.parametrize("how", [(_native_apply, _delayed_apply), (_native_send, _delayed_send)],
                         ids=["apply_async", "send_task"])
@pytest.mark.parametrize("call", list(IGNORING_CALLS))
def test_a_result_is_ignored_or_stored_as_celery_does_it_natively(parity, call, how):
    native_way, delayed_way = how
    with parity.natively():
        native = IGNORING_CALLS[call](parity, native_way)
    delayed = IGNORING_CALLS[call](parity, delayed_way)
    parity.done(native.id, delayed.id)
    time.sleep(0.2)  # a result being written
    assert (delayed.ignored, parity.stored(delayed.id)) == \
        (native.ignored, parity.stored(native.id))
    if native.ignored:
        started = time.monotonic()
        assert delayed.get(timeout=5) is None
        assert time.monotonic() - started < 1, "get() of an ignored result returns at once"


# -- send_task of a registered task ----------------------------------------------------------

def test_send_task_by_name_takes_the_registered_tasks_options_as_celery_does(parity):
    """Celery 5.7's ``send_task`` gives a task registered here its own queue and time limit
    (a worker of that queue runs it); Celery 5.3's does not."""
    name = parity.module.special.name
    with parity.natively():
        native = Celery.send_task(parity.app, name, ("n",), countdown=0.3)
    delayed = parity.app.send_task(name, ("d",), countdown=0.3)
    assert delayed.get(timeout=20) == native.get(timeout=20)


# -- a task's own result backend -------------------------------------------------------------

def test_the_result_of_a_task_with_a_backend_of_its_own_reads_that_backend(parity):
    task = parity.module.with_own_backend
    with parity.natively():
        native = Task.apply_async(task, ("n",), countdown=0.3)
    delayed = task.apply_async(("d",), countdown=0.3)
    assert delayed.get(timeout=20) == ["own", "d"]
    assert (delayed.state, delayed.backend) == (native.state, native.backend)


#: the ways to end a stored call knowing only its ids (a job id is its call's task id)
ENDS = {
    "cancel": lambda result: result.cancel(),
    "revoke": lambda result: result.revoke(),
    "cancel by job id": lambda result: DelayQ.of(result.app).cancel(result.job_id),
    "cancel by key": lambda result: DelayQ.of(result.app).cancel_key("own-backend"),
    "control.revoke": lambda result: result.app.control.revoke(result.id),
}


#: the ends that also broadcast Celery's revoke: Celery 5.7's workers then mark REVOKED in
#: the app's backend too (they have no request of the task to know its own), as natively
BROADCAST = {"revoke", "control.revoke"}


@pytest.mark.parametrize("end", ENDS)
def test_a_cancelled_task_with_a_backend_of_its_own_is_revoked_there(parity, end):
    task = parity.module.with_own_backend
    delayed = task.apply_delayed(("d",), delay=600, key="own-backend")
    ENDS[end](delayed)
    assert task.backend.get_state(delayed.id) == "REVOKED"
    if end not in BROADCAST:
        assert not parity.stored(delayed.id)


# -- pydantic=True ---------------------------------------------------------------------------

def test_a_pydantic_tasks_model_arguments_are_dumped_as_celery_dumps_them(parity):
    """Celery 5.7's ``apply_async`` dumps a ``pydantic=True`` task's model arguments; the
    worker gets them back as models."""
    task = getattr(parity.module, "order", None)
    if task is None:
        pytest.skip("pydantic=True dumps arguments from Celery 5.7 on, with pydantic installed")
    model = parity.module.Order
    with parity.natively():
        native = Task.apply_async(task, (model(id=1, note="n"),), countdown=0.3)
    delayed = task.apply_async((model(id=1, note="d"),), countdown=0.3)
    many = task.apply_delayed_many([{"args": (model(id=2, note="m"),), "delay": 0.3}])
    assert native.get(timeout=20) == "Order:1:n"
    assert [delayed.get(timeout=20), many[0].get(timeout=20)] == ["Order:1:d", "Order:2:m"]


# -- shadow_name -----------------------------------------------------------------------------

def test_a_tasks_shadow_name_names_a_delayed_call_as_it_names_a_native_one(parity):
    task = parity.module.shadowed
    with parity.natively():
        native = [Task.apply_async(task, (7,), countdown=0.3, **options)
                  for options in ({}, {"shadow": "own"})]
    delayed = [task.apply_async((7,), countdown=0.3, **options)
               for options in ({}, {"shadow": "own"})]
    parked = task.apply_delayed((7,), delay=0.3)
    assert [r.get(timeout=20) for r in [*delayed, parked]] == \
        [r.get(timeout=20) for r in [*native, native[0]]]
    many = task.apply_delayed_many([{"args": (n,), "delay": 0.3} for n in (8, 9)])
    assert [r.get(timeout=20) for r in many] == ["shadow:8", "shadow:9"]


# -- a call made inside a task ---------------------------------------------------------------

@pytest.fixture(scope="module")
def children(parity):
    """A parent run at priority 5 delays a child natively, another through the store:
    (each parent's children as its result lists them, the id of the child it delayed).
    No result is kept: on Celery 5.3 one still subscribed holds the process at exit."""
    parents = [parity.module.parent.apply_async((natively,), priority=5)
               for natively in (True, False)]
    child_ids = [parent.get(timeout=20) for parent in parents]
    return [[child.id for child in parent.children or ()] for parent in parents], child_ids


def test_a_call_made_inside_a_task_is_one_of_its_children_as_natively(children):
    listed, child_ids = children
    assert listed == [[child_id] for child_id in child_ids]


def test_a_call_made_inside_a_task_inherits_its_priority_as_natively(parity, children):
    """With ``task_inherit_parent_priority``."""
    native, delayed = (parity.app.AsyncResult(child_id) for child_id in children[1])
    assert delayed.get(timeout=20) == native.get(timeout=20) == 5


# -- compression -----------------------------------------------------------------------------

def test_a_compressed_call_runs_and_returns_as_it_does_natively(parity):
    task = parity.module.echo
    with parity.natively():
        native = Task.apply_async(task, ("n",), countdown=0.3, compression="zlib")
    delayed = task.apply_async(("d",), countdown=0.3, compression="zlib")
    assert [native.get(timeout=20), delayed.get(timeout=20)] == [["echo", "n"], ["echo", "d"]]


def test_a_base_whose_apply_async_delayed_task_would_pass_over_is_warned_of():
    """Listed after DelayedTask, a base's apply_async never sees a delayed call."""

    class Tenanted(Task):
        def apply_async(self, *args, **options):
            options.setdefault("headers", {})["tenant"] = "acme"
            return super().apply_async(*args, **options)

    with pytest.warns(UserWarning, match=r"class Passed\(Tenanted, DelayedTask\)"):
        class Passed(DelayedTask, Tenanted):
            pass

    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class Seen(Tenanted, DelayedTask):
            pass

        class Subclassed(Passed):  # said of the class that lists them, once
            pass

        app = Celery("warned", set_as_current=False)

        @app.task(base=Passed, name="warned.task")
        def task():
            pass

        assert task.name == "warned.task"  # Celery's subclass of Passed, made now
