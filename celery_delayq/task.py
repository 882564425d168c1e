"""``DelayedTask``: a Celery task base class whose delayed calls go through the store."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from celery import Task

from . import journal, validation
from .extension import NOT_STORED, DelayQ, sending_natively
from .result import DelayedResult


class DelayedTask(Task):
    """Use as ``@app.task(base=DelayedTask)`` or app-wide with ``task_cls``.

    ``apply_delayed`` parks a call in the store. ``apply_async`` with ``countdown`` or
    ``eta`` beyond ``delayq_countdown_threshold`` seconds (and so ``self.retry``) goes
    there too; everything else is Celery's own ``apply_async``.
    """

    abstract = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Warn of a base listed after ``DelayedTask`` with an ``apply_async`` of its own:
        a delayed call goes to the store from ``DelayedTask.apply_async``, past it."""
        super().__init_subclass__(**kwargs)
        mro = cls.__mro__
        for base in mro[mro.index(DelayedTask) + 1:mro.index(Task)]:
            inherited = any(issubclass(listed, DelayedTask) and issubclass(listed, base)
                            for listed in cls.__bases__)  # said of the class that lists them
            if "apply_async" in vars(base) and not inherited:
                warnings.warn(
                    f"{cls.__qualname__} lists DelayedTask before {base.__qualname__}, whose "
                    "apply_async then never sees a delayed call; list DelayedTask after it: "
                    f"class {cls.__name__}({base.__name__}, DelayedTask)", stacklevel=2)

    @classmethod
    def on_bound(cls, app) -> None:
        """Connect the worker-side journal hooks, which act for opted-in apps only. Binding
        opts no app in: Celery binds a task of the default kind (``shared=True``) to every
        app of the process, a test app too, whose countdowns would then go to a store that
        no carrier serves. ``DelayQ(app)`` opts in, and so does ``apply_delayed`` (it is
        never Celery's); until then ``apply_async(countdown=)`` is Celery's own."""
        super().on_bound(app)
        journal.connect(DelayQ.lookup)

    def apply_delayed(self, args=None, kwargs=None, *,
                      delay: float | timedelta | None = None, eta: datetime | None = None,
                      key: str | None = None, job_id: str | None = None,
                      if_exists: str = "keep", **options: Any) -> DelayedResult:
        """Run this task after ``delay`` (seconds or timedelta) or at ``eta`` (aware datetime).

        ``key`` is a business key (``"order:42"``) for ``DelayQ.cancel_key``; ``job_id``
        makes the call idempotent, with ``if_exists`` = keep | replace | error. Any other
        ``apply_async`` option (queue, priority, headers, expires, link, ...) is kept.
        With ``task_always_eager`` the task runs at once, as ``apply_async`` runs it.
        """
        if "shadow" not in options:  # (apply_async gives it)
            options["shadow"] = self._shadow_name(args, kwargs, options)
        options = self._call_options(options)
        args, kwargs = self._dumped(args, kwargs, options)
        return DelayQ.of(self.app).schedule(
            self.name, args, kwargs, delay=delay, eta=eta, key=key, job_id=job_id,
            if_exists=if_exists, task_type=self, **options)

    def apply_delayed_many(self, items: Iterable[Mapping[str, Any]], *,
                           if_exists: str = "keep", **options: Any) -> list[DelayedResult]:
        """Schedule many calls at once, pipelined; see ``DelayQ.schedule_many``.

        ``items``: mappings with ``args``, ``kwargs``, ``delay`` or ``eta``, ``key``,
        ``job_id``, ``shadow``. ``options`` (queue, priority, ...) apply to every call; the
        task's ``shadow_name`` names each call, unless ``shadow=`` is given.
        """
        options = self._call_options(options)
        dump = getattr(self, "_dump_pydantic_arguments", None) is not None
        shadowed = "shadow" not in options and type(self).shadow_name is not Task.shadow_name
        if dump or shadowed:
            items = [self._as_called(validation.batch_item(n, item), options, dump, shadowed)
                     for n, item in enumerate(validation.batch(items))]
        return DelayQ.of(self.app).schedule_many(
            self.name, items, if_exists=if_exists, task_type=self, **options)

    def _as_called(self, item: Mapping[str, Any], options: dict[str, Any], dump: bool,
                   shadowed: bool) -> Mapping[str, Any]:
        """An item of ``apply_delayed_many`` as ``apply_async`` would make its call: its
        models dumped, its shadow name asked of the task (unless the item gives one)."""
        args, kwargs = item.get("args"), item.get("kwargs")
        if shadowed and item.get("shadow") is None:
            item = {**item, "shadow": self._shadow_name(args, kwargs, options)}
        if dump:
            args, kwargs = self._dumped(args, kwargs, options)
            item = {**item, "args": args, "kwargs": kwargs}
        return item

    def _call_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """A call's options over the task's, as ``Task.apply_async`` merges them."""
        options = {**self._get_exec_options(), **options}
        options.setdefault("ignore_result", self.ignore_result)
        return options

    def _dumped(self, args, kwargs, options: dict[str, Any]) -> tuple[Any, Any]:
        """``args`` and ``kwargs`` with a ``pydantic=True`` task's models dumped, as
        ``Task.apply_async`` dumps them (Celery 5.7+; unless the serializer is pickle)."""
        dump = getattr(self, "_dump_pydantic_arguments", None)
        if dump is None or options.get("serializer") == "pickle":
            return args, kwargs
        return dump(args, kwargs)

    def _shadow_name(self, args, kwargs, options: dict[str, Any]) -> str | None:
        """The task's ``shadow_name`` of a call, as ``Task.apply_async`` asks it."""
        if self.__v2_compat__:
            return self.shadow_name(self(), args, kwargs, options)
        return self.shadow_name(args, kwargs, options)

    def apply_async(self, args=None, kwargs=None, task_id=None, producer=None, link=None,
                    link_error=None, shadow=None, **options):
        countdown, eta = options.get("countdown"), options.get("eta")
        # an app that never opted in (DelayQ(app)) is left as it was, its countdowns
        # Celery's: a shared task is bound to every app, whose store no carrier may serve
        delayq = DelayQ.lookup(self.app)
        delay = None if delayq is None else delayq.store_delay(countdown, eta)
        if delay is None:
            return super().apply_async(args, kwargs, task_id=task_id, producer=producer,
                                       link=link, link_error=link_error, shadow=shadow,
                                       **options)
        shadow = shadow or self._shadow_name(args, kwargs, options)
        stored = {k: v for k, v in options.items() if k not in ("countdown", "eta")}
        for name, value in (("task_id", task_id), ("link", link), ("link_error", link_error)):
            if value is not None:
                stored[name] = value
        stored["shadow"] = shadow
        try:
            # A retry (or a second apply_async with the same task id) replaces the stored
            # call.
            return self.apply_delayed(args, kwargs, if_exists="replace", **delay, **stored)
        except NOT_STORED as exc:
            native = DelayQ.of(self.app).native_fallback(self.name, task_id, exc, options)
            if native is None:
                raise
        with sending_natively():
            return super().apply_async(args, kwargs, task_id=task_id, producer=producer,
                                       link=link, link_error=link_error, shadow=shadow,
                                       **native)

    def on_replace(self, sig):
        """Hand the running delayed job to ``sig``, so its outcome is journaled as the
        job's (see :func:`journal.hand_over`)."""
        journal.hand_over(self.request, sig)
        return super().on_replace(sig)
