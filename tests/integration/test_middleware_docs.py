"""Every Python example of docs/middleware.md runs as written, in a process of its own, against
a fresh database, and prints what the page says it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "middleware.md").read_text(),
                      re.DOTALL)  # fmt: skip

#: What each example's output must contain, in page order.
EXPECTED = [
    ["{'completed': 1}", "took"],
    ["acme ['acme']", "refused: priority 99 is reserved for operators"],
    ["resizing cat.png job=1 attempt=1"],
    [],
    ['"name": "send default"', '"name": "process default"'],
]


def test_every_example_has_its_expectations() -> None:
    assert len(EXAMPLES) == len(EXPECTED)


@pytest.mark.parametrize("index", range(len(EXPECTED)))
def test_the_example_runs(db_url: str, index: int) -> None:
    env = {**os.environ, "SHIGOTO_DATABASE_URL": db_url,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", EXAMPLES[index]], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for expected in EXPECTED[index]:
        assert expected in output, output
