"""Issue 25, second contact (items 3, 4, 6 and three of 11), with real `shigoto` processes:
a bad --import is one line before any connection, a runner that could run nothing says so at
start, connection errors mask the password only, a cron file's typo names itself, a cron entry
for a misspelled worker is refused, and get_job opens what this process can open."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.encryption import Key, KeyRing, is_envelope, sealing
from shigoto.errors import ValidationError
from tests.support import encryption_workers
from tests.support.in_process import running
from tests.support.second_contact_cli import counting_port, make_project, shigoto_in, start_in
from tests.support.waiting import wait_until

WORKERS = "tests.support.process_workers"


def one_line_refusal(result: subprocess.CompletedProcess[str]) -> str:
    """The one line of a refusal: exit 2, no traceback."""
    assert result.returncode == 2, result
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, result.stderr
    return line


# -- item 3: a bad --import is one line, before the database --------------------------------


@pytest.mark.parametrize(
    ("module", "words"),
    [
        ("shop.workrs", ["--import shop.workrs: no module named 'shop.workrs'",
                         "did you mean shop.workers?"]),
        ("nosuchpkg.workers", ["no module named 'nosuchpkg'", "is the project folder on "
                               "PYTHONPATH? cwd is "]),
        ("shop.broken", ["--import shop.broken: SyntaxError at shop/broken.py:3"]),
        ("shop.needs", ["needs module 'requestz_not_installed', which is not installed",
                        "shop/needs.py:2"]),
        ("shop.raises", ["raised ValueError at shop/raises.py:3: SMTP_HOST is not set"]),
    ],
)  # fmt: skip
def test_a_bad_import_is_one_line_and_never_connects(
    tmp_path: Path, module: str, words: list[str]
) -> None:
    project = make_project(tmp_path)
    with counting_port() as (port, accepted):
        result = shigoto_in(project, "run", "--database-url",
                            f"postgresql://app:pw-secret@127.0.0.1:{port}/db",
                            "--import", module)  # fmt: skip
    line = one_line_refusal(result)
    assert line.startswith("shigoto run: ")
    for w in words:
        assert w in line
    assert accepted == [], "the runner connected (to migrate?) before importing its workers"


def test_a_bad_import_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    with counting_port() as (port, accepted):
        result = shigoto_in(project, "run", "--database-url", f"postgresql://a@127.0.0.1:{port}/d",
                            SHIGOTO_IMPORT="shop.workers,shop.workrs")  # fmt: skip
    assert "SHIGOTO_IMPORT shop.workrs: no module named" in one_line_refusal(result)
    assert accepted == []


# -- item 4: a runner with nothing to run -----------------------------------------------------


def test_an_encrypted_worker_without_keys_is_refused_at_start(tmp_path: Path) -> None:
    with counting_port() as (port, accepted):
        result = shigoto_in(tmp_path, "run", "--database-url", f"postgresql://a@127.0.0.1:{port}/d",
                            "--import", "tests.support.encryption_workers")  # fmt: skip
    line = one_line_refusal(result)
    assert "worker tests.support.encryption_workers." in line
    assert "SHIGOTO_ENCRYPTION_KEYS" in line and "DecryptionError" in line
    assert accepted == []


def test_a_runner_without_workers_warns_loudly_and_runs(db_url: str, tmp_path: Path) -> None:
    log = tmp_path / "runner.log"
    proc = start_in(tmp_path, log, "run", "--queue", "emails=2", "--poll-interval", "0.2",
                    SHIGOTO_DATABASE_URL=db_url, SHIGOTO_LOG_LEVEL="info")  # fmt: skip
    try:
        wait_until(lambda: "no workers registered" in log.read_text(), timeout=30,
                   message=f"the warning; log:\n{log.read_text()}")  # fmt: skip
        text = log.read_text()
        assert "--import / SHIGOTO_IMPORT" in text and "emails" in text and "WARNING" in text
        assert proc.poll() is None, "not refused: a runner may serve only cron"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


# -- item 6: the password, and only it, is masked ----------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown", "hidden"),
    [
        ("postgresql//oops", 'missing "=" after "postgresql//oops"', None),
        ("host=127.0.0.1 port=abc password=pw-hunter22",
         'invalid integer value "abc" for connection option "port"', "pw-hunter22"),
        ("postgresql//app:pw-hunter22@db", 'missing "=" after "postgresql//app:***@db"',
         "pw-hunter22"),
        ("postgresql://app:pw%zzhunter@db/x", 'invalid percent-encoded token: "***"', "zzhunter"),
    ],
)  # fmt: skip
def test_connection_errors_mask_the_password_only(
    tmp_path: Path, url: str, shown: str, hidden: str | None
) -> None:
    line = one_line_refusal(shigoto_in(tmp_path, "status", "--database-url", url))
    assert shown in line
    assert hidden is None or hidden not in line


# -- item 11: cron file typos, misspelled workers, get_job ---------------------------------------


def test_a_typo_in_a_cron_file_names_the_file_the_entry_and_the_key(tmp_path: Path) -> None:
    cron = tmp_path / "schedules.json"
    cron.write_text(json.dumps([{"name": "nightly", "schedul": "0 3 * * *",
                                 "worker": "tests.support.process_workers.echo"}]))  # fmt: skip
    with counting_port() as (port, accepted):
        result = shigoto_in(tmp_path, "run", "--database-url", f"postgresql://a@127.0.0.1:{port}/d",
                            "--import", WORKERS, "--cron", str(cron))  # fmt: skip
    line = one_line_refusal(result)
    assert str(cron) in line and "'nightly'" in line
    assert "unknown key 'schedul' (did you mean 'schedule'?)" in line
    assert "build_schedule" not in line and accepted == []


def test_a_cron_file_naming_a_worker_its_module_lacks_is_refused(tmp_path: Path) -> None:
    cron = tmp_path / "schedules.json"
    cron.write_text(json.dumps([{"name": "nightly", "schedule": "0 3 * * *",
                                 "worker": "tests.support.process_workers.ecoh"}]))  # fmt: skip
    result = shigoto_in(tmp_path, "run", "--database-url", "postgresql://a@127.0.0.1:1/d",
                        "--import", WORKERS, "--cron", str(cron))  # fmt: skip
    assert "did you mean tests.support.process_workers.echo?" in one_line_refusal(result)


def test_cron_schedule_refuses_a_worker_its_module_does_not_define(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(ValidationError) as bad:
        shigoto.cron.schedule("nightly", "0 3 * * *", "tests.support.process_workers.ecoh")
    assert bad.value.field == "worker"
    assert "did you mean tests.support.process_workers.echo?" in bad.value.message
    assert conn.execute("SELECT count(*) FROM shigoto_cron").fetchone() == (0,)
    with pytest.raises(ValidationError) as typo:
        shigoto.cron.schedule("nightly", "0 3 * * *", "tests.support.process_workers.echo",
                              catchup="all")  # fmt: skip
    assert "unknown key 'catchup' (did you mean 'catch_up'?)" in str(typo.value)


def test_cron_schedule_accepts_a_worker_of_another_codebase_with_a_warning(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="shigoto.cron")
    row = shigoto.cron.schedule("billing", "0 3 * * *", "billing_service.jobs.invoice")
    assert row["worker"] == "billing_service.jobs.invoice"
    assert any("billing_service.jobs.invoice is not registered in this process" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    shigoto.cron.schedule("echo", "0 3 * * *", "tests.support.process_workers.echo")  # no error


async def test_get_job_opens_sealed_args_and_results_with_the_process_keys(
    db_url: str, key_ring: KeyRing
) -> None:
    secret = encryption_workers.SECRET
    job = await shigoto.aenqueue(encryption_workers.echo, {"card": secret})
    async with running(db_url, imports=["tests.support.encryption_workers"]):
        await shigoto.await_for(job.id, timeout=30)
    found = shigoto.get_job(job.id)
    assert found is not None and found.args == {"card": secret}
    assert found.result == {"card": secret}
    opened = await shigoto.aget_job(job.id)
    assert opened is not None and opened.args == {"card": secret}
    stored = shigoto.get_job(job.id, keep_sealed=True)
    assert stored is not None and is_envelope(stored.args) and is_envelope(stored.result)
    sealing.use_keys(None)  # no keys: sealed, and no error
    without = shigoto.get_job(job.id)
    assert without is not None and is_envelope(without.args) and is_envelope(without.result)
    sealing.use_keys(KeyRing([Key.from_secret(b"x" * 32)]))  # another key: sealed too
    other = shigoto.get_job(job.id)
    assert other is not None and is_envelope(other.args) and secret not in json.dumps(other.args)
