"""Jobs and rows as the dashboard's JSON, with what the viewer may not see taken out. Pure.

Two things are never sent as stored:

- Sealed values (the envelopes of encrypted jobs: args, results, the detail of error entries,
  a forwarded copy's original in `meta`). The dashboard holds no key and never opens them; a
  sealed value is replaced by null and a marker, so the page can say "encrypted".
- Plain args, when the policy (`show_args`) says this viewer may not see them: `args` is null
  and `args_hidden` says why ("token": sign in to see them; "never": this dashboard never
  shows them).

Everything else goes out as data for the page to write with textContent: the front-end treats
every value as hostile text, the JSON encoder escapes nothing for HTML on purpose.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from shigoto.client.jobs import JobRecord
from shigoto.dashboard.auth import ShowArgs
from shigoto.encryption import is_envelope

SEALED = {"sealed": True}


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 with its offset, or None."""
    return moment.isoformat() if moment is not None else None


def args_view(args: Any, may_see: bool, policy: ShowArgs) -> tuple[Any, str | None]:
    """(args, args_hidden) for a viewer: sealed args stay hidden whatever the policy."""
    if is_envelope(args):
        return None, "encrypted"
    if may_see:
        return args, None
    return None, "never" if policy == ShowArgs.NEVER else "token"


def unsealed(value: Any) -> Any:
    """`value` with every envelope inside it replaced by {"sealed": true}."""
    if is_envelope(value):
        return dict(SEALED)
    if isinstance(value, Mapping):
        return {key: unsealed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [unsealed(item) for item in value]
    return value


def error_entry(entry: Any) -> dict[str, Any]:
    """One stored error entry. An encrypted job's entry keeps its message and traceback in
    `sealed` (its `error` holds only the exception type): those stay hidden."""
    if not isinstance(entry, Mapping):
        return {"attempt": None, "at": None, "error": str(entry), "traceback": None}
    view = {
        "attempt": entry.get("attempt"), "at": entry.get("at"), "error": entry.get("error"),
        "traceback": entry.get("traceback") or None,
    }  # fmt: skip
    if "sealed" in entry:
        view["traceback"] = None
        view["sealed"] = True
    return view


def job_summary(job: JobRecord, may_see: bool, policy: ShowArgs) -> dict[str, Any]:
    """A job as the lists show it (the contract's JobSummary)."""
    args, hidden = args_view(job.args, may_see, policy)
    return {
        "id": job.id, "queue": job.queue, "worker": job.worker, "state": str(job.state),
        "priority": job.priority, "attempt": job.attempt, "max_attempts": job.max_attempts,
        "tags": list(job.tags or []), "inserted_at": iso(job.inserted_at),
        "scheduled_at": iso(job.scheduled_at), "attempted_at": iso(job.attempted_at),
        "finished_at": iso(job.finished_at), "archived": job.archived, "args": args,
        "args_hidden": hidden,
    }  # fmt: skip


def job_detail(job: JobRecord, may_see: bool, policy: ShowArgs) -> dict[str, Any]:
    """A job with everything the detail page shows."""
    sealed_result = is_envelope(job.result)
    return {
        **job_summary(job, may_see, policy),
        "errors": [error_entry(e) for e in job.errors or []],
        "result": None if sealed_result else unsealed(job.result),
        "result_sealed": sealed_result,
        "progress": job.progress,
        "meta": unsealed(job.meta or {}),
        "attempted_by": job.attempted_by,
        "cancel_requested_at": iso(job.cancel_requested_at),
        "unique_key": job.unique_key,
        "partition_key": job.partition_key,
        "batch_id": job.batch_id,
        "depends_on": list(job.depends_on) if job.depends_on else None,
        "on_parent_failure": job.on_parent_failure,
        "timeout": job.timeout,
        "completed_at": iso(job.completed_at),
        "archived_at": iso(job.archived_at),
    }


def summaries(jobs: Iterable[JobRecord], may_see: bool, policy: ShowArgs) -> list[dict[str, Any]]:
    return [job_summary(job, may_see, policy) for job in jobs]
