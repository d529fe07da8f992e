"""Helpers of tests/integration/test_second_contact.py: a project folder to `--import` from,
a port that counts the connections made to it, and `shigoto run` from a given folder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The modules of the project folder: each fails to import its own way, but `workers`.
PROJECT = {
    "shop/__init__.py": "",
    "shop/workers.py": "import shigoto\n\n\n@shigoto.worker()\ndef send_email() -> None:\n"
                       "    pass\n",
    "shop/broken.py": "import shigoto\n\nx = (\n",
    "shop/needs.py": "import shigoto\nimport requestz_not_installed\n",
    "shop/raises.py": "import shigoto\n\nraise ValueError('SMTP_HOST is not set')\n",
}  # fmt: skip


def make_project(folder: Path) -> Path:
    for name, text in PROJECT.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


@contextmanager
def counting_port() -> Iterator[tuple[int, list[int]]]:
    """A port on 127.0.0.1 that accepts and drops connections, and the count of them: a URL
    to it shows whether a command tried to connect at all."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    accepted: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except OSError:
                continue
            accepted.append(1)
            client.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join(5)
        server.close()


def shigoto_in(
    folder: Path, *args: str, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """`python -m shigoto.cli *args` run from `folder` (the user's project folder)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "SHIGOTO_LOG_LEVEL": "warning", **env}
    if "SHIGOTO_ENCRYPTION_KEYS" not in env:  # no keys unless the test gives some
        full_env.pop("SHIGOTO_ENCRYPTION_KEYS", None)
    return subprocess.run(
        [sys.executable, "-m", "shigoto.cli", *args], cwd=folder, env=full_env,
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def start_in(folder: Path, log: Path, *args: str, **env: str) -> subprocess.Popen[bytes]:
    """`shigoto *args` started from `folder`, its output in `log`; the caller stops it."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **env}
    return subprocess.Popen(
        [sys.executable, "-m", "shigoto.cli", *args], cwd=folder, env=full_env,
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
