"""Terminal rendering of `shigoto status` with rich.

Every value shown comes from the database (queue, worker, node and cron names, times), where
anyone allowed to write rows put it; rich would read `[/]` or `[link=...]` in it as markup, so
each one is escaped (`_cell`) before it reaches a table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shigoto.job import JobState
from shigoto.ops.operations import Status


def _cell(value: Any) -> str:
    """A database value as literal table text, never as rich markup."""
    return escape(str(value))


#: Short headers of the default table, so it fits 100 columns; `--wide` shows the states'
#: own names. The caption says what each stands for.
_SHORT = {
    JobState.SCHEDULED: "sched", JobState.AVAILABLE: "avail", JobState.EXECUTING: "exec",
    JobState.RETRYABLE: "retry", JobState.COMPLETED: "done", JobState.DISCARDED: "disc",
}  # fmt: skip
_LEGEND = (", ".join(f"{short} = {state.value}" for state, short in _SHORT.items())
           + "; 1h c/d/x = completed/discarded/cancelled in the last hour; --wide: every "
           "column")  # fmt: skip


def status_table(st: Status, wide: bool = False) -> Table:
    """Counts by queue and state. Finished counts on a big table are estimates from table
    statistics, shown as `~N` and said so in the caption; "last hour" is what the runners'
    stats sampler recorded (completed / discarded / cancelled), "-" where nothing was
    sampled. By default short headers and no cancelled count (the last hour has it) keep the
    table within 100 columns; `wide` shows every state under its own name."""
    states = list(JobState) if wide else list(_SHORT)
    table = Table(title="queues")
    table.add_column("queue", overflow="fold")
    for state in states:
        table.add_column(state.value if wide else _SHORT[state], justify="right")
    table.add_column("oldest available" if wide else "oldest", justify="right")
    table.add_column("last hour c/d/x" if wide else "1h c/d/x", justify="right")
    for queue in sorted(st.counts):
        age = st.oldest_available_age.get(queue)
        table.add_row(
            _cell(queue),
            *(_count(st, queue, s) for s in states),
            f"{age:.1f}s" if age is not None else "-",
            _last_hour(st.finished_last_hour.get(queue)),
        )
    notes = [] if wide else [_LEGEND]
    if not st.finished_exact:
        notes.append("~ estimated from table statistics (too many finished rows to count one "
                     "by one); live states are exact")  # fmt: skip
    if notes:
        table.caption = "\n".join(notes)
    return table


def _count(st: Status, queue: str, state: JobState) -> str:
    value = str(st.counts[queue].get(state.value, 0))
    return value if st.exact(state.value) else f"~{value}"


def _last_hour(done: dict[str, int] | None) -> str:
    if not done:
        return "-"
    return f"{done['completed']}/{done['discarded']}/{done['cancelled']}"


def nodes_table(st: Status, wide: bool = False) -> Table:
    """Live runners. By default how long each has been up rather than its start time (32
    characters of ISO timestamp), and names that wrap instead of being cut."""
    table = Table(title="nodes")
    table.add_column("node", overflow="fold")
    table.add_column("queues", overflow="fold")
    table.add_column("leads", overflow="fold")
    table.add_column("started" if wide else "up", justify="left" if wide else "right")
    table.add_column("last seen" if wide else "seen", justify="right")
    now = datetime.now(UTC)
    for node in st.nodes:
        queues = ", ".join(f"{q}={c}" for q, c in node["queues"].items())
        leads = ", ".join(node.get("leads") or []) or "-"
        started = _cell(node["started_at"]) if wide else _uptime(node["started_at"], now)
        table.add_row(_cell(node["id"]), _cell(queues), _cell(leads), started,
                      f"{node['silent_for']:.0f}s ago")  # fmt: skip
    return table


def _uptime(started_at: Any, now: datetime) -> str:
    """`3d4h`, `2h05m`, `12m`, `40s`: how long ago `started_at` (ISO text) was."""
    try:
        started = datetime.fromisoformat(str(started_at))
    except ValueError:
        return _cell(started_at)
    if started.tzinfo is None:
        started = started.replace(tzinfo=UTC)
    seconds = max(0, int((now - started).total_seconds()))
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m" if minutes else f"{seconds}s"


def cron_table(st: Status) -> Table:
    table = Table(title="cron")
    for name in ("name", "schedule", "worker", "queue", "enabled", "last slot", "next slot"):
        table.add_column(name)
    for entry in st.cron:
        # Enabled, but no runner with --cron (nor the operator) is live to fire it.
        enabled = ("NOT FIRING: no --cron runner" if entry.get("unscheduled")
                   else "yes" if entry["enabled"] else "no")  # fmt: skip
        table.add_row(
            _cell(entry["name"]), _cell(f"{entry['schedule']} ({entry['timezone']})"),
            _cell(entry["worker"]), _cell(entry["queue"]), enabled,
            _cell(entry["last_slot_at"] or "-"), _cell(entry["next_slot_at"] or "-"),
        )  # fmt: skip
    return table


def settings_table(st: Status) -> Table:
    """The queues whose shared settings are away from the defaults (shigoto.set_queue, the
    pause and resume commands, or a Queue object's spec)."""
    table = Table(title="queue settings")
    for name in ("queue", "paused", "global limit", "fan-out", "forward", "fair", "weight",
                 "rate limit"):  # fmt: skip
        table.add_column(name)
    for queue, setting in sorted(st.settings.items()):
        limit = setting["global_concurrency"]
        forward = setting["forward"] or {}
        table.add_row(
            _cell(queue), "PAUSED" if setting["paused"] else "no",
            "-" if limit is None else str(limit), "yes" if setting["fanout"] else "no",
            _cell(", ".join(f"{state} -> {target}" for state, target in sorted(forward.items()))
                  or "-"),
            _fairness(setting), str(setting["weight"]), _rate(setting["rate_limit"]),
        )  # fmt: skip
    return table


def _fairness(setting: dict[str, Any]) -> str:
    if not setting["fair"]:
        return "no"
    cap = setting["partition_concurrency"]
    return "yes" if cap is None else f"yes, {cap} per partition"


def _rate(limit: dict[str, Any] | None) -> str:
    if not limit:
        return "-"
    text = f"{limit['limit']}/{limit['per']:g}s {limit['algorithm']}"
    if limit.get("burst"):
        text += f" +{limit['burst']}"
    return text + (" per partition" if limit.get("by_partition") else "")


def breakers_table(st: Status) -> Table:
    """Circuit breakers that hold a worker's jobs back (open) or let probes through."""
    table = Table(title="circuit breakers not closed")
    for name in ("worker", "partition", "state", "blocked until", "since"):
        table.add_column(name)
    for b in st.breakers:
        table.add_row(
            _cell(b["worker"]), _cell(b["partition_key"] or "-"),
            "OPEN" if b["status"] == "open" else b["status"], _cell(b["blocked_until"] or "-"),
            _cell(b["since"]),
        )  # fmt: skip
    return table


def cancelling_table(st: Status) -> Table:
    """Running jobs asked to cancel: they stay executing until their perform has stopped."""
    table = Table(title="cancel requested, perform still running")
    for name in ("id", "queue", "worker", "node", "since"):
        table.add_column(name)
    for job in st.cancelling:
        table.add_row(_cell(job["id"]), _cell(job["queue"]), _cell(job["worker"]),
                      _cell(job["node"] or "-"), _cell(job["since"]))  # fmt: skip
    return table


def workflows_table(st: Status) -> Table:
    """Workflows with work left: how many of their steps finished, failed, wait or run."""
    table = Table(title=f"workflows ({st.waiting_on_parents} jobs waiting for parents)")
    for name in ("workflow", "id", "done", "failed", "waiting", "executing"):
        table.add_column(name, justify="left" if name in ("workflow", "id") else "right")
    for flow in st.workflows:
        table.add_row(
            _cell(flow["name"] or "-"), _cell(flow["id"]),
            f"{flow['completed']}/{flow['total']}", str(flow["failed"]), str(flow["waiting"]),
            str(flow["executing"]),
        )  # fmt: skip
    return table


def migrations_table(st: Status) -> Table:
    """Migrations this code has and the database lacks: the schema is behind the code."""
    table = Table(title="pending migrations: run `shigoto migrate`")
    for name in ("migration", "steps done"):
        table.add_column(name)
    for m in st.pending_migrations:
        table.add_row(f"{m['version']:04d}_{m['name']}", f"{m['steps_done']}/{m['steps']}")
    return table


def render_status(st: Status, console: Console | None = None, *, wide: bool = False) -> None:
    """Print every table that has something to say; `wide`: every column of the queues and
    nodes tables, under full headers (the default fits 100 columns for typical names)."""
    tables = [status_table(st, wide), nodes_table(st, wide)]
    if st.pending_migrations:
        tables.insert(0, migrations_table(st))
    if st.cron:
        tables.append(cron_table(st))
    if st.workflows or st.waiting_on_parents:
        tables.append(workflows_table(st))
    if st.settings:
        tables.append(settings_table(st))
    if st.breakers:
        tables.append(breakers_table(st))
    if st.cancelling:
        tables.append(cancelling_table(st))
    if console is None:
        console = Console()
        if not console.is_terminal:
            # Piped or captured (kubectl exec, grep, CI logs): there is no screen to fit, and
            # the 80-column default would cut queue names and headers down to "visi…".
            wide_options = console.options.update_width(10_000)
            needed = max(console.measure(t, options=wide_options).maximum for t in tables)
            console = Console(width=max(needed, console.width))
    for table in tables:
        console.print(table)


#: How `watch_status` waits between redraws (replaced in tests, which never sleep).
_pause: Callable[[float], None] = time.sleep


def watch_status(
    read: Callable[[], Status], seconds: float, *, wide: bool = False,
    console: Console | None = None,
) -> int:  # fmt: skip
    """Redraw the status every `seconds` until Ctrl-C, then exit 0 (stopping is the normal
    end of watching, not a failure). A terminal is cleared before each redraw, so the tables
    stay in place; a pipe gets each redraw after a dated rule, so a log of them reads back."""
    console = console or Console()
    try:
        while True:
            st = read()
            if console.is_terminal:
                console.clear()
            stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
            console.rule(f"shigoto status, every {seconds:g}s (Ctrl-C to stop) · {stamp}",
                         style="dim")  # fmt: skip
            render_status(st, console if console.is_terminal else None, wide=wide)
            _pause(seconds)
    except KeyboardInterrupt:
        return 0
