"""Lateness vs load: bench.lateness's delayq and native arms at several due rates, and a plot.

One redis-server, one ``celery worker -P prefork -c 2`` and one carrier serve every rate.
Per repetition and rate R (due jobs/s), each arm schedules R * ``--window`` jobs one call at
a time, due evenly over the window (the arms take turns going first). The arms: delayq
through kombu, Celery native, delayq with the carrier restarted with ``--direct``, delayq
with the carrier restarted with ``--handoff-lead`` and native with each task sent that long
before it is due (bench.lateness's "native, paced"). Figures per rate: publish - due
(journal ``promoted`` events) of the first two delayq arms, and worker start - due of every
arm, p50 and p99 (medians of the repetitions, [min..max]).

Writes ``bench/results/lateness_vs_load.json`` and ``docs/img/lateness_vs_load.png``
(``pip install -e '.[bench]'`` for matplotlib). ``--plot-only`` redraws from the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .harness import ROOT, Cluster, WorkerSetup
from .lateness import Bench, machine
from .output import RESULTS, say, write_result
from .stats import cell, summarise, table
from .workload import Load

PNG = ROOT / "docs" / "img" / "lateness_vs_load.png"
SERIES = (  # (summary prefix, label, colour, line style)
    ("delayq.promotion_lateness_ms", "delayq publish - due", "tab:blue", ":"),
    ("delayq.worker_lateness_ms", "delayq worker start - due", "tab:blue", "-"),
    ("delayq_direct.promotion_lateness_ms", "delayq publish - due, direct", "tab:green", ":"),
    ("delayq_direct.worker_lateness_ms", "delayq worker start - due, direct", "tab:green",
     "-"),
    ("native.worker_lateness_ms", "Celery native worker start - due", "tab:red", "-"),
    ("delayq_lead.worker_lateness_ms", "delayq worker start - due, hand-off lead",
     "tab:purple", "-"),
    ("native_paced.worker_lateness_ms", "Celery native worker start - due, sent lead ahead",
     "tab:orange", "--"),
)
ARMS = ("delayq", "native", "delayq_direct", "delayq_lead", "native_paced")


def run(opts: argparse.Namespace) -> dict:
    setup = WorkerSetup("prefork", 2)
    per_rate: dict[str, list[dict]] = {str(rate): [] for rate in opts.rates}
    with Cluster(setup) as cluster:
        say(f"redis-server at {cluster.redis.url}; worker and carrier started")
        bench = Bench(cluster, Load(max(opts.rates) * opts.window, opts.window), 0,
                      handoff_lead=opts.handoff_lead)
        bench.warm_up()
        for n in range(opts.repeat):
            for rate in opts.rates:
                say(f"-- repetition {n + 1}/{opts.repeat}, {rate:,} due/s --")
                bench.load = Load(int(rate * opts.window), opts.window, seed=n)
                order = ARMS[n % len(ARMS):] + ARMS[:n % len(ARMS)]
                rep: dict = {"loadavg_1m_before": os.getloadavg()[0]}
                rep.update({arm: getattr(bench, arm)() for arm in order})
                rep["loadavg_1m_after"] = os.getloadavg()[0]
                per_rate[str(rate)].append(rep)
        facts = machine(cluster.app, setup)
    return {
        "benchmark": "lateness_vs_load", "machine": facts,
        "parameters": {"rates": opts.rates, "window_s": opts.window, "repeat": opts.repeat,
                       "handoff_lead_s": opts.handoff_lead,
                       "pool": setup.pool, "concurrency": setup.concurrency},
        "command": " ".join(["python -m bench.lateness_load", *sys.argv[1:]]),
        "summary": {rate: summarise(reps) for rate, reps in per_rate.items()},
        "repetitions": per_rate,
    }


def report(result: dict) -> str:
    many = result["parameters"]["repeat"] > 1
    rows = []
    for rate, summary in result["summary"].items():
        for prefix, label, _, _ in SERIES:
            rows.append([f"{int(rate):,}", label,
                         *(cell(summary.get(f"{prefix}.{p}"), 1, many)
                           for p in ("p50", "p99", "max"))])
    return table(["due/s", "lateness, ms", "p50", "p99", "max"], rows)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rates = [int(rate) for rate in result["summary"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, pct in zip(axes, ("p50", "p99"), strict=True):
        for prefix, label, colour, style in SERIES:
            figures = [result["summary"][str(r)].get(f"{prefix}.{pct}") for r in rates]
            xs = [r for r, f in zip(rates, figures, strict=True) if f]
            med = [f["median"] for f in figures if f]
            low = [f["median"] - f["min"] for f in figures if f]
            high = [f["max"] - f["median"] for f in figures if f]
            ax.errorbar(xs, [max(m, 0.1) for m in med], yerr=[low, high], label=label,
                        color=colour, linestyle=style, marker="o", capsize=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(rates, [f"{r:,}" for r in rates])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("due jobs per second")
        ax.set_title(f"{pct} lateness")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("ms after due (log)")
    axes[0].legend(fontsize=8)
    facts, params = result["machine"], result["parameters"]
    lead = params.get("handoff_lead_s")  # absent from runs before the lead arms
    fig.suptitle(f"celery-delayq vs Celery native ETA: {facts['nproc']} shared CPUs, "
                 f"Redis {facts['redis_server']}, worker prefork -c {params['concurrency']}, "
                 + (f"lead {lead:g} s, " if lead else "")
                 + f"median of {params['repeat']} [min..max]", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.lateness_load",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[400, 2_000, 4_000],
                        help="due jobs per second")
    parser.add_argument("--window", type=float, default=3.0, help="seconds the due times span")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (medians reported)")
    parser.add_argument("--handoff-lead", type=float, default=1.0,
                        help="seconds of hand-off lead in the lead arms")
    parser.add_argument("--quick", action="store_true", help="2 s windows, 1 repetition")
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from --out")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--png", type=Path, default=None)
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.window, opts.repeat = 2.0, 1
    if opts.out is None:
        opts.out = RESULTS / ("lateness_vs_load-quick.json" if opts.quick
                              else "lateness_vs_load.json")
    if opts.png is None:
        opts.png = RESULTS / "lateness_vs_load-quick.png" if opts.quick else PNG
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    if opts.plot_only:
        result = json.loads(opts.out.read_text())
    else:
        try:
            result = run(opts)
        except KeyboardInterrupt:
            say("interrupted; every process stopped")
            return 130
        write_result(opts.out, result)
    print()
    print(report(result))
    plot(result, opts.png)
    say(f"wrote {opts.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
