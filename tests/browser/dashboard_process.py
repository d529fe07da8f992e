"""A real `shigoto dashboard` subprocess for the browser tests, with its log kept in a file.

It listens on a port of its own choosing (`--port 0`) and prints its URL, so tests running side
by side under xdist never fight over a port. The log is shown when it fails to start.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tests.support.runner_process import ROOT

SERVING = re.compile(r"serving (http://\S+?)/? ")
START_DEADLINE = 30.0


class DashboardProcess:
    def __init__(
        self, db_url: str, log_path: Path, *, token: str | None, schema: str | None = None,
        show_args: str | None = None, env: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        child_env = {
            key: value for key, value in os.environ.items()
            if not key.startswith("SHIGOTO_DASHBOARD_")
        }  # fmt: skip
        child_env.update({
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        })  # fmt: skip
        if token is not None:
            child_env["SHIGOTO_DASHBOARD_TOKEN"] = token
        cmd = [sys.executable, "-m", "shigoto.cli", "dashboard", "--host", "127.0.0.1",
               "--port", "0", "--database-url", db_url]  # fmt: skip
        if schema:
            cmd += ["--schema", schema]
        if show_args:
            cmd += ["--show-args", show_args]
        self.token = token
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=child_env, stdout=self._log, stderr=subprocess.STDOUT
        )
        try:
            self.url = self._wait_serving()
        except BaseException:
            self.close()
            raise

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text("utf-8", errors="replace")

    def _wait_serving(self) -> str:
        """The URL it printed, once it answers /api/session."""
        deadline = time.monotonic() + START_DEADLINE
        url: str | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                pytest.fail(f"shigoto dashboard exited with {code}:\n{self.output()}")
            found = SERVING.search(self.output())
            url = url or (found.group(1).rstrip("/") if found else None)
            if url and _answers(f"{url}/api/session"):
                return url
            time.sleep(0.05)
        pytest.fail(f"shigoto dashboard not serving after {START_DEADLINE:g} s:\n{self.output()}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self._log.close()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def started_dashboards(db_url: str, log_dir: Path) -> Iterator[Callable[..., DashboardProcess]]:
    """Yield `start(token=..., schema=..., show_args=...)`; every dashboard is stopped after."""
    made: list[DashboardProcess] = []

    def start(
        *, token: str | None = None, schema: str | None = None,
        show_args: str | None = None,
    ) -> DashboardProcess:  # fmt: skip
        process = DashboardProcess(db_url, log_dir / f"dashboard-{len(made)}.log", token=token,
                                   schema=schema, show_args=show_args)  # fmt: skip
        made.append(process)
        return process

    yield start
    for process in made:
        process.close()
