"""What one benchmark phase cost: PostgreSQL's CPU, the WAL it wrote, the client's CPU.

Wall time on a shared machine swings by a fifth from run to run; these three do not, and
they are what decides how many runner pods one database can feed. They are read around the
timed part of a phase only, never its set-up.

- Server CPU is the CPU time of the PostgreSQL server's processes over the phase: the
  postmaster's own and its reaped children's (`cutime`/`cstime` in /proc/<pid>/stat) plus
  every live child's. A backend that exits during the phase moves from the second sum to the
  first, so the difference stays right. It needs the server on this machine (the benchmark's
  default); elsewhere it is None.
- WAL is `pg_current_wal_lsn()` before and after, in bytes.
- Client CPU is this process's CPU time (all its threads): the enqueuing client, or the
  in-process runner for the processing phases.

Standard library and psycopg only, so that benchmarks/peers.py can load this file by path
into the peers' virtualenv (where Shigoto is not installed) and measure them the same way.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")


@dataclass(frozen=True)
class Sample:
    """The counters at one instant."""

    server_cpu_s: float | None
    wal_bytes: int
    client_cpu_s: float


def _ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces), or None if gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def parent_of(pid: int) -> int | None:
    """The parent pid of `pid` (field 4 of its stat line)."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def _children(parent: int) -> list[int]:
    """Live children of `parent`, read from /proc/<pid>/task/*/children when the kernel has
    it, else from every process's stat."""
    found: list[int] = []
    tasks = PROC / str(parent) / "task"
    try:
        for task in tasks.iterdir():
            found.extend(int(p) for p in (task / "children").read_text().split())
        return found
    except OSError:
        pass
    for entry in PROC.iterdir():
        if entry.name.isdigit() and parent_of(int(entry.name)) == parent:
            found.append(int(entry.name))
    return found


def tree_cpu_seconds(postmaster: int) -> float | None:
    """CPU time of the postmaster, its reaped children and its live children, in seconds."""
    fields = _stat_fields(postmaster)
    if fields is None:
        return None
    # utime, stime, cutime, cstime are fields 14-17 of the stat line: 11-14 after the name.
    ticks = sum(int(x) for x in fields[11:15])
    for child in _children(postmaster):
        child_fields = _stat_fields(child)
        if child_fields is not None:
            ticks += int(child_fields[11]) + int(child_fields[12])
    return ticks / _ticks()


def per_job(before: Sample, after: Sample, jobs: int) -> dict[str, float | None]:
    """The phase's costs divided by its jobs: µs of CPU, bytes of WAL."""
    jobs = max(jobs, 1)
    server = None
    if before.server_cpu_s is not None and after.server_cpu_s is not None:
        server = round((after.server_cpu_s - before.server_cpu_s) / jobs * 1e6, 1)
    return {
        "server_cpu_us_per_job": server,
        "wal_bytes_per_job": round((after.wal_bytes - before.wal_bytes) / jobs, 1),
        "client_cpu_us_per_job": round((after.client_cpu_s - before.client_cpu_s) / jobs * 1e6, 1),
    }


class Meter:
    """Samples the counters on a connection of its own, opened once before the phase."""

    def __init__(self, url: str) -> None:
        import psycopg

        self._conn: Any = psycopg.connect(url, autocommit=True)
        backend = self._conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        self._postmaster = parent_of(backend) if (PROC / str(backend)).exists() else None
        self._before: Sample | None = None

    def sample(self) -> Sample:
        wal = self._conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")
        server = tree_cpu_seconds(self._postmaster) if self._postmaster else None
        return Sample(server, int(wal.fetchone()[0]), time.process_time())

    def start(self) -> None:
        self._before = self.sample()

    def stop(self, jobs: int) -> dict[str, float | None]:
        """The costs per job since `start`, and the meter's connection closed."""
        after = self.sample()
        self._conn.close()
        assert self._before is not None, "Meter.stop before Meter.start"
        return per_job(self._before, after, jobs)
