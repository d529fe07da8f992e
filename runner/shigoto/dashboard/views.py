"""Jobs and rows as the dashboard's JSON, with what the viewer may not see taken out. Pure.

Every job the dashboard sends (lists, detail, relatives, the answer to an action) is built
here and goes through one function, `redact`, which takes the `auth.Viewer` the request was
made by: there is no other way to turn a `JobRecord` into JSON, so a new endpoint cannot forget
it. Three rules, in this order:

- Sealed values (the envelopes of encrypted jobs: args, results, the detail of error entries,
  a forwarded copy's original in `meta`) are never sent, to anyone. The dashboard holds no key
  and never opens them; a sealed value is replaced by null and a marker, so the page can say
  "encrypted".
- A viewer without the token (issue 24) gets the fields of `PUBLIC_FIELDS` only: states, ids,
  queue and worker names, times, attempts, and of each error its class (`error_class`), never
  its message or traceback: messages quote args and results ("national id 850704-33321 failed
  its checksum"). Every other field is null and named in `hidden`. It is an allow-list, so a
  field added to the views later is hidden from anonymous viewers until someone decides it is
  public. `unique_key` is among the hidden: it is an unkeyed hash of the args, and small args
  are recovered from it by brute force.
- Plain args follow the `show_args` policy: `args` is null and `args_hidden` says why ("token":
  sign in to see them; "never": this dashboard never shows them). With "never", a signed-in
  viewer does not get `unique_key` either, for the same brute-force reason.

Everything else goes out as data for the page to write with textContent: the front-end treats
every value as hostile text, the JSON encoder escapes nothing for HTML on purpose.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from shigoto.client.jobs import JobRecord
from shigoto.dashboard.auth import ShowArgs, Viewer
from shigoto.encryption import is_envelope

SEALED = {"sealed": True}

#: What a viewer without the token sees of a job: ids, names, state, attempts, times, and the
#: markers that say why something is not shown. `errors` is public as a list of classes only
#: (`public_error`); `args` follows the show_args policy instead (see the module's docstring).
PUBLIC_FIELDS = frozenset({
    "id", "queue", "worker", "state", "attempt", "max_attempts", "inserted_at",
    "scheduled_at", "attempted_at", "finished_at", "completed_at", "cancel_requested_at",
    "archived", "archived_at", "attempted_by", "batch_id", "depends_on", "errors",
    "result_sealed", "args", "args_hidden",
})  # fmt: skip
#: A Python class name, maybe dotted (`ValueError`, `billing.errors.Declined`).
_CLASS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_MAX_CLASS_NAME = 200


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 with its offset, or None."""
    return moment.isoformat() if moment is not None else None


def unsealed(value: Any) -> Any:
    """`value` with every envelope inside it replaced by {"sealed": true}."""
    if is_envelope(value):
        return dict(SEALED)
    if isinstance(value, Mapping):
        return {key: unsealed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [unsealed(item) for item in value]
    return value


def error_class(text: Any) -> str | None:
    """The exception class of a stored error text, or None when it names none. The runner
    stores `"<Class>: <message>"`, or the class alone for an empty message (and an encrypted
    job's entry keeps only the class): the class is what precedes the first colon, when it is
    a class name. Anything else (a runner's own note such as "result not storable: ...") has
    no class, and says nothing to a viewer who may not read messages."""
    if not isinstance(text, str):
        return None
    head = text.partition(":")[0].strip()
    if len(head) > _MAX_CLASS_NAME or not _CLASS_NAME.fullmatch(head):
        return None
    return head


def error_entry(entry: Any) -> dict[str, Any]:
    """One stored error entry. An encrypted job's entry keeps its message and traceback in
    `sealed` (its `error` holds only the exception type): those stay hidden."""
    if not isinstance(entry, Mapping):
        return {"attempt": None, "at": None, "error": str(entry), "traceback": None,
                "error_class": None}  # fmt: skip
    view = {
        "attempt": entry.get("attempt"), "at": entry.get("at"), "error": entry.get("error"),
        "traceback": entry.get("traceback") or None,
        "error_class": error_class(entry.get("error")),
    }  # fmt: skip
    if "sealed" in entry:
        view["traceback"] = None
        view["sealed"] = True
    return view


def public_error(view: Mapping[str, Any]) -> dict[str, Any]:
    """An error entry's view cut to when it happened and its class: no message, no
    traceback."""
    cut = {"attempt": view.get("attempt"), "at": view.get("at"), "error": None,
           "traceback": None, "error_class": view.get("error_class")}  # fmt: skip
    if view.get("sealed"):
        cut["sealed"] = True
    return cut


def redact(view: Mapping[str, Any], viewer: Viewer) -> dict[str, Any]:
    """`view` (a job's whole view, sealed values already out) cut to what `viewer` may see;
    each field taken out is null and named in `hidden`."""
    shown = dict(view)
    hidden: list[str] = []

    def hide(name: str) -> None:
        if name in shown:
            shown[name] = None
            hidden.append(name)

    if not viewer.may_see_args and shown.get("args_hidden") is None:
        shown["args_hidden"] = "never" if viewer.policy == ShowArgs.NEVER else "token"
        hide("args")
    if not viewer.signed_in:
        for name in sorted(shown.keys() - PUBLIC_FIELDS):
            hide(name)
        if shown.get("errors") is not None:
            shown["errors"] = [public_error(e) for e in shown["errors"]]
    elif not viewer.may_see_args:
        hide("unique_key")  # a hash of the args: small ones are found by brute force
    shown["hidden"] = hidden
    return shown


def _summary(job: JobRecord) -> dict[str, Any]:
    """A job as the lists show it (the contract's JobSummary), before `redact`."""
    sealed_args = is_envelope(job.args)
    return {
        "id": job.id, "queue": job.queue, "worker": job.worker, "state": str(job.state),
        "priority": job.priority, "attempt": job.attempt, "max_attempts": job.max_attempts,
        "tags": list(job.tags or []), "inserted_at": iso(job.inserted_at),
        "scheduled_at": iso(job.scheduled_at), "attempted_at": iso(job.attempted_at),
        "finished_at": iso(job.finished_at), "archived": job.archived,
        "args": None if sealed_args else job.args,
        "args_hidden": "encrypted" if sealed_args else None,
    }  # fmt: skip


def job_summary(job: JobRecord, viewer: Viewer) -> dict[str, Any]:
    """A job as the lists show it, as `viewer` may see it."""
    return redact(_summary(job), viewer)


def job_detail(job: JobRecord, viewer: Viewer) -> dict[str, Any]:
    """A job with everything the detail page shows, as `viewer` may see it."""
    sealed_result = is_envelope(job.result)
    return redact({
        **_summary(job),
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
    }, viewer)


def summaries(jobs: Iterable[JobRecord], viewer: Viewer) -> list[dict[str, Any]]:
    return [job_summary(job, viewer) for job in jobs]


def filter_refusal(filters: Mapping[str, Any], viewer: Viewer) -> tuple[str, str] | None:
    """(field, why) when `viewer` filters jobs by a value it may not see, else None. Such a
    filter would be an oracle: guessing a tag or an args value and watching the list change
    reveals it as surely as showing it. The filters the API has no parameter for (meta,
    result, unique or partition key) cannot be asked at all."""
    if filters.get("args_contains") is not None and not viewer.may_see_args:
        return "args", ("filtering by args needs the viewer to be allowed to see args "
                        f"(show_args={viewer.policy}): sign in with the token")  # fmt: skip
    if filters.get("tag") is not None and not viewer.signed_in:
        return "tag", "filtering by tag needs the viewer to see tags: sign in with the token"
    return None
