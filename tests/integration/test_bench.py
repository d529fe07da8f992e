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
