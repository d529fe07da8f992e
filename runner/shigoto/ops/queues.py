"""Pausing and resuming a queue from the CLI: the same change as `shigoto.pause_queue`, after
checking that the name is a queue something knows.

`shigoto pause nosuchqueue` used to exit 0 and store a settings row no runner would ever read:
a typo looked like success (issue 25). A queue is known when it has a job (live or archived),
a settings row, a runner serving it or a cron schedule feeding it; anything else is refused
with a `ValidationError` naming the queue and the flag that pauses it anyway (`--create`: to
pause a queue before its first job or runner, so they start paused).
"""

from __future__ import annotations

from typing import Any

from shigoto import config
from shigoto.client import queue_settings
from shigoto.db import database, ops_statements
from shigoto.errors import ValidationError

#: The CLI flag that skips the check, named in the refusal.
CREATE_FLAG = "--create"


def queue_known(name: str, *, database_url: str | None = None, schema: str | None = None) -> bool:
    """Whether a job, a settings row, a runner or a cron schedule names queue `name`."""
    query = ops_statements.compose(ops_statements.QUEUE_KNOWN, config.schema(schema))
    with database.sync_pool(config.database_url(database_url)).connection() as conn:
        row = conn.execute(query, {"queue": name}).fetchone()
    return bool(row and row[0])


def require_known(name: str, *, database_url: str | None = None, schema: str | None = None) -> None:
    """ValidationError (field "queue") unless `queue_known(name)`."""
    if not isinstance(name, str) or not name:
        raise ValidationError("queue", f"must be a non-empty queue name, got {name!r}")
    if not queue_known(name, database_url=database_url, schema=schema):
        raise ValidationError(
            "queue", f"no queue {name!r}: no job, queue setting, runner or cron schedule names "
            f"it (a typo? `shigoto status` lists the queues); to store its setting anyway (a "
            f"queue paused before its first job), pass {CREATE_FLAG}",
        )  # fmt: skip


def set_paused(
    name: str, paused: bool, *, create: bool = False, database_url: str | None = None,
    schema: str | None = None,
) -> None:  # fmt: skip
    """Pause (or resume) queue `name` as `shigoto.pause_queue` does, refusing a queue nothing
    knows unless `create`. Resuming an unknown queue is refused the same way: it would store
    a row for a typo too."""
    where: dict[str, Any] = {"database_url": database_url, "schema": schema}
    if not create:
        require_known(name, **where)
    change = queue_settings.pause_queue if paused else queue_settings.resume_queue
    change(name, **where)
