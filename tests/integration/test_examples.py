"""Each example app runs from the one command its README gives, and reports that the committed
order kept its job and the rolled-back one left none (examples/*/README.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.support.waiting import count

ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = ".venv/bin/python"


def readme_command(example: str) -> list[str]:
    """The first shell block of the example's README: one command, run from the repository
    root with the project's interpreter."""
    readme = (ROOT / "examples" / example / "README.md").read_text()
    found = re.search(r"```sh\n(.+?)\n```", readme, re.DOTALL)
    assert found is not None, f"examples/{example}/README.md has no ```sh block"
    command = found.group(1).strip()
    assert "\n" not in command, "the README's block must be one command"
    assert command.startswith(VENV_PYTHON + " ")
    # The same command, on whichever interpreter runs the suite (.venv's under `make test`).
    return [sys.executable, *command.split()[1:]]


@pytest.mark.parametrize("example", ["django_app", "sqlalchemy_app", "fastapi_app"])
def test_the_example_runs_from_its_readme(
    example: str, db_url: str, conn: psycopg.Connection
) -> None:
    env = {**os.environ, "SHIGOTO_DATABASE_URL": db_url}  # the test's database, not .shigoto/
    done = subprocess.run(readme_command(example), cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=100)  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert done.stdout.rstrip().endswith("OK"), done.stdout
    # One job per committed order, run to completion; none for a rolled-back order.
    committed = 2 if example == "sqlalchemy_app" else 1
    assert count(conn) == committed
    assert count(conn, "state = 'completed'") == committed
