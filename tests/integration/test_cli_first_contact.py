"""First contact with the `shigoto` command: clean one-line errors instead of tracebacks, and
the commands and flags users of Oban, River or Celery reach for."""

from __future__ import annotations

import json
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import telemetry
from shigoto.cli.commands import redact
from shigoto.cron.definitions import load_file
from tests.integration.test_cli import ok, refused, shigoto_cli, shigoto_process, state_of
from tests.support.http_probe import http_get
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import wait_until

WORKERS = "tests.support.process_workers"
ECHO = WORKERS + ".echo"


# -- errors are one line, exit 2, no traceback, no password ---------------------------------


def test_version(db_url: str) -> None:
    result = shigoto_process(db_url, "--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"shigoto {shigoto.__version__}"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("not a url", "--database-url"),
        ("mysql://u@h/db", "--database-url"),
        ("host=x bogus=1", "--database-url"),
        ("postgresql://u@h:notaport/db", "cannot reach the database"),
    ],
)
def test_a_bad_database_url_is_one_clear_line(url: str, words: str) -> None:
    assert words in refused(shigoto_cli(url, "status"))


def test_a_bad_log_level_is_a_usage_error(db_url: str) -> None:
    result = shigoto_cli(db_url, "--log-level", "loud", "status")
    assert "--log-level" in refused(result)
    assert "SHIGOTO_LOG_LEVEL" in refused(shigoto_cli(db_url, "status", SHIGOTO_LOG_LEVEL="loud"))


def test_a_bad_env_var_names_itself_and_never_breaks_help(db_url: str) -> None:
    env = {"SHIGOTO_POLL_INTERVAL": "abc", "SHIGOTO_HEALTH_PORT": "http"}
    for args in (("--help",), ("run", "--help")):
        result = shigoto_cli(db_url, *args, **env)
        assert result.returncode == 0, result.stderr
    stderr = refused(shigoto_process(db_url, "run", "--import", WORKERS, **env))
    assert "SHIGOTO_POLL_INTERVAL" in stderr and "abc" in stderr


def test_the_health_port_in_use_is_a_clear_error(db_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stderr = refused(shigoto_process(db_url, "run", "--import", WORKERS, "--health-port",
                                         str(port)))  # fmt: skip
    assert f"--health-port {port}" in stderr and "cannot listen" in stderr


def test_database_errors_never_show_the_password() -> None:
    url = "postgresql://app:s3cret-Pa55@127.0.0.1:1/app?connect_timeout=2"
    stderr = refused(shigoto_process(url, "status"))
    assert "s3cret-Pa55" not in stderr
    assert "cannot reach the database" in stderr
    assert redact("failed for postgresql://app:s3cret-Pa55@db/app") == (
        "failed for postgresql://app:***@db/app"
    )
    assert "s3cret" not in redact("host=db password='s3cret x' user=app")


def test_run_without_migrating_still_gives_the_servers_reason() -> None:
    url = "postgresql://app:pw@127.0.0.1:1/app"
    stderr = refused(shigoto_process(url, "run", "--no-migrate", "--import", WORKERS))
    assert "Connection refused" in stderr, stderr


def test_oversized_args_are_a_validation_error_naming_the_limit(db_url: str) -> None:
    from shigoto.jobspec import MAX_ARGS_BYTES

    with pytest.raises(shigoto.ValidationError) as err:
        shigoto.enqueue("w", {"blob": "x" * MAX_ARGS_BYTES})
    assert err.value.field == "args"
    assert str(MAX_ARGS_BYTES) in str(err.value)


# -- pause, resume, status ------------------------------------------------------------------


def test_pause_and_resume_from_the_cli_show_in_status(db_url: str) -> None:
    # A queue nothing names yet is refused (a typo would store a phantom setting) ...
    assert "--create" in refused(shigoto_process(db_url, "pause", "emails"))
    # ... unless asked for: a queue paused before its first job.
    assert ok(shigoto_cli(db_url, "pause", "emails", "--create")) == {
        "queue": "emails", "paused": True}  # fmt: skip
    shigoto.set_queue("billing", global_concurrency=3)
    queues = ok(shigoto_cli(db_url, "status", "--json"))["queues"]
    assert queues["emails"]["paused"] is True
    assert queues["billing"]["global_concurrency"] == 3
    text = shigoto_cli(db_url, "status")
    assert text.returncode == 0, text.stderr
    assert "PAUSED" in text.stdout and "emails" in text.stdout and "billing" in text.stdout
    assert ok(shigoto_cli(db_url, "resume", "emails")) == {"queue": "emails", "paused": False}
    assert ok(shigoto_cli(db_url, "status", "--json"))["queues"].get("emails") is None
    assert "queue" in refused(shigoto_process(db_url, "pause", "bad queue"))


def test_pause_queue_api_emits_telemetry(db_url: str, conn: psycopg.Connection[Any]) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    handle = telemetry.attach(lambda e, m, md: seen.append((e, md)), ["queue.pause",
                                                                        "queue.resume"])
    try:
        shigoto.pause_queue("emails")
        paused = conn.execute("SELECT paused FROM shigoto_queues WHERE name = 'emails'")
        assert paused.fetchone() == (True,)
        shigoto.resume_queue("emails")
    finally:
        telemetry.detach(handle)
    assert [(e, md["queue"]) for e, md in seen] == [("queue.pause", "emails"),
                                                    ("queue.resume", "emails")]  # fmt: skip


# -- retry and cancel -----------------------------------------------------------------------


def test_dry_run_lists_and_changes_nothing(db_url: str, conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(ECHO, {}, queue="q")
    assert ok(shigoto_cli(db_url, "cancel", "--queue", "q", "--dry-run")) == {
        "cancel": [job.id], "dry_run": True}  # fmt: skip
    assert state_of(conn, job.id) == "available"


def test_nothing_matched_says_why(db_url: str, conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(ECHO, {}, queue="q")
    conn.execute("UPDATE shigoto_jobs SET state = 'executing', attempt = 1 WHERE id = %s",
                 (job.id,))  # fmt: skip
    result = shigoto_cli(db_url, "retry", "--queue", "q")
    assert ok(result) == {"retry": []}
    assert "1 executing" in result.stderr
    result = shigoto_cli(db_url, "cancel", "--worker", "nope")
    assert ok(result) == {"cancel": []}
    assert "no job has worker 'nope'" in result.stderr


def test_a_workers_short_name_matches(db_url: str, conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(ECHO, {})
    lookalike = shigoto.enqueue("tests.support.process_workers.not_echo", {})
    assert ok(shigoto_cli(db_url, "cancel", "--worker", "echo")) == {"cancel": [job.id]}
    assert state_of(conn, lookalike.id) == "available"


def test_errors_name_the_flags(db_url: str) -> None:
    assert "--state" in refused(shigoto_cli(db_url, "cancel", "--state", "finished"))
    assert "--id, --queue" in refused(shigoto_cli(db_url, "retry"))
    assert "--priority" in refused(shigoto_cli(db_url, "enqueue", "w", "--priority", "99999999999"))


def test_retrying_completed_jobs_needs_yes(db_url: str, conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(ECHO, {})
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', attempt = 1, finished_at = now(),"
                 " completed_at = now() WHERE id = %s", (job.id,))  # fmt: skip
    assert "--yes" in refused(shigoto_cli(db_url, "retry", "--state", "completed"))
    assert state_of(conn, job.id) == "completed"
    assert ok(shigoto_cli(db_url, "retry", "--state", "completed", "--yes")) == {"retry": [job.id]}
    assert state_of(conn, job.id) == "available"


# -- prune ----------------------------------------------------------------------------------


def test_prune_now_with_retention_from_flag_or_env(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    old = shigoto.enqueue(ECHO, {})
    new = shigoto.enqueue(ECHO, {})
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', attempt = 1,"
                 " finished_at = now() - interval '2 hours', completed_at = now() WHERE id = %s",
                 (old.id,))  # fmt: skip
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', attempt = 1,"
                 " finished_at = now(), completed_at = now() WHERE id = %s", (new.id,))  # fmt: skip
    assert ok(shigoto_cli(db_url, "prune")) == {"archived": 0, "deleted": 0}
    assert ok(shigoto_process(db_url, "prune", SHIGOTO_PRUNE_AFTER="3600")) == {
        "archived": 1, "deleted": 0}  # fmt: skip
    assert ok(shigoto_cli(db_url, "prune", "--prune-after", "0", "--archive-retention",
                          "0")) == {"archived": 1, "deleted": 2}  # fmt: skip
    assert "SHIGOTO_ARCHIVE_RETENTION" in refused(
        shigoto_cli(db_url, "prune", SHIGOTO_ARCHIVE_RETENTION="-1"))


# -- cron file keys -------------------------------------------------------------------------


def test_cron_file_accepts_the_resources_timezone_spelling(tmp_path: Path) -> None:
    path = tmp_path / "cron.json"
    path.write_text(json.dumps([
        {"name": "a", "schedule": "0 3 * * *", "worker": ECHO, "timeZone": "Europe/Oslo"},
        {"name": "b", "schedule": "0 3 * * *", "worker": ECHO, "timezone": "Asia/Tokyo"},
    ]))  # fmt: skip
    assert [s.timezone for s in load_file(str(path))] == ["Europe/Oslo", "Asia/Tokyo"]


# -- a running runner -----------------------------------------------------------------------


def _health_url(runner: RunnerProcess) -> str:
    def found() -> str | None:
        for line in runner.output().splitlines():
            if "health server on http://" in line:
                return line.split("health server on ")[1].split()[0]
        return None

    return wait_until(found, message=runner.output())


@pytest.mark.slow
def test_health_host_and_a_quiet_graceful_stop(db_url: str, tmp_path: Path) -> None:
    runner = RunnerProcess(db_url, tmp_path / "runner.log", "--health-port", "0",
                           workers=WORKERS)  # fmt: skip
    runner_env = RunnerProcess(db_url, tmp_path / "env.log", "--health-port", "0",
                               workers=WORKERS)  # fmt: skip
    try:
        base = _health_url(runner)
        assert base.startswith("http://0.0.0.0:"), base
        runner_env.close()
        local = RunnerProcess(db_url, tmp_path / "local.log", "--health-port", "0",
                              "--health-host", "127.0.0.1", workers=WORKERS)  # fmt: skip
        try:
            url = _health_url(local)
            assert url.startswith("http://127.0.0.1:"), url
            assert http_get(url + "/healthz")[0] == 200
            local.signal(signal.SIGTERM)
            assert local.wait_exit() == 0
            out = local.output()
            assert "closed" not in out.lower() and "Traceback" not in out, out
        finally:
            local.close()
    finally:
        runner.close()
        runner_env.close()


@pytest.mark.slow
def test_a_second_ctrl_c_exits_at_once(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    marker = tmp_path / "job"
    job = shigoto.enqueue(WORKERS + ".gated", {"marker": str(marker)})
    runner = RunnerProcess(db_url, tmp_path / "runner.log", "--shutdown-timeout", "60",
                           workers=WORKERS)  # fmt: skip
    try:
        wait_until(lambda: Path(f"{marker}.started").exists(), message=runner.output())
        runner.signal(signal.SIGINT)
        wait_until(lambda: "again to exit at once" in runner.output(), message=runner.output())
        runner.signal(signal.SIGINT)
        assert runner.wait_exit() == 130, runner.output()
        assert "exiting at once" in runner.output()
        assert state_of(conn, job.id) == "executing"  # left for the rescuer, as said
    finally:
        Path(f"{marker}.release").touch()
        runner.close()


@pytest.mark.slow
def test_console_script_imports_from_the_current_directory(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    import os
    import subprocess

    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "workers.py").write_text(
        "import shigoto\n\n@shigoto.worker\ndef hello(name: str) -> str:\n"
        "    return f'hello {name}'\n"
    )
    job = shigoto.enqueue("myapp.workers.hello", {"name": "ada"})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SHIGOTO_DATABASE_URL"] = db_url
    script = Path(sys.executable).parent / "shigoto"
    proc = subprocess.Popen([str(script), "run", "--import", "myapp.workers", "--poll-interval",
                             "0.2"], cwd=tmp_path, env=env, stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_until(lambda: state_of(conn, job.id) == "completed" or proc.poll() is not None)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
