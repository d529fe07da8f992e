"""Where each connection of a process goes, and how it is opened (docs/connections.md).

PgBouncer in transaction mode (`SHIGOTO_POOLER=transaction`) hands each transaction to
whichever server session is free, so whatever outlives a transaction on the server is lost, or
left on a session that another client gets next: LISTEN, session advisory locks, session `SET`,
prepared statements, temporary tables. Of those, Shigoto uses three:

- prepared statements: psycopg prepares a query it has run `prepare_threshold` times (5) on one
  connection, and PgBouncer before 1.21 does not carry them from one server session to the
  next, so connections through the pooler prepare nothing (`prepare_threshold=None`);
- LISTEN, the runner's wake-up on new jobs (`runtime.notifier`), and
- the liveness lock, a session advisory lock (`runtime.liveness`).

Those two go to the direct URL (`SHIGOTO_DIRECT_DATABASE_URL`), and so do migrations, which
take a session advisory lock of their own. With no direct URL there is no session to be had:
the runner polls for new jobs, proves itself alive by its lease only (`session_url` is None),
and does not migrate at start (`migrate_url` is None): `shigoto migrate` runs against the
server itself. Everything else
Shigoto does holds for one transaction at a time (transaction-level advisory locks, `SET
LOCAL`, the leadership lease row) and goes through the pooler.

Every connection also says whose it is in `pg_stat_activity` (`application_name`), unless the
URL or `PGAPPNAME` names it already: the user's name wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from shigoto import config, logs

#: The prefix of every application_name Shigoto gives its connections.
APP_PREFIX = "shigoto"
#: PostgreSQL keeps the first 63 bytes of an application_name.
_APP_NAME_MAX = 63


def application_name(role: str, node: str | None = None) -> str:
    """`shigoto-<role>` or `shigoto-<role>:<node>`, cut to what PostgreSQL keeps."""
    name = f"{APP_PREFIX}-{role}" if node is None else f"{APP_PREFIX}-{role}:{node}"
    return name.encode()[:_APP_NAME_MAX].decode(errors="ignore")


def names_itself(url: str, env: Mapping[str, str] = os.environ) -> bool:
    """Whether the URL, or libpq's `PGAPPNAME`, already names the connection."""
    return bool(env.get("PGAPPNAME")) or "application_name" in conninfo_to_dict(url)


@dataclass(frozen=True, slots=True)
class Routes:
    """The URLs of one process (or runner) and what each kind of connection takes."""

    url: str
    pooler: str = "none"
    direct_url: str | None = None

    @classmethod
    def of(cls, url: str, *, pooler: str | None = None, direct_url: str | None = None) -> Routes:
        """Routes for `url`; `pooler` and `direct_url` default to their env vars. The direct
        URL's password is masked in every later message and log line, as the main URL's."""
        direct = config.direct_database_url(direct_url)
        if direct:
            logs.remember_secret(direct)
        return cls(url, config.pooler(pooler), direct)

    @property
    def pooled(self) -> bool:
        """Whether the main URL goes through a transaction pooler."""
        return self.pooler == "transaction"

    @property
    def session_url(self) -> str | None:
        """The URL for what needs a session (LISTEN, the liveness lock): the direct URL when
        there is one, else the main URL unless a transaction pooler is in the way; None when
        no session can be had."""
        if self.direct_url:
            return self.direct_url
        return None if self.pooled else self.url

    @property
    def migrate_url(self) -> str | None:
        """Where migrations run: they serialise on a session advisory lock and build indexes
        outside transactions, so only on a session; None behind a transaction pooler with no
        direct URL (a session lock taken through it would stay on a server session that
        other clients get next, and hold every later migrator off)."""
        return self.session_url

    def prepares(self, url: str) -> bool:
        """Whether connections to `url` may prepare statements: not through the pooler."""
        return not (self.pooled and url != self.direct_url)

    def kwargs(self, url: str, role: str, node: str | None = None) -> dict[str, Any]:
        """psycopg's connect arguments for a connection of `role` to `url`: autocommit, no
        prepared statements through the pooler, and an application_name unless the user set
        one."""
        kwargs: dict[str, Any] = {"autocommit": True}
        if not self.prepares(url):
            kwargs["prepare_threshold"] = None
        if not names_itself(url):
            kwargs["application_name"] = application_name(role, node)
        return kwargs


__all__ = ["APP_PREFIX", "Routes", "application_name", "names_itself"]
