"""``celery delayq pause | resume | paused | rate-limit``: holding due jobs back in an
incident (see ``holding.py``)."""

from __future__ import annotations

import sys

import click

from . import pausing
from .cli_group import (
    cli_user,
    counting,
    ctrl_c_said,
    delayq,
    delayq_of,
    fail,
    registered,
    warn,
)
from .errors import DelayQError, InvalidOption
from .reading import counted, shown


@delayq.command()
@click.option("--task", default=None, help="The task name, e.g. shop.tasks.check_refund.")
@click.option("--queue", default=None, help="The queue name, e.g. refunds.")
@click.pass_context
def pause(ctx: click.Context, task: str | None, queue: str | None) -> None:
    """Hold the due jobs of a task or a queue until `resume` (every carrier obeys it)."""
    _one_of(task, queue)
    try:
        delayq_of(ctx).pause(task=task, queue=queue, by=cli_user())
    except DelayQError as exc:
        fail(exc)
    if task and not registered(ctx, task):
        warn(f"no task {shown(task)} is registered in this app; paused anyway (a task of "
              "another app?). If the name is wrong, run `delayq resume` with it and pause "
              "the right one")
    elif queue:
        _warn_if_undeclared(ctx, queue, "paused", "run `delayq resume` with it and pause the "
                                                  "right one")
    click.echo(f"paused {_named(task, queue)}: its due jobs are held, pending, until you "
               "run `delayq resume` with the same option")


def _one_of(task: str | None, queue: str | None) -> None:
    """Refuse a pause or resume that names no task or queue, or both, or a name that
    cannot be one, naming the options."""
    try:
        pausing.field(task, queue, named=("--task", "--queue"))
    except InvalidOption as exc:
        raise click.UsageError(str(exc)) from None


def _warn_if_undeclared(ctx: click.Context, queue: str, done: str, undo: str) -> None:
    """Warn that ``queue`` was ``done`` (paused, limited) though the app does not know it:
    a typo holds nothing while the operator believes it held."""
    if not _declared(ctx, queue):
        warn(f"no queue {shown(queue)} is declared or routed to in this app "
              f"(task_default_queue, task_queues, task_routes); {done} anyway (a queue named "
              f"only in calls?). If the name is wrong, {undo}")


def _declared(ctx: click.Context, queue: str) -> bool:
    """Whether the app declares ``queue`` (its default queue, ``task_queues``) or a plain
    ``task_routes`` entry routes to it; a queue named only in calls is not known here."""
    app = ctx.obj.app
    routes = app.conf.task_routes
    routers = routes if isinstance(routes, list | tuple) else [routes]
    routed = [route.get("queue") if isinstance(route, dict) else route
              for router in routers if isinstance(router, dict) for route in router.values()]
    return queue in app.amqp.queues or any(getattr(q, "name", q) == queue for q in routed)


def _named(task: str | None, queue: str | None) -> str:
    """"task <name>" or "queue <name>", as the CLI says what it paused."""
    return f"task {shown(task)}" if task else f"queue {shown(str(queue))}"


#: Why a resume Ctrl-C stopped may be run again.
_RESUME_RERUN = ("the pause is over; the held jobs not given back yet wait, and it gives "
                 "them back (or a carrier does, about 5 s after the stop)")


@delayq.command()
@click.option("--task", default=None, help="The task name.")
@click.option("--queue", default=None, help="The queue name.")
@click.pass_context
def resume(ctx: click.Context, task: str | None, queue: str | None) -> None:
    """End a pause: its held jobs are due again and promoted oldest first."""
    _one_of(task, queue)
    count = counting("gave back")
    try:
        with ctrl_c_said(count, _RESUME_RERUN):
            done = delayq_of(ctx).resumed(task=task, queue=queue, by=cli_user(),
                                          progress=count)
        if not done.was_paused and not done.released:
            _not_paused(ctx, _named(task, queue))
    except DelayQError as exc:
        fail(exc)
    if done.was_paused:
        click.echo(f"resumed {_named(task, queue)}: {counted(done.released, 'held job')} "
                   "due again")
    else:
        click.echo(f"{_named(task, queue)} was not paused any more: gave back "
                   f"{counted(done.released, 'held job')} a stopped resume left")


def _not_paused(ctx: click.Context, named: str) -> None:
    """Say that ``named`` was not paused, and what is; exit 1."""
    paused = _pauses(delayq_of(ctx).paused())
    click.echo(f"{named} was not paused ("
               + (f"paused: {', '.join(paused)}" if paused else "nothing is paused") + ")")
    sys.exit(1)


@delayq.command()
@click.pass_context
def paused(ctx: click.Context) -> None:
    """List the paused tasks and queues."""
    try:
        found = delayq_of(ctx).paused()
    except DelayQError as exc:
        fail(exc)
    for line in _pauses(found) or ["nothing is paused"]:
        click.echo(line)


def _pauses(found: dict[str, list[str]]) -> list[str]:
    """``DelayQ.paused()``'s listing as the CLI prints it: "task <name>", "queue <name>"."""
    return [f"{kind[:-1]} {shown(name)}" for kind in ("tasks", "queues") for name in found[kind]]


@delayq.command(name="rate-limit")
@click.argument("queue", required=False)
@click.argument("rate", required=False)
@click.pass_context
def rate_limit(ctx: click.Context, queue: str | None, rate: str | None) -> None:
    """Limit how fast QUEUE's due jobs are promoted (RATE: 200/s, 30/m, 1000/h, or off);
    without RATE show its limit, without QUEUE list every limit."""
    if queue is None or rate is None:
        _show_rate_limits(ctx, queue)
        return
    try:
        pausing.field(None, queue, named=("--task", "QUEUE"))  # its errors name the argument
        released = delayq_of(ctx).set_rate_limit(queue, None if rate == "off" else rate,
                                               by=cli_user())
    except InvalidOption as exc:
        raise click.UsageError(str(exc)) from None
    except DelayQError as exc:
        fail(exc)
    if rate == "off":
        click.echo(f"{queue}: no rate limit; {counted(released, 'held job')} due again")
        return
    _warn_if_undeclared(ctx, queue, "limited", f"run `delayq rate-limit {shown(queue)} off` "
                                               "and limit the right one")
    click.echo(f"{queue}: at most {rate} promoted, shared by every carrier")


def _show_rate_limits(ctx: click.Context, queue: str | None) -> None:
    """Print the rate limit of ``queue``, or every limit."""
    try:
        limits = delayq_of(ctx).rate_limits()
    except DelayQError as exc:
        fail(exc)
    for name, value in limits.items():
        if queue in (None, name):
            click.echo(f"{shown(name)}: {shown(value)}")
    if not limits or (queue is not None and queue not in limits):
        click.echo("no rate limit" if queue else "no rate limits")
