"""``celery delayq pause | resume | paused | rate-limit``: holding due jobs back in an
incident (see ``holding.py``)."""

from __future__ import annotations

import click

from .cli_group import cli_user, delayq, delayq_of, fail
from .errors import DelayQError, InvalidOption
from .reading import counted, shown


@delayq.command()
@click.option("--task", default=None, help="The task name, e.g. shop.tasks.check_refund.")
@click.option("--queue", default=None, help="The queue name, e.g. refunds.")
@click.pass_context
def pause(ctx: click.Context, task: str | None, queue: str | None) -> None:
    """Hold the due jobs of a task or a queue until `resume` (every carrier obeys it)."""
    try:
        delayq_of(ctx).pause(task=task, queue=queue, by=cli_user())
    except InvalidOption as exc:
        raise click.UsageError(str(exc)) from None
    except DelayQError as exc:
        fail(exc)
    click.echo(f"paused {'task ' + task if task else 'queue ' + str(queue)}: its due jobs "
               "are held, pending, until you run `delayq resume` with the same option")


@delayq.command()
@click.option("--task", default=None, help="The task name.")
@click.option("--queue", default=None, help="The queue name.")
@click.pass_context
def resume(ctx: click.Context, task: str | None, queue: str | None) -> None:
    """End a pause: its held jobs are due again and promoted oldest first."""
    try:
        released = delayq_of(ctx).resume(task=task, queue=queue, by=cli_user())
    except InvalidOption as exc:
        raise click.UsageError(str(exc)) from None
    except DelayQError as exc:
        fail(exc)
    click.echo(f"resumed {'task ' + task if task else 'queue ' + str(queue)}: "
               f"{counted(released, 'held job')} due again")


@delayq.command()
@click.pass_context
def paused(ctx: click.Context) -> None:
    """List the paused tasks and queues."""
    try:
        found = delayq_of(ctx).paused()
    except DelayQError as exc:
        fail(exc)
    if not found["tasks"] and not found["queues"]:
        click.echo("nothing is paused")
    for kind in ("tasks", "queues"):
        for name in found[kind]:
            click.echo(f"{kind[:-1]} {shown(name)}")


@delayq.command(name="rate-limit")
@click.argument("queue", required=False)
@click.argument("rate", required=False)
@click.pass_context
def rate_limit(ctx: click.Context, queue: str | None, rate: str | None) -> None:
    """Limit how fast QUEUE's due jobs are promoted (RATE: 200/s, 30/m, 1000/h, or off);
    without RATE show its limit, without QUEUE list every limit."""
    try:
        if queue is None or rate is None:
            limits = delayq_of(ctx).rate_limits()
            for name, value in limits.items():
                if queue in (None, name):
                    click.echo(f"{shown(name)}: {shown(value)}")
            if not limits or (queue is not None and queue not in limits):
                click.echo("no rate limit" if queue else "no rate limits")
            return
        released = delayq_of(ctx).set_rate_limit(queue, None if rate == "off" else rate,
                                               by=cli_user())
    except InvalidOption as exc:
        raise click.UsageError(str(exc)) from None
    except DelayQError as exc:
        fail(exc)
    if rate == "off":
        click.echo(f"{queue}: no rate limit; {counted(released, 'held job')} due again")
    else:
        click.echo(f"{queue}: at most {rate} promoted, shared by every carrier")

