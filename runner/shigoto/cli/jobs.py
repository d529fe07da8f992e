"""`shigoto jobs list|show|delete`: the job API (`shigoto.client.jobs`) from the command line.

`list` prints a page and the `--after` cursor of the next; `show` one job with its errors and
tracebacks, result, progress, meta and workflow relatives; `delete` counts what it would
delete and deletes only with `--yes`. Every command takes `--json`.

Sealed values of encrypted jobs (args, results, error details) are shown as "encrypted": this
command holds no key and never tries to open them. Every other value comes from the database,
where anyone allowed to write rows put it, so it is escaped before rich sees it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table

from shigoto.client import jobs
from shigoto.client.job_filters import name_scan
from shigoto.encryption import is_envelope
from shigoto.errors import ValidationError
from shigoto.job import JOB_COLUMNS, Job

ENCRYPTED = "encrypted"

#: API argument names as this command spells them, so an error names the flag to fix.
_FLAGS = {
    "queue": "--queue", "worker": "--worker", "state": "--state", "tag": "--tag",
    "args_contains": "--args-contains", "inserted_after": "--inserted-after",
    "limit": "--limit", "after": "--after", "job_id": "ID",
}  # fmt: skip


# -- parsers ----------------------------------------------------------------------------------


def add_parsers(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add `jobs` and its commands to the `shigoto` parser; `common` adds --database-url and
    --schema."""
    p = sub.add_parser("jobs", help="list, show and delete jobs (live and archived)")
    commands = p.add_subparsers(dest="jobs_command", required=True)
    c = commands.add_parser("list", help="jobs matching the filters, newest first, a page at "
                            "a time")  # fmt: skip
    common(c)
    _filters(c)
    c.add_argument(
        "--limit",
        type=int,
        default=jobs.DEFAULT_LIMIT,
        help=f"jobs per page, 1 to {jobs.MAX_LIMIT} (default {jobs.DEFAULT_LIMIT})",
    )
    c.add_argument("--after", metavar="CURSOR", help="the next page: the cursor the previous "
                   "page printed")  # fmt: skip
    c.add_argument("--json", action="store_true")
    c = commands.add_parser("show", help="one job: args, errors and tracebacks, result, "
                            "progress, meta, workflow parents and children")  # fmt: skip
    common(c)
    c.add_argument("job_id", type=int, metavar="ID")
    c.add_argument("--json", action="store_true")
    c = commands.add_parser("delete", help="delete finished jobs matching the filters (a dry "
                            "run count without --yes)")  # fmt: skip
    common(c)
    _filters(c)
    c.add_argument("--yes", action="store_true", help="delete; without it only count")
    c.add_argument("--json", action="store_true")


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--queue")
    p.add_argument("--worker", help="the worker's full name, or its last dotted part")
    p.add_argument("--state", action="append", dest="states",
                   help="a state, repeatable or comma-separated")  # fmt: skip
    p.add_argument("--tag")
    p.add_argument(
        "--args-contains",
        metavar="JSON",
        help="a JSON object the args contain, e.g. '{\"invoice_id\": 42}'",
    )
    p.add_argument(
        "--inserted-after",
        metavar="TIME",
        help="ISO 8601 time with its offset, e.g. 2026-01-31T12:00:00+00:00",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--archived", dest="archived", action="store_const", const=True,
                       help="archived jobs only")  # fmt: skip
    where.add_argument(
        "--live",
        dest="archived",
        action="store_const",
        const=False,
        help="jobs not archived only (default: both)",
    )


# -- flags to API arguments (pure) ------------------------------------------------------------


def filters(args: argparse.Namespace) -> dict[str, Any]:
    """The API's filter arguments from the parsed flags."""
    states = [s.strip() for given in args.states or [] for s in given.split(",") if s.strip()]
    return {
        "queue": args.queue, "worker": args.worker, "state": states or None, "tag": args.tag,
        "args_contains": _json_object(args.args_contains), "archived": args.archived,
        "inserted_after": _time(args.inserted_after),
    }  # fmt: skip


def _json_object(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError("--args-contains", f"is not valid JSON ({exc})") from None


def _time(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError("--inserted-after", f"{text!r} is not an ISO 8601 time; e.g. "
                              "2026-01-31T12:00:00+00:00") from None  # fmt: skip


@contextmanager
def _flags_in_errors() -> Iterator[None]:
    try:
        yield
    except ValidationError as exc:
        if exc.field == "filter":
            raise ValidationError("filters", "give at least one of --queue, --worker, --state, "
                                  "--tag, --args-contains, --inserted-after (to delete every "
                                  "finished job, pass --state completed,discarded,cancelled)"
                                  ) from None  # fmt: skip
        raise ValidationError(_FLAGS.get(exc.field, exc.field), exc.message) from None


# -- jobs as JSON (pure) ----------------------------------------------------------------------


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _error_entry(entry: Any) -> Any:
    """An error entry as shown: an encrypted job's sealed detail stays sealed."""
    if isinstance(entry, dict) and "sealed" in entry:
        return {**{k: v for k, v in entry.items() if k != "sealed"}, "detail": ENCRYPTED}
    return entry


def job_dict(job: Job) -> dict[str, Any]:
    """A job as JSON-ready values; sealed args and result read "encrypted"."""
    out = {name: _plain(getattr(job, name)) for name in JOB_COLUMNS}
    out["state"] = str(job.state)
    out["archived"] = getattr(job, "archived", False)
    out["archived_at"] = _plain(getattr(job, "archived_at", None))
    for name in ("args", "result"):
        if is_envelope(out[name]):
            out[name] = ENCRYPTED
    out["errors"] = [_error_entry(e) for e in job.errors]
    return out


# -- rendering with rich ----------------------------------------------------------------------


def _cell(value: Any) -> str:
    """A database value as literal text, never as rich markup."""
    return escape("-" if value is None else str(value))


def _when(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value else "-"


def list_table(page: jobs.JobPage) -> Table:
    table = Table(title=f"jobs ({len(page)} on this page, newest first)")
    for name in ("id", "state", "queue", "worker", "attempt", "inserted", "finished", "tags"):
        table.add_column(name, justify="right" if name in ("id", "attempt") else "left")
    for job in page:
        state = f"{job.state} (archived)" if job.archived else str(job.state)
        table.add_row(
            str(job.id), _cell(state), _cell(job.queue), _cell(job.worker),
            f"{job.attempt}/{job.max_attempts or '-'}", _when(job.inserted_at),
            _when(job.finished_at), _cell(", ".join(job.tags) or "-"),
        )  # fmt: skip
    return table


def _pretty(value: Any) -> str:
    return _cell(value if isinstance(value, str) else json.dumps(value, indent=2, default=str))


def _fields_table(shown: dict[str, Any]) -> Table:
    table = Table(title=f"job {shown['id']}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for name in ("state", "archived_at", "queue", "worker", "priority", "attempt",
                 "max_attempts", "timeout", "scheduled_at", "inserted_at", "attempted_at",
                 "attempted_by", "finished_at", "progress", "tags", "unique_key", "batch_id",
                 "partition_key"):  # fmt: skip
        value = shown.get(name)
        if value not in (None, [], ""):
            table.add_row(name, _cell(", ".join(value)) if name == "tags" else _pretty(value))
    for name in ("args", "result", "meta"):
        table.add_row(name, _pretty(shown[name]))
    return table


def _errors_table(shown: dict[str, Any]) -> Table:
    table = Table(title="errors (oldest first)")
    for name in ("attempt", "at", "error"):
        table.add_column(name)
    for entry in shown["errors"]:
        entry = entry if isinstance(entry, dict) else {"error": entry}
        text = _cell(entry.get("error"))
        if entry.get("detail") == ENCRYPTED:
            text += " (message and traceback encrypted)"
        elif entry.get("traceback"):
            text += "\n" + _cell(entry["traceback"].rstrip())
        table.add_row(_cell(entry.get("attempt")), _cell(entry.get("at")), text)
    return table


def _relatives_table(title: str, rows: list[dict[str, Any]]) -> Table:
    table = Table(title=title)
    for name in ("id", "worker", "state"):
        table.add_column(name)
    for r in rows:
        state = f"{r['state']} (archived)" if r["archived"] else r["state"]
        table.add_row(str(r["id"]), _cell(r["worker"]), _cell(state))
    return table


def show_view(shown: dict[str, Any], relatives: jobs.Relatives) -> RenderableType:
    parts: list[RenderableType] = [_fields_table(shown)]
    if shown["errors"]:
        parts.append(_errors_table(shown))
    if relatives.parents:
        parts.append(_relatives_table("parents (depends on)", relatives.parents))
    if relatives.children:
        parts.append(_relatives_table("children (depend on it)", relatives.children))
    return Group(*parts)


def _console(view: RenderableType) -> Console:
    """A console as wide as `view` needs when output is piped (like `shigoto status`)."""
    console = Console()
    if not console.is_terminal:
        wide = console.options.update_width(10_000)
        console = Console(width=max(console.measure(view, options=wide).maximum, console.width))
    return console


# -- commands ---------------------------------------------------------------------------------


def _where(args: argparse.Namespace, url: str) -> dict[str, Any]:
    return {"database_url": url, "schema": args.schema}


def run_list(args: argparse.Namespace, url: str) -> int:
    with _flags_in_errors():
        chosen = filters(args)
        scan = name_scan(chosen["queue"], chosen["worker"])
        page = jobs.list_jobs(**chosen, limit=args.limit, after=args.after, scan_limit=scan,
                              **_where(args, url))  # fmt: skip
    if args.json:
        print(json.dumps({"jobs": [job_dict(j) for j in page], "next": page.next,
                          "partial": page.partial, "scanned_to_id": page.scanned_to_id},
                         indent=2))  # fmt: skip
        return 0
    view = list_table(page)
    _console(view).print(view)
    if page.partial:
        print(f"searched ids down to {page.scanned_to_id} and found {len(page)}; the search "
              f"goes on with --after {page.next}")  # fmt: skip
    else:
        print(f"next page: --after {page.next}" if page.next else "(last page)")
    return 0


def run_show(args: argparse.Namespace, url: str) -> int:
    with _flags_in_errors():
        job = jobs.get_job(args.job_id, keep_sealed=True, **_where(args, url))
    if job is None:
        raise jobs.JobNotFound(args.job_id)
    relatives = jobs.relatives(job, **_where(args, url))
    shown = job_dict(job)
    if args.json:
        shown["parents"], shown["children"] = relatives.parents, relatives.children
        print(json.dumps(shown, indent=2, default=str))
        return 0
    view = show_view(shown, relatives)
    _console(view).print(view)
    return 0


def run_delete(args: argparse.Namespace, url: str) -> int:
    with _flags_in_errors():
        count = jobs.delete_jobs(**filters(args), dry_run=not args.yes, **_where(args, url))
    if args.json:
        print(json.dumps({"deleted" if args.yes else "would_delete": count}))
    elif args.yes:
        print(f"deleted {count} finished jobs")
    else:
        print(f"would delete {count} finished jobs (dry run: add --yes to delete them)")
    return 0


_RUN = {"list": run_list, "show": run_show, "delete": run_delete}


def commands(database_url: Callable[[argparse.Namespace], str]) -> dict[str, Callable[..., int]]:
    """The `jobs` command for the `shigoto` command table; `database_url` resolves the URL
    the way every local command does (flag, env var, else the embedded server)."""

    def run(args: argparse.Namespace) -> int:
        return _RUN[args.jobs_command](args, database_url(args))

    return {"jobs": run}
