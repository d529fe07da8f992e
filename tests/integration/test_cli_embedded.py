"""The embedded PostgreSQL of the local CLI: its URL is shown, it stops when its last user
exits, even after a user died without cleaning up, and `shigoto embedded` manages it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shigoto.db import embedded
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SHIGOTO_DATABASE_URL"}
    env["PYTHONPATH"] = str(ROOT)
    env["SHIGOTO_LOG_LEVEL"] = "info"
    return env


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shigoto.cli", *args], cwd=cwd, env=_env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.slow
def test_a_dead_users_handle_never_keeps_the_server_running(tmp_path: Path) -> None:
    data = tmp_path / ".shigoto"
    result = _cli(tmp_path, "embedded", "url")
    assert result.returncode == 2 and "not running" in result.stderr

    log = (tmp_path / "run.log").open("wb")
    runner = subprocess.Popen(
        [sys.executable, "-m", "shigoto.cli", "run", "--poll-interval", "0.2"],
        cwd=tmp_path, env=_env(), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        def output() -> str:
            return (tmp_path / "run.log").read_text(errors="replace")

        wait_until(lambda: " started" in output() or runner.poll() is not None, timeout=120)
        assert "using the embedded PostgreSQL at postgresql://" in output(), output()
        runner.send_signal(signal.SIGKILL)  # no atexit hooks: its handle stays behind
        runner.wait(30)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        log.close()
    assert embedded.running_url(data) is not None
    handles = json.loads((data / "pg" / ".handle_pids.json").read_text())
    assert runner.pid in handles, "the dead runner's handle is left behind"

    status = _cli(tmp_path, "status", "--json")
    assert status.returncode == 0, status.stderr
    wait_until(lambda: embedded.running_url(data) is None,
               message="the last live user stops the server despite the dead one's handle")



@pytest.mark.slow
def test_embedded_start_keeps_a_fresh_server_until_stop(tmp_path: Path) -> None:
    data = tmp_path / "fresh"
    flag = ("--data-dir", str(data))
    started = _cli(tmp_path, "embedded", "start", *flag)  # initdb in a new directory
    try:
        assert started.returncode == 0, started.stderr
        url = started.stdout.strip()
        assert url.startswith("postgresql://")
        assert embedded.running_url(data) == url, "kept running for other tools"
        assert _cli(tmp_path, "embedded", "url", *flag).stdout.strip() == url
    finally:
        stopped = _cli(tmp_path, "embedded", "stop", *flag)
    assert stopped.returncode == 0, stopped.stderr
    assert embedded.running_url(data) is None
