"""`shigoto queues list|delete`: queues as things of their own (`shigoto.ops.queues`).

`list` shows every queue something names (jobs, a settings row, a live runner, a cron
schedule) with its live jobs and runners, and flags the queues whose live jobs no runner
serves. `delete NAME` removes a queue's settings and finished jobs, refusing (exit 2, nothing
written) while it has live jobs unless `--force`, which cancels them with it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shigoto.ops import queues


def add_parsers(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add `queues` and its commands to the `shigoto` parser; `common` adds --database-url
    and --schema."""
    p = sub.add_parser("queues", help="list queues (and those no runner serves), delete one")
    commands = p.add_subparsers(dest="queues_command", required=True)
    c = commands.add_parser("list", help="every queue with jobs, settings, runners or cron "
                            "schedules; UNSERVED marks live jobs no runner serves")  # fmt: skip
    common(c)
    c.add_argument("--json", action="store_true")
    c = commands.add_parser("delete", help="delete a queue's settings and finished jobs; "
                            "refused while it has live jobs unless --force")  # fmt: skip
    common(c)
    c.add_argument("name", metavar="NAME")
    c.add_argument(queues.FORCE_FLAG, action="store_true", dest="force",
                   help="cancel the queue's live jobs with it (executing ones are asked to "
                   "stop and end cancelled)")  # fmt: skip
    c.add_argument("--json", action="store_true")


def _where(args: argparse.Namespace, url: str) -> dict[str, Any]:
    return {"database_url": url, "schema": getattr(args, "schema", None)}


def run_list(args: argparse.Namespace, url: str) -> int:
    found = queues.list_queues(**_where(args, url))
    if args.json:
        print(json.dumps([q.as_json() for q in found]))
        return 0
    table = Table("queue", "available", "scheduled", "executing", "retryable", "finished",
                  "runners", "note")  # fmt: skip
    for q in found:
        finished = sum(q.jobs.get(s, 0) for s in ("completed", "discarded", "cancelled"))
        notes = [n for n, on in (("UNSERVED", q.unserved), ("paused", q.paused),
                                 (f"{q.cron} cron", q.cron > 0)) if on]  # fmt: skip
        table.add_row(escape(q.name), *(str(q.jobs.get(s, 0)) for s in queues.LIVE_STATES),
                      str(finished), str(q.runners), ", ".join(notes))  # fmt: skip
    Console(soft_wrap=True).print(table if found else "no queues")
    return 0


def run_delete(args: argparse.Namespace, url: str) -> int:
    done = queues.delete_queue(args.name, force=args.force, **_where(args, url))
    if args.json:
        print(json.dumps({"queue": done.name, "settings": done.settings,
                          "cancelled": done.cancelled, "deleted": done.deleted}))  # fmt: skip
    else:
        print(f"deleted queue {done.name}: {done.deleted} finished job(s) deleted, "
              f"{len(done.cancelled)} live job(s) cancelled")  # fmt: skip
    return 0


_RUN = {"list": run_list, "delete": run_delete}


def commands(database_url: Callable[[argparse.Namespace], str]) -> dict[str, Callable[..., int]]:
    """The `queues` command for the `shigoto` command table."""

    def run(args: argparse.Namespace) -> int:
        return _RUN[args.queues_command](args, database_url(args))

    return {"queues": run}
