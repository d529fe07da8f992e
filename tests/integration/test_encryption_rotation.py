"""Encryption at rest with real `shigoto run` processes and the real CLI: no plaintext
anywhere (table, archive, errors, runner logs, `shigoto status --json`), and a key rotation
with `shigoto rekey` while runners process the jobs."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.db import insert_encryption
from shigoto.encryption import ENV_VAR, Key, envelope_kid, sealing
from tests.support import encryption_workers as w
from tests.support.encryption_workers import SECRET
from tests.support.runner_process import ROOT, RunnerProcess
from tests.support.waiting import wait_until

WORKERS = "tests.support.encryption_workers"
A = base64.b64encode(b"a" * 32).decode()
B = base64.b64encode(b"b" * 32).decode()
KID_A, KID_B = Key.from_secret(b"a" * 32).kid, Key.from_secret(b"b" * 32).kid
#: Pieces of the secret that must not show up either.
PIECES = (SECRET, "4111-1111", "zebra")


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process seals with key A, read from the variable as in production."""
    monkeypatch.setenv(ENV_VAR, A)
    sealing.reload_keys()
    insert_encryption._ENCRYPTED_QUEUES.clear()
    yield
    sealing.reload_keys()
    insert_encryption._ENCRYPTED_QUEUES.clear()


def cli(url: str, *args: str, keys: str = A) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHIGOTO_DATABASE_URL": url, ENV_VAR: keys,
           "SHIGOTO_LOG_LEVEL": "debug"}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "shigoto.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def leaks(text: str) -> list[str]:
    return [piece for piece in PIECES if piece in text]


def table_text(conn: psycopg.Connection[Any], table: str) -> str:
    found = conn.execute(f"SELECT coalesce(string_agg(t::text, E'\\n'), '') FROM {table} t")
    return str(found.fetchone()[0])  # type: ignore[index]


def states(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return dict(conn.execute("SELECT state, count(*) FROM shigoto_jobs GROUP BY state").fetchall())


def test_no_plaintext_in_the_table_archive_errors_logs_or_status(
    db_url: str, conn: psycopg.Connection[Any], runner_processes: Callable[..., RunnerProcess]
) -> None:
    shigoto.set_queue("vault", encrypted=True)
    jobs = [
        shigoto.enqueue(w.charge, {"card": SECRET}),
        shigoto.enqueue(w.leaky, {"card": SECRET}),  # fails twice, message quoting the card
        shigoto.enqueue(w.echo, {"card": SECRET}),  # sealed result
        shigoto.enqueue(w.plain, {"card": SECRET}, queue="vault"),  # encrypted queue
        shigoto.enqueue(w.charge, {"card": SECRET}, unique=True),
    ]
    runner = runner_processes(workers=WORKERS, queue="default=4,vault=2",
                              env={ENV_VAR: A, "SHIGOTO_LOG_LEVEL": "debug"})  # fmt: skip
    wait_until(lambda: states(conn) in ({"completed": 4, "discarded": 1},),
               timeout=60, message="every job finished")  # fmt: skip
    errors = conn.execute("SELECT errors::text FROM shigoto_jobs WHERE id = %s",
                          (jobs[1].id,)).fetchone()[0]  # fmt: skip
    assert "ValueError" in errors and leaks(errors) == []
    assert leaks(table_text(conn, "shigoto_jobs")) == []

    status = cli(db_url, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert leaks(status.stdout + status.stderr) == []

    assert shigoto.prune(prune_after=0)["archived"] == len(jobs)
    archive = table_text(conn, "shigoto_jobs_archive")
    assert archive.count("$shigoto_enc") >= len(jobs) and leaks(archive) == []

    runner.signal(15)
    assert runner.wait_exit() == 0
    log = runner.output()
    assert "failed attempt 1 of 2" in log and "ValueError" in log  # the runner did log
    assert leaks(log) == []


def test_rotation_with_jobs_in_flight(
    db_url: str,
    conn: psycopg.Connection[Any],
    runner_processes: Callable[..., RunnerProcess],
    tmp_path: Path,
) -> None:
    """Runners hold 8 jobs executing (a gate file) while rekey runs: those are skipped and
    reported, the waiting ones re-sealed under B; once the gate opens every job completes,
    old and new envelopes alike, and a second rekey leaves every row under B."""
    total, gate = 200, str(tmp_path / "gate")
    jobs = [{"worker": w.gated, "args": {"card": f"{SECRET}-{i}", "gate": gate}}
            for i in range(total)]  # fmt: skip
    shigoto.enqueue_many(jobs)
    kids = conn.execute("SELECT DISTINCT args ->> 'kid' FROM shigoto_jobs").fetchall()
    assert kids == [(KID_A,)]

    # Step 1 of the procedure: the runners get B first, A after it.
    for _ in range(2):
        runner_processes(workers=WORKERS, queue="default=4", env={ENV_VAR: f"{B},{A}"})
    wait_until(lambda: states(conn).get("executing") == 8, timeout=60,
               message="8 jobs in flight")  # fmt: skip

    first = cli(db_url, "rekey", "--batch-size", "50", "--json", keys=f"{B},{A}")
    assert first.returncode == 3, first.stderr  # the jobs in flight remain
    report = json.loads(first.stdout)
    assert report["kid"] == KID_B
    assert report["tables"][0]["rows"] == total - 8
    assert report["tables"][0]["remaining_executing"] == 8
    assert states(conn) == {"executing": 8, "available": total - 8}

    open(gate, "w").close()
    wait_until(lambda: states(conn) == {"completed": total}, timeout=120,
               message="every job completed")  # fmt: skip
    final = cli(db_url, "rekey", keys=f"{B},{A}")
    assert final.returncode == 0, (final.stdout, final.stderr)
    assert "complete" in final.stdout
    rows = conn.execute("SELECT args FROM shigoto_jobs").fetchall()
    assert len(rows) == total and {envelope_kid(args) for (args,) in rows} == {KID_B}
    assert conn.execute("SELECT count(*) FROM shigoto_jobs WHERE errors <> '[]'"
                        ).fetchone() == (0,)  # fmt: skip


def test_rekey_refuses_without_keys_and_dry_run_counts(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    shigoto.enqueue_many([{"worker": w.charge, "args": {"card": SECRET}} for _ in range(3)])
    refused = cli(db_url, "rekey", keys="")
    assert refused.returncode == 2 and ENV_VAR in refused.stderr
    assert "Traceback" not in refused.stderr
    dry = cli(db_url, "rekey", "--dry-run", keys=f"{B},{A}")
    assert dry.returncode == 3 and "shigoto_jobs: 3 rows to re-encrypt" in dry.stdout
    assert {envelope_kid(a) for (a,) in conn.execute("SELECT args FROM shigoto_jobs")} == {KID_A}
    generated = cli(db_url, "keys", "generate")
    assert generated.returncode == 0 and len(base64.b64decode(generated.stdout.strip())) == 32
    listed = cli(db_url, "keys", "list", keys=f"{B},{A}")
    assert listed.stdout.split() == [KID_B, KID_A]
