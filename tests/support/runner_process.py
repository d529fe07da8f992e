"""A real `shigoto run` subprocess for tests, with its output kept in a log file.

The log is shown when a test fails, so a runner that died or hung explains itself. Tests start
them through the `runner_processes` fixture (tests/conftest.py), which kills what is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class RunnerProcess:
    def __init__(
        self, db_url: str, log_path: Path, *extra: str, workers: str, queue: str = "default=5",
        env: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "SHIGOTO_DATABASE_URL": db_url,
            "PYTHONUNBUFFERED": "1",
            "SHIGOTO_LOG_LEVEL": "info",  # shutdown tests watch for the "stopping" line
            **(env or {}),
        }
        cmd = [
            sys.executable, "-m", "shigoto.cli", "run", "--queue", queue,
            "--import", workers, "--poll-interval", "0.2", *extra,
        ]  # fmt: skip
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text("utf-8", errors="replace")

    def signal(self, sig: int) -> None:
        assert self.proc.poll() is None, f"runner died early:\n{self.output()}"
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 45.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"runner did not exit within {timeout:g} s:\n{self.output()}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self._log.close()


def started_processes(db_url: str, log_dir: Path) -> Iterator[Callable[..., RunnerProcess]]:
    """Yield a `start(*extra, workers=..., queue=..., env=...)` whose processes are all closed
    afterwards; logs go to `log_dir`, apart from whatever the test writes next to it."""
    made: list[RunnerProcess] = []

    def start(
        *extra: str, workers: str, queue: str = "default=5", env: Mapping[str, str] | None = None
    ) -> RunnerProcess:
        p = RunnerProcess(db_url, log_dir / f"runner-{len(made)}.log", *extra, workers=workers,
                          queue=queue, env=env)  # fmt: skip
        made.append(p)
        return p

    yield start
    for p in made:
        p.close()
