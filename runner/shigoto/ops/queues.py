"""Queues as things of their own: pausing and resuming one from the CLI (the same change as
`shigoto.pause_queue`, after checking that the name is a queue something knows), listing them
(`shigoto queues list`, `shigoto.list_queues`) and deleting one (`shigoto queues delete`,
`shigoto.delete_queue`). Seed counterpart: Shigoto's dynamic queues, Gaffer's queue
introspection.

`shigoto pause nosuchqueue` used to exit 0 and store a settings row no runner would ever read:
a typo looked like success (issue 25). A queue is known when it has a job (live or archived),
a settings row, a runner serving it or a cron schedule feeding it; anything else is refused
with a `ValidationError` naming the queue and the flag that pauses it anyway (`--create`: to
pause a queue before its first job or runner, so they start paused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shigoto import config
from shigoto.client import queue_settings
from shigoto.db import database, ops_statements, steps
from shigoto.db.steps import Steps
from shigoto.errors import ValidationError
from shigoto.ops import operations

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


# -- listing and deleting queues (`shigoto queues list|delete`) -------------------------------

#: The states in which a job still has work ahead: a queue holding any is not deleted unforced.
LIVE_STATES = ("available", "scheduled", "executing", "retryable")
#: The CLI flag that deletes a queue with live jobs, named in the refusal.
FORCE_FLAG = "--force"


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """One queue as `list_queues` sees it: its jobs by state (archived ones not counted), its
    live runners (heartbeat under 90 s), whether it is paused, has a settings row, and how many
    cron schedules enqueue into it."""

    name: str
    jobs: dict[str, int]
    runners: int
    paused: bool
    settings: bool
    cron: int

    @property
    def live(self) -> int:
        """Jobs with work ahead (available, scheduled, executing, retryable)."""
        return sum(self.jobs.get(state, 0) for state in LIVE_STATES)

    @property
    def unserved(self) -> bool:
        """Live jobs and no runner to run them: the queue a forgotten `--queue` leaves."""
        return self.live > 0 and self.runners == 0

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "jobs": self.jobs, "live": self.live,
                "runners": self.runners, "unserved": self.unserved, "paused": self.paused,
                "settings": self.settings, "cron": self.cron}  # fmt: skip


@dataclass(frozen=True, slots=True)
class QueueDeletion:
    """What `delete_queue` did: the settings row removed, the live jobs cancelled (or asked to
    stop, when executing) by `force`, and the finished jobs deleted."""

    name: str
    settings: bool
    cancelled: list[int]
    deleted: int


class QueueNotEmpty(ValidationError):
    """A queue still has live jobs, and the delete was not forced; nothing was written."""

    def __init__(self, name: str, live: dict[str, int]) -> None:
        counts = ", ".join(f"{n} {state}" for state, n in live.items())
        super().__init__("queue", f"{name!r} still has live jobs ({counts}); let them finish, "
                                  f"or pass {FORCE_FLAG} (force=True) to cancel them with the "
                                  "queue")  # fmt: skip
        self.live = live


def list_queues(*, database_url: str | None = None, schema: str | None = None) -> list[QueueInfo]:
    """Every queue something names: jobs, a settings row, a live runner or a cron schedule.
    `QueueInfo.unserved` marks those with live jobs and no runner."""
    query = ops_statements.compose(ops_statements.QUEUES_LIST, config.schema(schema))
    with database.sync_pool(config.database_url(database_url)).connection() as conn:
        rows = conn.execute(query).fetchall()
    return [QueueInfo(name, {k: int(v) for k, v in states.items()}, int(runners), bool(paused),
                      bool(settings), int(cron))
            for name, states, runners, paused, settings, cron in rows]  # fmt: skip


def _delete_steps(name: str, schema: str, force: bool) -> Steps[QueueDeletion]:
    """Check, then delete, in one transaction: a refusal raises before anything is written."""
    yield ops_statements.compose(ops_statements.LOCK_QUEUE_ROW, schema), {"queue": name}
    into = yield ops_statements.compose(ops_statements.FORWARDED_INTO, schema), {"queue": name}
    if into.rows:
        sources = ", ".join(f"{src} ({state})" for src, state in into.rows)
        raise ValidationError("queue", f"{name!r} is where {sources} forward(s) jobs; stop "
                                       "that first, e.g. set_queue(source, forward={state: "
                                       "None})")  # fmt: skip
    live = yield ops_statements.compose(ops_statements.QUEUE_LIVE, schema), {"queue": name}
    if live.rows and not force:
        raise QueueNotEmpty(name, {state: int(n) for state, n in live.rows})
    removed = yield ops_statements.compose(ops_statements.DELETE_QUEUE_ROW, schema), {
        "queue": name}  # fmt: skip
    cancelled: list[int] = []
    if live.rows:
        cancelled = yield from operations.cancel_steps(
            operations.Filter(queue=name), schema, "queue deleted")
    gone = yield ops_statements.compose(ops_statements.DELETE_QUEUE_FINISHED, schema), {
        "queue": name}  # fmt: skip
    return QueueDeletion(name, bool(removed.rows), cancelled, gone.rowcount)


def delete_queue(
    name: str, *, force: bool = False, database_url: str | None = None, schema: str | None = None
) -> QueueDeletion:
    """Delete queue `name`: its settings row and its finished jobs (archived ones age out).

    Refused, writing nothing, while the queue has live jobs (available, scheduled, executing,
    retryable) unless `force`, which cancels them in the same transaction, as `cancel_by`
    does: an executing one is asked to stop and ends `cancelled` (it is not forwarded: the
    queue's settings are gone). Refused too while another queue forwards into it, since its
    copies would land in a queue nobody set up (Gaffer left this open). Runners still serving
    the queue keep claiming it; stop them (or `Runner.remove_queue`) as well. Queues are
    implicit: a later enqueue into `name` makes it again."""
    problem = config.queue_name_problem(name)
    if problem:
        raise ValidationError("queue", problem)
    if not isinstance(force, bool):
        raise ValidationError("force", f"must be True or False, got {force!r}")
    work = _delete_steps(name, config.schema(schema), force)
    with database.sync_pool(config.database_url(database_url)).connection() as conn, \
            conn.transaction():  # fmt: skip
        return steps.run(conn, work)
