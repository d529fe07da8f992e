"""Cron fires once per slot whatever the mix of runners, and one id names a process everywhere
(issue 25, items 1 and 2). Real `shigoto run` processes on a real PostgreSQL.

Slots are minutes, so most checks rewind the schedule's `last_slot_at` (catch-up `all`) and
watch the leader enqueue the slots it skipped: that tests who schedules in seconds, and a
replayed slot must not be doubled (its unique key). One test crosses a real minute boundary
after the cron leader was SIGKILLed, bounded by ~70 s waits.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from shigoto.dashboard import Dashboard, DashboardServer, Request, Source
from shigoto.ops import operations
from tests.support.cli import shigoto_cli
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import wait_until

WORKERS = "tests.support.cron_leadership_workers"
NAME = "every-minute"
TOKEN = "a-dashboard-token-for-tests"
#: A SIGKILLed leader's lease runs out after 5 s; start-up takes a few seconds more.
HANDOVER = 30.0


@pytest.fixture
def cron_file(tmp_path: Path) -> Path:
    path = tmp_path / "schedules.json"
    path.write_text(json.dumps([{
        "name": NAME, "schedule": "* * * * *", "worker": f"{WORKERS}.tick", "queue": "cron",
        "catch_up": "all",
    }]))  # fmt: skip
    return path


Start = Callable[..., RunnerProcess]


def plain(start: Start) -> RunnerProcess:
    return start(workers=WORKERS, queue="api=2")


def with_cron(start: Start, cron_file: Path) -> RunnerProcess:
    return start("--cron", str(cron_file), workers=WORKERS, queue="cron=2")


def node_of(conn: psycopg.Connection[Any], runner: RunnerProcess) -> str:
    """The runner's node id, from its heartbeat row (its first beat comes before it serves)."""

    def found() -> str | None:
        row = conn.execute("SELECT id FROM shigoto_nodes WHERE pid = %s",
                           (runner.proc.pid,)).fetchone()  # fmt: skip
        return row[0] if row else None

    return wait_until(found, timeout=HANDOVER, message=f"node row:\n{runner.output()}")


def holder(conn: psycopg.Connection[Any], lease: str) -> str | None:
    row = conn.execute("SELECT leader_id FROM shigoto_leaders WHERE name = %s "
                       "AND expires_at > now()", (lease,)).fetchone()  # fmt: skip
    return row[0] if row else None


def slots(conn: psycopg.Connection[Any]) -> Counter[datetime]:
    """How many jobs each slot of the schedule made (live or archived)."""
    rows = conn.execute(
        "SELECT meta->>'slot' FROM shigoto_jobs WHERE meta->>'cron' = %(n)s UNION ALL "
        "SELECT meta->>'slot' FROM shigoto_jobs_archive WHERE meta->>'cron' = %(n)s",
        {"n": NAME},
    ).fetchall()
    return Counter(datetime.fromisoformat(r[0]) for r in rows)


def rewind(conn: psycopg.Connection[Any], minutes: int) -> datetime:
    """Move the schedule back `minutes` slots; returns the newest slot already past, which the
    leader must reach again, enqueueing every slot in between."""
    conn.execute("UPDATE shigoto_cron SET last_slot_at = last_slot_at - make_interval(mins => %s)"
                 " WHERE name = %s", (minutes, NAME))  # fmt: skip
    now = conn.execute("SELECT now()").fetchone()[0]
    return now.astimezone(UTC).replace(second=0, microsecond=0)


def assert_each_slot_once(seen: Counter[datetime], first: datetime, last: datetime) -> None:
    """Every minute from `first` to `last` enqueued, none twice."""
    doubled = {slot: n for slot, n in seen.items() if n != 1}
    assert not doubled, f"slots enqueued more than once: {doubled}"
    minute, missing = first, []
    while minute <= last:
        if minute not in seen:
            missing.append(minute.isoformat())
        minute += timedelta(minutes=1)
    assert not missing, f"slots never enqueued: {missing}; enqueued {sorted(seen)}"


def catch_up_fires(conn: psycopg.Connection[Any], runners: list[RunnerProcess]) -> None:
    """Rewind three slots (the newest is replayed, the two before it are new); whichever
    runner leads cron enqueues each of them, once."""
    newest = rewind(conn, 3)
    logs = "\n".join(r.output() for r in runners)
    wait_until(lambda: newest in slots(conn), timeout=HANDOVER,
               message=f"the cron leader caught up to {newest}:\n{logs}")  # fmt: skip
    assert_each_slot_once(slots(conn), newest - timedelta(minutes=2), newest)


def test_plain_first_then_cron_the_cron_runner_fires(
    runner_processes: Start, cron_file: Path, conn: psycopg.Connection[Any]
) -> None:
    """Issue 25's case: the plain runner leads first; the cron runner must still fire."""
    b = plain(runner_processes)
    b_id = node_of(conn, b)
    wait_until(lambda: holder(conn, "leader"), timeout=HANDOVER, message=b.output())
    c = with_cron(runner_processes, cron_file)
    c_id = node_of(conn, c)
    catch_up_fires(conn, [b, c])
    assert holder(conn, "cron") == c_id
    assert holder(conn, "leader") == b_id, "the plain runner keeps rescue and pruning"


def test_cron_first_then_plain_the_plain_runner_never_takes_cron(
    runner_processes: Start, cron_file: Path, conn: psycopg.Connection[Any]
) -> None:
    c = with_cron(runner_processes, cron_file)
    c_id = node_of(conn, c)
    wait_until(lambda: holder(conn, "cron") == c_id, timeout=HANDOVER, message=c.output())
    b = plain(runner_processes)
    b_id = node_of(conn, b)
    # The cron runner stops cleanly: the plain runner takes `leader`, never `cron`.
    c.signal(signal.SIGTERM)
    c.wait_exit()
    wait_until(lambda: holder(conn, "leader") == b_id, timeout=HANDOVER, message=b.output())
    c2 = with_cron(runner_processes, cron_file)
    c2_id = node_of(conn, c2)
    catch_up_fires(conn, [b, c2])
    assert holder(conn, "cron") == c2_id


def test_two_cron_runners_and_a_plain_one_hand_over_cron_without_losing_a_slot(
    runner_processes: Start, cron_file: Path, conn: psycopg.Connection[Any]
) -> None:
    """The cron leader is SIGKILLed; the other cron runner takes over, catches up, and the
    slots of real minutes keep coming: each slot once, none missed across the move."""
    b = plain(runner_processes)
    b_id = node_of(conn, b)
    wait_until(lambda: holder(conn, "leader") == b_id, timeout=HANDOVER, message=b.output())
    crons = [with_cron(runner_processes, cron_file) for _ in range(2)]
    ids = {node_of(conn, c): c for c in crons}
    first_leader = wait_until(lambda: holder(conn, "cron"), timeout=HANDOVER)
    assert first_leader in ids, f"cron led by a runner without --cron: {first_leader}"
    catch_up_fires(conn, [b, *crons])
    first = min(slots(conn))
    ids[first_leader].signal(signal.SIGKILL)
    ids[first_leader].wait_exit()
    (survivor,) = set(ids) - {first_leader}
    killed_at = conn.execute("SELECT now()").fetchone()[0]
    wait_until(lambda: holder(conn, "cron") == survivor, timeout=HANDOVER,
               message=ids[survivor].output())  # fmt: skip
    # A real slot after the kill, fired by the survivor (a minute boundary is at most 60 s away).
    next_slot = killed_at.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
    wait_until(lambda: next_slot in slots(conn), timeout=75,
               message=f"slot {next_slot} after the move:\n{ids[survivor].output()}")  # fmt: skip
    assert_each_slot_once(slots(conn), first, max(slots(conn)))
    assert holder(conn, "leader") == b_id


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def test_a_schedule_nobody_fires_is_loud(
    runner_processes: Start, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """Stored schedules and only plain runners: a warning, the gauge, the dashboard and status
    marks; a cron runner ends all of them."""
    import shigoto.cron

    shigoto.cron.schedule(NAME, "* * * * *", f"{WORKERS}.tick", queue="cron")
    port = _free_port()
    b = runner_processes("--health-port", str(port), workers=WORKERS, queue="api=2",
                         env={"SHIGOTO_CRON_WATCH_INTERVAL": "0.5"})  # fmt: skip
    wait_until(lambda: "no process fires" in b.output(), timeout=HANDOVER, message=b.output())
    wait_until(lambda: "shigoto_cron_unscheduled 1.0" in _get(port, "/metrics")[1],
               timeout=HANDOVER, message="the gauge counts the unscheduled schedule")  # fmt: skip
    d = Dashboard([Source("default", db_url)], token=TOKEN)
    try:
        (entry,) = _cron(d)
        assert entry["unscheduled"] is True
        assert operations.status().cron[0]["unscheduled"] is True
        assert "NOT FIRING" in shigoto_cli(db_url, "status").stdout
        runner_processes("--cron", workers=WORKERS, queue="cron=2")  # schedules, adds none
        wait_until(lambda: not _cron(d)[0]["unscheduled"], timeout=HANDOVER)
        wait_until(lambda: "shigoto_cron_unscheduled 0.0" in _get(port, "/metrics")[1],
                   timeout=HANDOVER)  # fmt: skip
        assert operations.status().cron[0]["unscheduled"] is False
        assert "NOT FIRING" not in shigoto_cli(db_url, "status").stdout
    finally:
        d.close()


def _cron(d: Dashboard) -> list[dict[str, Any]]:
    r = d.handle(Request("GET", "/api/cron", {"Authorization": f"Bearer {TOKEN}"}))
    assert r.status == 200
    return list(json.loads(r.body)["schedules"])


def test_api_nodes_marks_what_each_node_leads_under_one_id(
    runner_processes: Start, cron_file: Path, db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """The lease rows, the node rows, the logs and /api/nodes over HTTP name the same id."""
    b = plain(runner_processes)
    b_id = node_of(conn, b)
    wait_until(lambda: holder(conn, "leader") == b_id, timeout=HANDOVER, message=b.output())
    c = with_cron(runner_processes, cron_file)
    c_id = node_of(conn, c)
    wait_until(lambda: holder(conn, "cron") == c_id, timeout=HANDOVER, message=c.output())
    server = DashboardServer(Dashboard([Source("default", db_url)], token=TOKEN,
                                       loopback_only=True), "127.0.0.1", 0)  # fmt: skip
    server.start()
    try:
        status, body = _get(server.port, "/api/nodes", {"Authorization": f"Bearer {TOKEN}"})
    finally:
        server.stop()
    assert status == 200, body
    nodes = {n["id"]: n for n in json.loads(body)["nodes"]}
    assert set(nodes) == {b_id, c_id}
    assert nodes[b_id]["leader"] and nodes[b_id]["leads"] == ["leader"]
    assert nodes[c_id]["leader"] and nodes[c_id]["leads"] == ["cron"]
    # One id per process: the elector logs the node id of the heartbeat row, no other.
    assert f"node {b_id} became leader of leader" in b.output()
    assert f"node {c_id} became leader of cron" in c.output()
    st = {n["id"]: n for n in operations.status().nodes}
    assert st[c_id]["leads"] == ["cron"] and st[b_id]["leads"] == ["leader"]
