"""The web dashboard (issue 13): queues, jobs, failures, cron and nodes in a browser.

`Dashboard` turns requests into responses (no sockets; `app`), `DashboardServer` serves it
over HTTP (`server`), `Source` names a database it shows (`sources`). `shigoto dashboard` is
the command; the operator builds a `Dashboard(sources=callable)` over every database it knows.
The page itself is static files under `static/`, plain ES modules with no build step.
"""

from shigoto.dashboard.app import Dashboard, Request, Response
from shigoto.dashboard.auth import ShowArgs
from shigoto.dashboard.server import DEFAULT_HOST, DEFAULT_PORT, DashboardServer
from shigoto.dashboard.sources import Source, Sources

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "Dashboard",
    "DashboardServer",
    "Request",
    "Response",
    "ShowArgs",
    "Source",
    "Sources",
]
