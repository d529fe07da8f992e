"""The dashboard of every database the operator knows, served by the operator (opt-in).

`shigoto dashboard` shows one database. In a cluster the operator already holds the URL of every
database its Queues and CronSchedules name, so with `SHIGOTO_OPERATOR_DASHBOARD_PORT` set it
serves the same dashboard over all of them, one name per database (`host:port/dbname (schema
s)`, never the URL: it carries the password). The list is asked again on each request, so a
database a new Queue brings appears without a restart and one no longer used disappears.

It listens on `SHIGOTO_OPERATOR_DASHBOARD_HOST`, 127.0.0.1 unless told otherwise: it shows the
jobs of every namespace's databases, so only `kubectl port-forward` (which needs the right to
port-forward to the operator's pod) reaches it by default. Bound to a loopback address it also
answers only to loopback Host names (a DNS rebinding guard).

Actions need the token of `SHIGOTO_DASHBOARD_TOKEN` or the file of
`SHIGOTO_DASHBOARD_TOKEN_FILE` (mount a Secret); without either the dashboard is read-only. A
viewer without the token sees what any dashboard shows an anonymous viewer
(`shigoto.dashboard.views.redact`): states, counts, ids, names, times, attempts, error classes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from shigoto.dashboard import Dashboard, DashboardServer, Source
from shigoto.dashboard.auth import ENV_TOKEN_FILE, load_token, loopback_host
from shigoto.errors import ConfigurationError
from shigoto_operator.config import OperatorConfig
from shigoto_operator.databases import Databases

log = logging.getLogger("shigoto.operator.dashboard")


def sources(databases: Databases) -> list[Source]:
    """The known databases as dashboard sources, in a stable order (by name)."""
    found = [Source(name=db.name, url=db.url, schema=db.schema) for db in databases.known]
    return sorted(found, key=lambda s: s.name)


def token(env: Mapping[str, str] = os.environ) -> str | None:
    """The actions' token. deploy/dashboard mounts its Secret as optional, so a token file
    named but absent means "read-only", not a failure (`shigoto dashboard --token-file`, a
    choice made on the command line, still fails on a missing file)."""
    path = env.get(ENV_TOKEN_FILE)
    if path and not Path(path).exists():
        log.warning("no dashboard token at %s (its Secret is optional): read-only", path)
        env = {k: v for k, v in env.items() if k != ENV_TOKEN_FILE}
    return load_token(None, env)


def serve(databases: Databases, config: OperatorConfig) -> DashboardServer | None:
    """Start the dashboard if configured; a port already taken or an unreadable token file is
    logged with its fix, and the operator goes on reconciling without a dashboard."""
    if not config.dashboard_port:
        return None
    try:
        secret = token()
        dashboard = Dashboard(
            lambda: sources(databases),
            token=secret,
            loopback_only=loopback_host(config.dashboard_host),
        )
        server = DashboardServer(dashboard, config.dashboard_host, config.dashboard_port)
        server.start()
    except (OSError, ConfigurationError) as exc:
        log.error(
            "cannot serve the dashboard on %s:%s (%s); going on without it. Free the port or set "
            "SHIGOTO_OPERATOR_DASHBOARD_PORT to another one (0 turns it off); a token file "
            "must be readable",
            config.dashboard_host, config.dashboard_port, exc,
        )  # fmt: skip
        return None
    log.info("dashboard on %s (%s)", server.url, "actions on" if secret else "read-only")
    return server
