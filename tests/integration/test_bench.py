"""`shigoto bench` smoke test: every phase runs on tiny sizes and reports what it should.

No timing assertions: the benchmark's figures are for people, never for CI.
"""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from shigoto.cli import bench
from shigoto.db import embedded

TINY = bench.BenchConfig(
    bulk_jobs=25, bulk_batch=10, single_jobs=5, process_jobs=30, concurrency=4,
    latency_jobs=5, latency_gap=(0.001, 0.002), finished=200,
)  # fmt: skip


def test_every_phase_reports_and_every_job_completes(db_url: str) -> None:
    report = bench.run(db_url, TINY)

    json.dumps(report, allow_nan=False)  # `--json` output must be valid JSON
    assert report["config"]["process_jobs"] == 30
    env = report["environment"]
    assert env["postgresql"]["server_version"] and env["cpus"] and env["loadavg_after"]

    bulk = report["bulk_enqueue"]
    assert bulk["inserted"] == 25 and bulk["batch"] == 10
    single = report["single_enqueue"]
    assert single["inserted"] == 5
    for phase in (bulk, single):
        assert phase["jobs_per_s"] > 0 and phase["client_cpu_us_per_job"] > 0

    processing = report["processing"]
    assert processing["completed"] == 30
    assert processing["jobs_per_s"] > 0 and processing["concurrency"] == 4

    latency = report["pickup_latency"]
    assert latency["started"] == 5 and latency["completed"] == 5
    assert 0 < latency["ms_p50"] <= latency["ms_p95"] <= latency["ms_p99"] <= latency["ms_max"]

    finished = report["processing_with_finished"]
    assert finished["finished_rows"] == 200 and finished["completed"] == 30
    assert finished["ratio_to_empty"] > 0


def test_from_jobs_derives_the_phase_sizes() -> None:
    cfg = bench.BenchConfig.from_jobs(20_000, 50, 1_000_000, "public")
    assert (cfg.bulk_jobs, cfg.single_jobs, cfg.process_jobs, cfg.latency_jobs) == (
        100_000, 5_000, 20_000, 500,
    )  # fmt: skip
    assert cfg.finished == 1_000_000 and cfg.concurrency == 50
    small = bench.BenchConfig.from_jobs(3, 2, 0, "public")
    assert small.single_jobs == 1 and small.latency_jobs == 3


def test_dedicated_database_is_created_migrated_and_dropped(server_url: str) -> None:
    name = f"shigoto_bench_t_{uuid.uuid4().hex[:8]}"
    url = bench.prepare_database(server_url, "public", name=name)
    try:
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone() == (0,)
    finally:
        bench.drop_database(server_url, name=name)
    with psycopg.connect(server_url) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    assert row is None
    assert embedded.with_database(server_url, name) == url


@pytest.mark.parametrize("argv", [["bench", "--jobs", "10", "--finished", "100", "--json"]])
def test_cli_accepts_the_bench_flags(argv: list[str]) -> None:
    from shigoto.cli.commands import build_parser

    args = build_parser().parse_args(argv)
    assert (args.jobs, args.finished, args.json, args.concurrency) == (10, 100, True, 50)


def test_feature_phases_run_beside_plain_and_every_job_completes(db_url: str) -> None:
    """`--features`: the fair queue, rate-limited and workflow phases each process every job
    they loaded (all four steps of each workflow diamond), with the cost figures and their
    ratios to the plain phase; again on the finished rows when `finished` is set."""
    from shigoto.cli import bench_features

    cfg = bench.BenchConfig(
        bulk_jobs=10, bulk_batch=10, single_jobs=2, process_jobs=24, concurrency=4,
        latency_jobs=2, latency_gap=(0.001, 0.002), finished=100,
    )  # fmt: skip
    report = bench.run(db_url, cfg, features=True)

    json.dumps(report, allow_nan=False)
    for section in ("features", "features_with_finished"):
        phases = report[section]
        assert set(phases) == {"fair_queue", "rate_limited", "workflow"}
        for name, phase in phases.items():
            assert phase["jobs"] == 24 and phase["completed"] == 24, (section, name)
            assert phase["deferred"] == 0, (section, name)  # the limit never holds a job
            assert phase["jobs_per_s"] > 0 and phase["client_cpu_us_per_job"] > 0
            assert set(phase["vs_plain"]) == set(bench_features.FIGURES)
    assert report["processing_with_finished"]["completed"] == 24
    with psycopg.connect(db_url) as conn:
        fair = conn.execute("SELECT fair FROM shigoto_queues WHERE name = %s",
                            (bench_features.FAIR_QUEUE,)).fetchone()  # fmt: skip
        waiting = conn.execute("SELECT count(*) FROM shigoto_jobs WHERE state <> 'completed'"
                               " AND queue LIKE 'bench%'").fetchone()  # fmt: skip
    assert fair == (True,) and waiting == (0,)


def test_features_flags_reach_the_bench_command() -> None:
    """`shigoto bench` parses the feature phases' flags itself."""
    from shigoto.cli import commands

    args = commands.build_parser().parse_args(
        ["bench", "--jobs", "10", "--features", "--bench-database", "x"])  # fmt: skip
    assert args.features and args.bench_database == "x" and args.jobs == 10
    plain = commands.build_parser().parse_args(["bench"])
    assert not plain.features and plain.bench_database == "shigoto_bench"
