"""``python -m celery_delayq.spark schedule|report``: the Spark jobs for operators.

Examples::

    python -m celery_delayq.spark schedule -A shop.celery:app --input refunds.parquet \\
        --format parquet --task shop.tasks.check_refund_status --id-col refund_id \\
        --delay-col delay_s --args-cols refund_id --rejects out/rejects
    python -m celery_delayq.spark report --events exported/ --out report/
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from celery.app.utils import HIDDEN_SETTINGS

from celery_delayq.connection import redact  # absolute: spark-submit runs this file
from celery_delayq.errors import DelayQError, InvalidOption

FORMATS = ("parquet", "csv", "json")
#: Spark 4's default ``spark.redaction.regex``: the value of any property (system properties
#: included) whose name or value matches is hidden from the UI and the event log.
SPARK_REDACTION = "(?i)secret|password|token|access[.]?key|credential"
#: What this program adds: a URL with a password in its userinfo (``redis://:PW@host``).
#: spark-submit puts the program's arguments in the driver's ``sun.java.command``.
URL_PASSWORD = r"://[^/@\s]*:[^/@\s]*@"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Executors run this interpreter unless the operator chose one (e.g. on a cluster).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    try:
        return args.run(args)
    except (DelayQError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m celery_delayq.spark",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    schedule = sub.add_parser("schedule", help="Schedule one delayed task per input row.")
    schedule.set_defaults(run=_schedule)
    schedule.add_argument("-A", "--app", help="The Celery app, as for `celery -A` "
                          "(e.g. shop.celery:app); only its config is used. Default: a bare "
                          "app on --broker.")
    broker = schedule.add_mutually_exclusive_group()
    broker.add_argument("--broker",
                        help="Broker (and delay store) URL when no --app is given "
                             "[env CELERY_BROKER_URL]. A password here is visible in `ps`: "
                             "use the environment or --broker-file for it.")
    broker.add_argument("--broker-file", metavar="PATH",
                        help="Read the broker URL from this file (e.g. a mounted secret).")
    schedule.add_argument("--set", dest="settings", action="append", default=[],
                          metavar="NAME=VALUE",
                          help="Extra app setting, e.g. delayq_shards=16 (repeatable).")
    schedule.add_argument("--input", required=True, help="File or folder to read.")
    schedule.add_argument("--format", choices=FORMATS, default="parquet")
    schedule.add_argument("--task", required=True, help="Registered task name.")
    schedule.add_argument("--id-col", required=True, help="Job id column (idempotency).")
    when = schedule.add_mutually_exclusive_group(required=True)
    when.add_argument("--delay-col", help="Delay column, seconds.")
    when.add_argument("--eta-col", help="Due time column: timestamp, ISO string, epoch s.")
    schedule.add_argument("--args-cols", default="", help="Comma-separated argument columns.")
    schedule.add_argument("--kwargs-col", help="Struct or map column of keyword arguments.")
    schedule.add_argument("--key-col", help="Business key column.")
    queue = schedule.add_mutually_exclusive_group()
    queue.add_argument("--queue", help="Queue for every row (default: the app's routing).")
    queue.add_argument("--queue-col", help="Queue column, per row.")
    schedule.add_argument("--if-exists", choices=("keep", "replace", "error"), default="keep")
    schedule.add_argument("--past", choices=("run", "reject"), default="run",
                          help="An eta that has passed: run at once (default) or reject.")
    schedule.add_argument("--batch-size", type=_positive, default=5000,
                          help="Rows per pipelined round trip.")
    schedule.add_argument("--partitions", type=_positive, default=None,
                          help="Repartition the input first (parallel Redis writers).")
    schedule.add_argument("--rejects", help="Write rejected rows (+ reason) here as Parquet.")
    _spark_options(schedule)

    report = sub.add_parser("report", help="Lateness report from `delayq export` output.")
    report.set_defaults(run=_report)
    report.add_argument("--events", required=True,
                        help="Folder written by delayq export: a path or a Hadoop URI "
                             "(file://, hdfs://, s3a://).")
    report.add_argument("--out", required=True,
                        help="Folder for the Parquet tables and report.html (path or URI).")
    report.add_argument("--slowest", type=_positive, default=20, help="How many slowest jobs.")
    report.add_argument("--bucket", choices=("auto", "minute", "hour"), default="auto",
                        help="Time bucket; auto: per minute when the events span under "
                             "3 hours, else per hour.")
    _spark_options(report)
    return parser


def _spark_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default=None,
                        help="Spark master, e.g. local[*] or spark://host:7077 (default: "
                             "spark-submit's, else local[*]).")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        type=_key_value,
                        help="Extra Spark configuration (repeatable).")


def _positive(text: str) -> int:
    """An argument that is a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def _key_value(text: str) -> str:
    """A ``--conf`` argument: ``key=value``, the key not empty."""
    if not text.partition("=")[0] or "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE, e.g. "
                                         "spark.sql.shuffle.partitions=64")
    return text


def _session(args: argparse.Namespace, name: str):
    from pyspark.sql import SparkSession

    submitted = _submitted_conf()
    builder = SparkSession.builder.appName(name)
    if args.master:
        builder = builder.master(args.master)
    elif submitted is None or not submitted.contains("spark.master"):
        builder = builder.master("local[*]")
    given = dict(pair.partition("=")[::2] for pair in args.conf)
    if "spark.redaction.regex" not in given and submitted is not None:
        given["spark.redaction.regex"] = submitted.get("spark.redaction.regex", None)
    given["spark.redaction.regex"] = _redaction(given.get("spark.redaction.regex"))
    for key, value in given.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _submitted_conf():
    """spark-submit's conf (its ``--master``, ``--conf``) when it runs this program, else
    None: a plain ``SparkConf()`` reads it only once the driver is attached to its JVM."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return SparkConf()


def _redaction(given: str | None) -> str:
    """``spark.redaction.regex`` (the one given, else Spark's default) extended with
    :data:`URL_PASSWORD`."""
    return f"{given or SPARK_REDACTION}|{URL_PASSWORD}"


def _app(args: argparse.Namespace):
    from celery import Celery

    if args.app:
        from celery.app.utils import find_app

        app = find_app(args.app)
    elif broker := _broker_url(args):
        app = Celery("celery_delayq.spark", broker=broker, set_as_current=False)
    else:
        raise DelayQError("give the Celery app with -A module:app, or a broker URL in "
                          "CELERY_BROKER_URL, --broker-file PATH or --broker URL")
    for pair in args.settings:
        name, sep, value = pair.partition("=")
        if not sep:
            raise DelayQError(f"--set takes NAME=VALUE, got {pair!r}")
        _warn_if_password(f"--set {name.strip()}", value, secret=bool(
            HIDDEN_SETTINGS.search(name) and value.strip()))
        app.conf[name.strip()] = value.strip()
    return app


def _broker_url(args: argparse.Namespace) -> str | None:
    if args.broker_file:
        return Path(args.broker_file).read_text().strip()
    if args.broker:
        _warn_if_password("--broker", args.broker)
        return args.broker
    return os.environ.get("CELERY_BROKER_URL")


def _warn_if_password(option: str, value: str, secret: bool = False) -> None:
    """Say that a URL with a password, or a ``secret`` (a setting whose name Celery hides,
    such as delayq_redis_password), on the command line is there for all to see."""
    if secret or ("://" in value and redact(value) != value):
        print(f"warning: {option} holds a password, which every user of this machine can "
              "read in `ps`; give the URL in CELERY_BROKER_URL or a file (--broker-file "
              "PATH), or with -A in the app's config", file=sys.stderr, flush=True)


def _read(read, path: str):
    """``read(path)``; what Spark cannot read (no such path, another format) is an
    InvalidOption of one line, not a Python and Java traceback."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    try:
        return read(path)
    except (PySparkException, Py4JJavaError) as exc:
        said = str(exc).strip().splitlines() or [type(exc).__name__]
        raise InvalidOption(f"cannot read --input {path}: {said[0]}") from None


def _input(spark, args: argparse.Namespace):
    """The ``--input`` DataFrame. A CSV's types are inferred, but its id, key and queue
    columns are read as text: an id "007" stays "007", not 7."""
    from pyspark.sql import types as T

    if args.format != "csv":
        return _read(getattr(spark.read, args.format), args.input)
    inferred = _read(spark.read.options(header=True, inferSchema=True).csv, args.input)
    text = {args.id_col, args.key_col, args.queue_col}
    schema = T.StructType([T.StructField(field.name, T.StringType()) if field.name in text
                           else field for field in inferred.schema.fields])
    return _read(spark.read.options(header=True).schema(schema).csv, args.input)


def _schedule(args: argparse.Namespace) -> int:
    from celery_delayq.spark import PartitionProgress, schedule_dataframe

    app = _app(args)
    spark = _session(args, f"celery-delayq schedule {args.task}")
    df = _input(spark, args)
    if args.partitions:
        df = df.repartition(args.partitions)

    def progress(p: PartitionProgress) -> None:
        rate = p.rows_done / p.elapsed if p.elapsed else 0.0
        print(f"partitions {p.partitions_done}/{p.partitions} done, {p.rows_done:,} rows "
              f"written, {p.elapsed:.1f}s ({rate:,.0f} rows/s)", file=sys.stderr, flush=True)

    summary, rejects = schedule_dataframe(
        df, app, task=args.task, id_col=args.id_col, delay_col=args.delay_col,
        eta_col=args.eta_col, args_cols=[c for c in args.args_cols.split(",") if c],
        kwargs_col=args.kwargs_col, key_col=args.key_col, queue=args.queue,
        queue_col=args.queue_col, if_exists=args.if_exists, batch_size=args.batch_size,
        past=args.past,
        progress=progress)
    print(f"scheduled {summary.scheduled:,}, already existed {summary.existed:,}, "
          f"rejected {summary.rejected:,}; eta already passed {summary.past:,} "
          f"({'rejected' if args.past == 'reject' else 'run at once'})")
    if summary.rejected:
        if args.rejects:
            rejects.write.mode("overwrite").parquet(args.rejects)
            print(f"rejected rows with their reason written to {args.rejects}")
        else:
            _print_rejects(rejects, args.id_col)
    return 0


def _print_rejects(rejects, id_col: str) -> None:
    """The first 20 rejects' ids, as text (a value Python cannot read prints too), and
    reasons."""
    from celery_delayq.spark.schedule import named_column

    for job_id, reason in rejects.select(named_column(id_col).cast("string"), "reason").limit(
            20).collect():
        print(f"  rejected {job_id!r}: {reason}")
    print("  (pass --rejects PATH to keep every rejected row)")


def _report(args: argparse.Namespace) -> int:
    from celery_delayq.spark.report import build_report

    spark = _session(args, "celery-delayq report")
    report = build_report(spark, args.events, args.out, slowest=args.slowest,
                          bucket=args.bucket)
    for row in report.by_task:
        print(f"{row['task']}: promoted {row['promoted']:,}, p50/p95/p99 promote lateness "
              f"{_ms(row['promote_late_p50_ms'])}/{_ms(row['promote_late_p95_ms'])}/"
              f"{_ms(row['promote_late_p99_ms'])} ms, cancel rate "
              f"{_ms(row['cancel_rate'], 3)}")
    lost = sum(row["jobs"] for row in report.never_started_by_task)
    print(f"dead letters {sum(row['dead'] for row in report.dead):,}, promoted and never "
          f"started {lost:,}" + ("" if report.workers_journal else " (no started events)"))
    if report.backlog:
        print(f"backlog at export: pending {report.backlog.total('pending'):,}, in flight "
              f"{report.backlog.total('inflight'):,}")
    print(f"report written to {report.html} ({report.bucket} buckets)")
    return 0


def _ms(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
