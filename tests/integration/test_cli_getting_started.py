"""docs/getting-started.md, run as written: every `sh` and `python` block, in order, in a fresh
project folder, against a test database.

A python block that starts with a `# path/to/file.py` comment is that file of the project: it
is written, not run. Every other python block runs on its own (`python -`), so each must stand
on its own as a reader would paste it. An `sh` block runs in bash with the test's virtualenv
first on PATH, stopping at the first failing command. Only three kinds of line are not run
verbatim, each for a reason:

- `pip install ...`: Shigoto is already installed in the test's virtualenv;
- `export SHIGOTO_DATABASE_URL=...`: the example server does not exist; the test database is
  already in the environment;
- `shigoto run ...`: it serves until stopped, so it runs in the background until the jobs the
  guide enqueued so far are done, then gets SIGTERM and must exit 0.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "getting-started.md"
BIN = Path(sys.executable).parent
FILE_HEADER = re.compile(r"^# ([\w./-]+\.py)\s*$")


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int


def blocks(markdown: str) -> list[Block]:
    found = []
    for match in re.finditer(r"^```(\w+)\n(.*?)^```", markdown, re.MULTILINE | re.DOTALL):
        if match[1] in ("sh", "python"):
            found.append(Block(match[1], match[2], markdown[: match.start()].count("\n") + 1))
    return found


def _env(db_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHIGOTO_SCHEMA")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", SHIGOTO_DATABASE_URL=db_url,
               PYTHONUNBUFFERED="1", SHIGOTO_LOG_LEVEL="warning")  # fmt: skip
    return env


def _check(result: subprocess.CompletedProcess[str], block: Block, what: str) -> None:
    assert result.returncode == 0, (
        f"getting-started.md line {block.line}: {what} failed ({result.returncode})\n"
        f"{block.text}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )


def _unfinished(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM shigoto_jobs WHERE state IN ('available', 'executing')"
    ).fetchone()
    assert row is not None
    return int(row[0])


def _serve(line: str, project: Path, env: dict[str, str], conn: psycopg.Connection[Any],
           block: Block) -> None:  # fmt: skip
    log = project / "runner.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=project, env=env,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            wait_until(lambda: _unfinished(conn) == 0 or proc.poll() is not None,
                       message=f"jobs done by `{line}`")  # fmt: skip
            assert proc.poll() is None, f"line {block.line}: `{line}` died:\n{log.read_text()}"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, f"line {block.line}: `{line}`:\n{log.read_text()}"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _run_sh(block: Block, project: Path, env: dict[str, str],
            conn: psycopg.Connection[Any]) -> None:  # fmt: skip
    script: list[str] = []

    def flush() -> None:
        if script:
            text = "set -e\n" + "\n".join(script)
            result = subprocess.run(["bash", "-c", text], cwd=project, env=env,
                                    capture_output=True, text=True, timeout=300)  # fmt: skip
            _check(result, block, "sh block")
            script.clear()

    for line in block.text.splitlines():
        command = line.strip()
        if command.startswith(("pip install", "export SHIGOTO_DATABASE_URL=")):
            continue
        if command.startswith("shigoto run"):
            flush()
            _serve(command, project, env, conn, block)
            continue
        script.append(line)
    flush()


@pytest.mark.slow
def test_getting_started_runs_as_written(
    db_url: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    env = _env(db_url)
    found = blocks(GUIDE.read_text("utf-8"))
    assert sum(b.language == "sh" for b in found) >= 5
    assert any("shigoto run" in b.text for b in found)
    for block in found:
        header = FILE_HEADER.match(block.text.splitlines()[0]) if block.text.strip() else None
        if block.language == "python" and header:
            path = project / header[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.text, "utf-8")
        elif block.language == "python":
            result = subprocess.run(
                [str(BIN / "python"), "-"], input=block.text, cwd=project, env=env,
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            _check(result, block, "python block")
        else:
            _run_sh(block, project, env, conn)
    done = conn.execute(
        "SELECT count(*) FROM shigoto_jobs WHERE worker = 'myapp.workers.send_welcome'"
        " AND state = 'completed'"
    ).fetchone()
    assert done is not None and done[0] >= 5, "the guide's jobs ran"
