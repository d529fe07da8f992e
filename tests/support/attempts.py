"""Every attempt's start and end, recorded from inside the perform, and the check that no two
attempts of one job overlapped: the core promise every test that runs jobs can assert.

Workers wrapped in `recorded` append `start`/`end` lines to one file per process under the
directory named by `SHIGOTO_TEST_ATTEMPT_LOG` (a file, not the database, so the record can
neither fail nor slow what it watches). Times are `time.monotonic()`, which on Linux is one
clock for every process of the machine, so intervals of different runners compare directly.

An attempt whose process was killed has no `end` line: it counts as running until the time
the test says the process died (`ended_by`), or for ever, so a later attempt of its job is
reported as overlapping it rather than silently passing.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import shigoto

ENV = "SHIGOTO_TEST_ATTEMPT_LOG"

F = TypeVar("F", bound=Callable[..., Any])


def mark(event: str) -> None:
    """Append `event` (`start` or `end`) for the running attempt, if a log is configured."""
    folder = os.environ.get(ENV)
    if not folder:
        return
    job = shigoto.current_job()
    line = f"{event} {job.id} {job.attempt} {os.getpid()} {time.monotonic():.6f}\n"
    with open(os.path.join(folder, f"{os.getpid()}.attempts"), "a", encoding="ascii") as fh:
        fh.write(line)


def recorded(fn: F) -> F:
    """`fn` (sync or async) with its start and end recorded, whatever way it ends."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            mark("start")
            try:
                return await fn(*args, **kwargs)
            finally:
                mark("end")

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        mark("start")
        try:
            return fn(*args, **kwargs)
        finally:
            mark("end")

    return run  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Attempt:
    job_id: int
    attempt: int
    pid: int
    start: float
    end: float  # math.inf: never ended (its process was killed and not named in `ended_by`)


def read(folder: Path, ended_by: Mapping[int, float] | None = None) -> list[Attempt]:
    """Every recorded attempt; one without an end ends at `ended_by[pid]`, else never."""
    starts: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    ends: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for path in folder.glob("*.attempts"):
        for line in path.read_text("ascii").splitlines():
            event, job_id, attempt, pid, at = line.split()
            key = (int(job_id), int(attempt), int(pid))
            (starts if event == "start" else ends)[key].append(float(at))
    out = []
    for key, begun in starts.items():
        finished = sorted(ends.get(key, []))
        for i, start in enumerate(sorted(begun)):
            end = finished[i] if i < len(finished) else (ended_by or {}).get(key[2], math.inf)
            out.append(Attempt(key[0], key[1], key[2], start, end))
    return out


def overlaps(attempts: list[Attempt]) -> list[tuple[Attempt, Attempt]]:
    """Pairs of attempts of one job whose intervals intersect."""
    by_job: dict[int, list[Attempt]] = defaultdict(list)
    for a in attempts:
        by_job[a.job_id].append(a)
    found = []
    for runs in by_job.values():
        runs.sort(key=lambda a: a.start)
        for i, first in enumerate(runs):
            for second in runs[i + 1:]:
                if second.start < first.end:
                    found.append((first, second))
    return found


def assert_no_overlap(folder: Path, ended_by: Mapping[int, float] | None = None) -> list[Attempt]:
    """Fail naming the jobs whose attempts overlapped; returns the attempts read."""
    attempts = read(folder, ended_by)
    both = overlaps(attempts)
    assert not both, "attempts of one job overlapped: " + "; ".join(
        f"job {a.job_id}: attempt {a.attempt} (pid {a.pid}) ran {a.start:.3f}-{a.end:.3f}, "
        f"attempt {b.attempt} (pid {b.pid}) started {b.start:.3f}" for a, b in both[:10]
    )
    return attempts
