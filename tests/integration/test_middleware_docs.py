"""Every Python example of docs/middleware.md runs as written, in a process of its own, and
prints what the page says it prints: each against a fresh database, and all of them one after
another against one database, as a reader trying the page runs them (issue 25: the examples
defined workers in `__main__` on the default queue, so one example's leftover jobs were
drained by the next, which could not resolve them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "middleware.md").read_text(),
                      re.DOTALL)  # fmt: skip

#: What each example's output must contain, in page order.
EXPECTED = [
    ["{'completed': 1}", "took"],
    ["acme ['acme']", "refused: priority 99 is reserved for operators"],
    ["resizing cat.png job=", "attempt=1"],
    [],
    ['"name": "send docs-orders"', '"name": "process docs-orders"'],
]


def test_every_example_has_its_expectations() -> None:
    assert len(EXAMPLES) == len(EXPECTED)


def _run(db_url: str, index: int) -> str:
    """Example `index` as a user runs it: its own process, warnings shown (a worker defined in
    `__main__` without a name warns, and no example should)."""
    env = {**os.environ, "SHIGOTO_DATABASE_URL": db_url,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", EXAMPLES[index]], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for expected in EXPECTED[index]:
        assert expected in output, output
    for unwanted in ("Warning", "unknown worker", "Traceback", "retryable"):
        assert unwanted not in output, output
    return output


@pytest.mark.parametrize("index", range(len(EXPECTED)))
def test_the_example_runs(db_url: str, index: int) -> None:
    _run(db_url, index)


def test_the_examples_run_one_after_another_on_one_database(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    for index in range(len(EXPECTED)):
        _run(db_url, index)
    # Whatever an example left behind is its own queue's, and no job failed.
    left = conn.execute("SELECT queue, worker, state FROM shigoto_jobs "
                        "WHERE state NOT IN ('completed', 'available')").fetchall()  # fmt: skip
    assert left == []
