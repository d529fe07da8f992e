"""`shigoto dashboard`: the web dashboard of one database, until Ctrl-C or SIGTERM.

Binds 127.0.0.1:8080 by default (this machine only). Without a token it is read-only; with
`SHIGOTO_DASHBOARD_TOKEN` or `--token-file` (a mounted Secret) the page can retry, cancel,
delete and pause once signed in with that token. Every flag has an env var; the flag wins.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from shigoto.dashboard import Dashboard, DashboardServer, ShowArgs, Source
from shigoto.dashboard.auth import ENV_TOKEN, ENV_TOKEN_FILE, load_token, loopback_host
from shigoto.dashboard.server import DEFAULT_HOST, DEFAULT_PORT
from shigoto.db import database
from shigoto.errors import ConfigurationError

ENV_HOST = "SHIGOTO_DASHBOARD_HOST"
ENV_PORT = "SHIGOTO_DASHBOARD_PORT"
ENV_SHOW_ARGS = "SHIGOTO_DASHBOARD_SHOW_ARGS"


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add `dashboard` to the `shigoto` parser; `common` adds --database-url and --schema."""
    p = sub.add_parser("dashboard", help="the web dashboard: queues, jobs, failures, cron, "
                       "nodes (read-only without a token)")  # fmt: skip
    common(p)
    p.add_argument("--host", help=f"address to listen on [{ENV_HOST}] (default {DEFAULT_HOST}: "
                   "this machine only)")  # fmt: skip
    p.add_argument("--port", help=f"port [{ENV_PORT}] (default {DEFAULT_PORT}; 0: any free)")
    p.add_argument("--token-file", metavar="PATH",
                   help=f"file holding the token that enables actions [{ENV_TOKEN_FILE}]; "
                   f"or set {ENV_TOKEN} itself")  # fmt: skip
    p.add_argument("--show-args", help=f"who sees job args: always, token (signed-in viewers, "
                   f"the default) or never [{ENV_SHOW_ARGS}]")  # fmt: skip


def commands(database_url: Callable[[argparse.Namespace], str]) -> dict[str, Any]:
    """The command, given the CLI's database URL resolver (embedded server fallback)."""

    def run(args: argparse.Namespace) -> int:
        return serve(args, database_url(args))

    return {"dashboard": run}


def _setting(flag: str | None, env: str, default: str) -> tuple[str, str]:
    """(value, where it came from): the flag, else the env var, else the default."""
    if flag is not None:
        return flag, "--" + env.removeprefix("SHIGOTO_DASHBOARD_").lower().replace("_", "-")
    raw = os.environ.get(env, "").strip()
    return (raw, env) if raw else (default, env)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Host, port and args policy from flags and env vars, checked; errors name the source."""
    host, _ = _setting(args.host, ENV_HOST, DEFAULT_HOST)
    port_text, where = _setting(args.port, ENV_PORT, str(DEFAULT_PORT))
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigurationError(f"{where}: {port_text!r} is not a port (0 to 65535)")
    show, where = _setting(args.show_args, ENV_SHOW_ARGS, str(ShowArgs.TOKEN))
    if show not in set(ShowArgs):
        raise ConfigurationError(f"{where}: {show!r} is not one of always, token, never")
    return {"host": host, "port": int(port_text), "show_args": ShowArgs(show)}


def serve(args: argparse.Namespace, url: str) -> int:
    """Serve until SIGINT or SIGTERM, then stop cleanly and return 0."""
    chosen = settings(args)
    token = load_token(args.token_file)
    # Fail now with the server's own reason, not on the first page load.
    psycopg.connect(url, **database.connect_kwargs(url)).close()
    dashboard = Dashboard([Source("default", url, args.schema)], token=token,
                          show_args=chosen["show_args"],
                          loopback_only=loopback_host(chosen["host"]))  # fmt: skip
    server = DashboardServer(dashboard, chosen["host"], chosen["port"])
    try:
        server.start()
    except OSError as exc:
        dashboard.close()
        raise ConfigurationError(
            f"--port {chosen['port']}: cannot listen on {chosen['host']}:{chosen['port']} "
            f"({exc.strerror or exc}); pick a free port, or 0 for any"
        ) from None
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}  # fmt: skip
    actions = "enabled" if token else f"disabled (set {ENV_TOKEN} or --token-file to enable)"
    print(
        f'shigoto dashboard: serving {server.url} (database "default", schema '
        f"{args.schema}, actions {actions}); Ctrl-C stops it",
        file=sys.stderr,
        flush=True,
    )
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("shigoto dashboard: stopped", file=sys.stderr, flush=True)
    return 0
