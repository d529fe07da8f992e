"""`shigoto bench --features`: what a fair queue, a rate limit and workflows cost per job.

Issue 26 asks that the cost figures hold "with the features on", each measured beside plain
jobs. Each phase here is the plain processing phase of shigoto.cli.bench (one in-process
Runner at the bench's concurrency, no-op jobs pre-loaded, timed from the first claim to the
last acknowledged completion, with server CPU, WAL and client CPU per job from bench_costs),
run on a queue of its own so that no setting leaks into another phase:

- fair queue: `set_queue(FAIR_QUEUE, fair=True)`, the jobs spread round-robin over
  `PARTITIONS` partition keys, so every claim takes the fair claim's round-robin walk;
- rate limit: a worker with `RATE`, far above what one runner on this machine reaches, so
  the limiter's own work (one locked row per claim, the reservation) is what is measured,
  never a job held back. Deferrals are counted (`deferred`) to show none happened;
- workflows: diamonds of four no-op steps (a -> b, a -> c, b + c -> d: one fan-out and one
  fan-in each), `DIAMONDS_PER_WORKFLOW` to a workflow built with `shigoto.workflow()`. Only
  the roots are available when the runner starts; every other job is released by its
  parents' completions, so the phase includes the dependency triggers and the wake-ups. Every
  job (all four steps) counts as processed.

Each phase's report carries `vs_plain`: its figure divided by the plain phase's of the same
invocation (jobs/s; server CPU, WAL and client CPU per job: above 1 costs more). With
`--finished N` the phases run again on the table of N finished rows, beside the finished-rows
phase.

`shigoto bench --features` runs them (`--bench-database` names the scratch database, default
shigoto_bench).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psycopg
from psycopg import sql

from shigoto import telemetry
from shigoto.cli import bench
from shigoto.client.enqueuing import enqueue_many
from shigoto.client.queue_settings import set_queue
from shigoto.client.workflow import workflow
from shigoto.flow.rate_limit import RateLimit
from shigoto.runtime import event_loop
from shigoto.worker import worker

FAIR_QUEUE = "bench_fair"
RATED_QUEUE = "bench_rated"
FLOW_QUEUE = "bench_flow"
#: Partition keys the fair queue's jobs are spread over (the fair claim walks up to 128 a
#: claim, docs/benchmarks.md "Flow control").
PARTITIONS = 100
#: 100,000 starts a second with a burst of 1,000: ten times what one runner on two cores
#: processes, and a whole claim of the default concurrency fits in the burst, so no job waits.
RATE = RateLimit(100_000, per=1.0, burst=1_000)
#: Diamonds (4 jobs) per workflow: one `workflow().enqueue()` transaction of 1,000 jobs.
DIAMONDS_PER_WORKFLOW = 250

FIGURES = ("jobs_per_s", "server_cpu_us_per_job", "wal_bytes_per_job", "client_cpu_us_per_job")


@worker(name="shigoto.cli.bench_features.rated", queue=RATED_QUEUE, rate_limit=RATE)
async def rated(**_: Any) -> None:
    """The rate-limited phase's job: a no-op like bench.noop, behind a limit it never hits."""


# -- loading (not timed) ---------------------------------------------------------------------


def _load_fair(url: str, cfg: bench.BenchConfig, count: int) -> int:
    set_queue(FAIR_QUEUE, fair=True, database_url=url, schema=cfg.schema)
    for start in range(0, count, cfg.bulk_batch):
        enqueue_many(
            [{"worker": bench.noop.name, "args": {"n": i}, "queue": FAIR_QUEUE,
              "partition_key": f"tenant-{i % PARTITIONS}"}
             for i in range(start, min(start + cfg.bulk_batch, count))],
            database_url=url, schema=cfg.schema, returning="ids",
        )  # fmt: skip
    return count


def _load_rated(url: str, cfg: bench.BenchConfig, count: int) -> int:
    for start in range(0, count, cfg.bulk_batch):
        enqueue_many(
            [{"worker": rated.name, "args": {"n": i}, "queue": RATED_QUEUE}
             for i in range(start, min(start + cfg.bulk_batch, count))],
            database_url=url, schema=cfg.schema, returning="ids",
        )  # fmt: skip
    return count


def _load_workflows(url: str, cfg: bench.BenchConfig, count: int) -> int:
    """Diamonds of four steps, `DIAMONDS_PER_WORKFLOW` to a workflow; returns the jobs made
    (`count` rounded down to whole diamonds, at least one)."""
    diamonds = max(count // 4, 1)
    made = 0
    while made < diamonds:
        wf = workflow(f"bench-{made}")
        for k in range(made, min(made + DIAMONDS_PER_WORKFLOW, diamonds)):
            step = {"queue": FLOW_QUEUE}
            wf.add(f"a{k}", bench.noop.name, {"n": k}, **step)
            wf.add(f"b{k}", bench.noop.name, {"n": k}, after=[f"a{k}"], **step)
            wf.add(f"c{k}", bench.noop.name, {"n": k}, after=[f"a{k}"], **step)
            wf.add(f"d{k}", bench.noop.name, {"n": k}, after=[f"b{k}", f"c{k}"], **step)
        wf.enqueue(database_url=url, schema=cfg.schema)
        made = min(made + DIAMONDS_PER_WORKFLOW, diamonds)
    return diamonds * 4


# -- phases ------------------------------------------------------------------------------------


def _top_id(url: str, schema: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT coalesce(max(id), 0) FROM {}").format(
            sql.Identifier(schema, "shigoto_jobs"))).fetchone()  # fmt: skip
    return int(row[0]) if row else 0


def _completed(url: str, schema: str, queue: str, above: int) -> int:
    """The phase's completed jobs: its queue's, above the id the table ended at before it
    (a range of the primary key, not a count over millions of finished rows)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE id > %s AND queue = %s AND state = "
                    "'completed'").format(sql.Identifier(schema, "shigoto_jobs")),
            (above, queue),
        ).fetchone()  # fmt: skip
    return int(row[0]) if row else 0


def measure_feature(
    url: str, cfg: bench.BenchConfig, progress: bench.Progress, label: str, queue: str,
    load: Callable[[str, bench.BenchConfig, int], int], empty: bool,
) -> dict[str, Any]:  # fmt: skip
    """Load the phase's jobs (not timed), then time one runner serving `queue` until every
    one of them is acknowledged. `empty` starts from an empty table (beside the plain
    phase); otherwise the table keeps what it holds (the finished rows)."""
    if empty:
        bench._reset(url, cfg.schema)
    above = _top_id(url, cfg.schema)
    jobs = load(url, cfg, cfg.process_jobs)
    deferred = 0

    def on_defer(_event: str, _m: dict[str, Any], _meta: dict[str, Any]) -> None:
        nonlocal deferred
        deferred += 1

    handle = telemetry.attach(on_defer, ["flow.defer"])
    load_avg = bench._load()
    try:
        with progress.phase(label, jobs) as advance:
            result = event_loop.run(
                bench._process(url, replace(cfg, process_jobs=jobs), advance, queue)
            )
    finally:
        telemetry.detach(handle)
    result.update(queue=queue, completed=_completed(url, cfg.schema, queue, above),
                  deferred=deferred, load_before=load_avg)  # fmt: skip
    return result


#: (report key, progress label, queue, loader, what the table's details column says)
PHASES: list[tuple[str, str, str, Callable[[str, bench.BenchConfig, int], int], str]] = [
    ("fair_queue", "processing (fair queue)", FAIR_QUEUE, _load_fair,
     f"fair queue, {PARTITIONS} partition keys"),
    ("rate_limited", "processing (rate limit)", RATED_QUEUE, _load_rated,
     f"worker limited to {RATE.limit:,}/s (burst {RATE.burst:,})"),
    ("workflow", "processing (workflows)", FLOW_QUEUE, _load_workflows,
     "workflow diamonds a -> b, c -> d"),
]  # fmt: skip


def _ratios(phase: dict[str, Any], plain: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for figure in FIGURES:
        mine, base = phase.get(figure), plain.get(figure)
        out[figure] = round(mine / base, 3) if mine is not None and base else None
    return out


def run_features(
    url: str, cfg: bench.BenchConfig, progress: bench.Progress, plain: dict[str, Any],
    empty: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Every feature phase, each with its figures divided by `plain`'s (`vs_plain`)."""
    report: dict[str, Any] = {}
    for key, label, queue, load, _ in PHASES:
        if not empty:
            label = label.replace("(", "(+finished, ", 1)
        phase = measure_feature(url, cfg, progress, label, queue, load, empty)
        phase["vs_plain"] = _ratios(phase, plain)
        report[key] = phase
    return report


# -- output and command line --------------------------------------------------------------------


def add_rows(table: Any, report: dict[str, Any]) -> None:
    """The feature phases' rows in `shigoto bench`'s table, after the plain ones."""
    for section, suffix in (("features", ""), ("features_with_finished", ", finished rows")):
        for key, _, _, _, details in PHASES if section in report else ():
            p = report[section][key]
            ratio = p["vs_plain"]["jobs_per_s"]
            table.add_row(
                f"processing, {key.replace('_', ' ')}{suffix}",
                bench._num(p["jobs_per_s"], ",.0f", " jobs/s"), "≥ 90 % of plain",
                bench._num(p.get("client_cpu_us_per_job"), ",.1f", " µs"),
                bench._num(p.get("server_cpu_us_per_job"), ",.1f", " µs"),
                bench._num(p.get("wal_bytes_per_job"), ",.0f", " B"),
                f"{details}; {p['jobs']:,} jobs, {bench._num(ratio and 100 * ratio, '.0f', ' %')}"
                f" of plain; deferred {p['deferred']}",
            )  # fmt: skip
