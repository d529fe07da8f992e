"""Counting a runner's connections in `pg_stat_activity`, by the application_name each of them
carries (`shigoto.db.routes.application_name`), while jobs flow.

A sampler thread reads the count every few milliseconds on a connection of its own and keeps
the highest, with the roles that made it up: a connection that lives for a moment between two
samples may be missed, so tests also keep the runner busy for long enough that its pool fills.
"""

from __future__ import annotations

import threading
from collections import Counter
from types import TracebackType

import psycopg

from shigoto.db.routes import application_name

#: Every role a runner process names its connections after.
ROLES = ("runner", "listen", "limiter", "elector", "client")

_COUNT = """
SELECT application_name, count(*) FROM pg_stat_activity
WHERE application_name = ANY(%(names)s) GROUP BY 1
"""


def runner_names(node: str, roles: tuple[str, ...] = ROLES) -> dict[str, str]:
    """application_name -> role, for the connections of the runner `node`."""
    return {application_name(role, node): role for role in roles}


def by_role(conn: psycopg.Connection, node: str, roles: tuple[str, ...] = ROLES) -> Counter[str]:
    """The runner's connections now, by role."""
    names = runner_names(node, roles)
    rows = conn.execute(_COUNT, {"names": list(names)}).fetchall()
    return Counter({names[name]: count for name, count in rows})


class PeakSampler:
    """`with PeakSampler(url, node) as peak:` ... then `peak.most` and `peak.at_most`."""

    def __init__(
        self, url: str, node: str, roles: tuple[str, ...] = ROLES, every: float = 0.005
    ) -> None:
        self.url = url
        self.node = node
        self.roles = roles
        self.every = every
        self.most = 0
        self.at_most: Counter[str] = Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-sampler", daemon=True)

    def _sample(self) -> None:
        with psycopg.connect(self.url, autocommit=True, application_name="peak-sampler") as conn:
            while not self._stop.is_set():
                seen = by_role(conn, self.node, self.roles)
                self.samples += 1
                if seen.total() > self.most:
                    self.most, self.at_most = seen.total(), seen
                self._stop.wait(self.every)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(10)
