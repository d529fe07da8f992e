"""Waking a Queue's reconciler at once instead of at its next poll.

Two things are worth not waiting for:

- **New jobs for a Queue at zero replicas.** No runner is there to notice them, and the next
  poll may be `pollIntervalSeconds` away (KEDA's PostgreSQL scaler waits 30 s by default).
  Every enqueue already sends a NOTIFY on the runners' channel (`shigoto_insert`, payload
  `<schema>.<queue>`, sent at commit), so the operator LISTENs on it, per database, while at
  least one Queue there is at zero, and wakes that Queue's reconciler, which reads fresh counts
  and scales up in the same breath.
- **The database's own news** (a migration started, moved on, finished or failed): every
  object using the database is woken, so its status and Events follow at once.

LISTEN needs a session. Through a transaction pooler (`database.pooler: transaction`) it takes
the direct URL (`database.directUrlSecretRef`); with none there is no session to listen on and
the poll stays the only way to notice new jobs. The LISTEN session is the runners' own
`Notifier` (reconnects with backoff, wakes everyone once when it connects, so jobs enqueued
while it was away are not missed); the operator holds it only while a Queue on that database is
at zero.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shigoto.db.runtime_statements import INSERT_CHANNEL
from shigoto.runtime.notifier import Notifier

log = logging.getLogger("shigoto.operator.wakeups")

Wake = Callable[[], None]


@dataclass
class _Watch:
    wake: Wake
    #: The queue whose new jobs wake it; None: only the database's own news do.
    queue: str | None


@dataclass
class Wakeups:
    """Who to wake on one database, and the LISTEN session that wakes Queues at zero."""

    name: str
    schema: str
    #: The URL LISTEN may use (a session: direct, or not through a transaction pooler); None:
    #: none can be had, and Queues at zero wait for their poll.
    session_url: str | None
    connect_kwargs: Mapping[str, Any] = field(default_factory=dict)
    _watches: dict[str, _Watch] = field(default_factory=dict)
    _notifier: Notifier | None = None
    _said_polling: bool = False

    def watch(self, user: str, wake: Wake, *, queue: str | None = None) -> None:
        """Wake `user` on the database's news, and on new jobs of `queue` when given (a Queue
        at zero replicas). Called on every pass: the latest call says what `user` wants."""
        self._watches[user] = _Watch(wake, queue)
        self._listen_while_needed()

    def forget(self, user: str) -> None:
        self._watches.pop(user, None)
        self._listen_while_needed()

    def wake_all(self) -> None:
        for watch in list(self._watches.values()):
            watch.wake()

    @property
    def listening(self) -> bool:
        return self._notifier is not None

    def dispatch(self, channel: str, payload: str) -> None:
        """A notification: wake the Queues at zero whose queue got a job. An empty one (the
        session just connected) wakes them all, for what was enqueued before it."""
        schema, _, queue = payload.partition(".")
        for watch in list(self._watches.values()):
            if watch.queue is None:
                continue
            if not channel or (schema == self.schema and queue == watch.queue):
                watch.wake()

    def _listen_while_needed(self) -> None:
        wanted = any(w.queue is not None for w in self._watches.values())
        if wanted and self._notifier is None:
            if self.session_url is None:
                if not self._said_polling:
                    log.info("%s: no session to LISTEN on (a transaction pooler and no "
                             "database.directUrlSecretRef): Queues at zero replicas notice new "
                             "jobs at their next poll", self.name)  # fmt: skip
                    self._said_polling = True
                return
            self._notifier = Notifier(
                self.session_url, [INSERT_CHANNEL], self.dispatch, self.connect_kwargs
            )
            self._notifier.start()
            log.info("%s: listening for new jobs of Queues at zero replicas", self.name)
        elif not wanted and self._notifier is not None:
            self._notifier.request_stop()  # ends within a second; nothing waits for it
            self._notifier = None
            log.info("%s: no Queue at zero replicas: stopped listening", self.name)

    async def stop(self) -> None:
        self._watches.clear()
        notifier, self._notifier = self._notifier, None
        if notifier is not None:
            await notifier.stop()
