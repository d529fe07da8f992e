"""Workers for the engine tests: hung performs, cooperative cancel, process isolation, callbacks.

Imported both in-process and by `shigoto run` subprocesses. In-process state (events, lists) is
reset by `reset()`; a subprocess or a child process reports through files named in the args.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import shigoto

#: Far beyond any test's need: a hung perform always ends by itself eventually.
HANG = 30.0

release = threading.Event()
started: list[int] = []
finished: list[int] = []
saw_cancel: list[int] = []
discards: list[tuple[int, list[dict[str, Any]]]] = []


def reset() -> None:
    release.clear()
    for record in (started, finished, saw_cancel, discards):
        record.clear()


def _mark(path: str | None, text: str) -> None:
    if path:
        tmp = Path(f"{path}.tmp")
        tmp.write_text(text, "utf-8")
        tmp.replace(path)  # atomic: a reader never sees half a file


@shigoto.worker(timeout=0.5, max_attempts=1)
def hang(marker: str | None = None) -> None:
    """Ignores its deadline: holds its thread until `release` (or HANG seconds)."""
    job = shigoto.current_job()
    started.append(job.id)
    _mark(marker, str(os.getpid()))
    release.wait(HANG)
    finished.append(job.id)


@shigoto.worker(max_attempts=1)
def trivial() -> str:
    return "done"


@shigoto.worker(timeout=0.5, max_attempts=1)
def cooperative() -> str:
    """Works in small steps and stops as soon as the runner gives up on it."""
    job = shigoto.current_job()
    started.append(job.id)
    deadline = time.monotonic() + HANG
    while not job.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    if job.cancelled:
        saw_cancel.append(job.id)
    return "stopped"


@shigoto.worker(timeout=60, max_attempts=1)
def cancellable() -> str:
    """Like `cooperative`, but only an operator's cancel stops it."""
    return cooperative.fn()


def _record_discard(args: dict[str, Any], errors: list[dict[str, Any]]) -> None:
    discards.append((args["n"], errors))


@shigoto.worker(max_attempts=1, on_discard=_record_discard)
def with_on_discard(n: int) -> None:
    raise RuntimeError(f"failure {n}")


def _hang_on_discard(args: dict[str, Any], errors: list[dict[str, Any]]) -> None:
    release.wait(HANG)


@shigoto.worker(max_attempts=1, on_discard=_hang_on_discard)
def stuck_on_discard() -> None:
    raise RuntimeError("fails, and its on_discard hangs")


def _slow_backoff(attempt: int, error: BaseException) -> float:
    release.wait(HANG)
    return 1.0


@shigoto.worker(max_attempts=3, backoff=_slow_backoff)
def stuck_backoff() -> None:
    raise RuntimeError("fails, and its backoff hangs")


@shigoto.worker(max_attempts=3)
def fails(secret: str = "") -> None:
    raise ValueError("always fails")


# -- process isolation ----------------------------------------------------------------------


@shigoto.worker(isolation="process", timeout=0.5, max_attempts=1)
def isolated_hang(marker: str) -> None:
    """Writes its pid, then sleeps far past its deadline: only a kill ends it early."""
    _mark(marker, str(os.getpid()))
    time.sleep(HANG)


@shigoto.worker(isolation="process", timeout=60, max_attempts=1)
def isolated_wait(marker: str) -> None:
    """Writes its pid and waits to be cancelled (killed)."""
    _mark(marker, str(os.getpid()))
    time.sleep(HANG)


@shigoto.worker(isolation="process", max_attempts=1)
def isolated_ok(x: int) -> dict[str, Any]:
    shigoto.current_job().report_progress(40)
    return {"pid": os.getpid(), "x": x * 2}


@shigoto.worker(isolation="process", max_attempts=1)
def isolated_sum_of_parents() -> int:
    """A workflow child in a child process: its parents' results cross the process boundary."""
    return sum(r["x"] for r in shigoto.current_job().parent_results.values())


class Unpicklable(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"code {code}: {detail}")


@shigoto.worker(isolation="process", max_attempts=1)
def isolated_raises(kind: str) -> None:
    if kind == "value":
        raise ValueError("boom in the child")
    if kind == "snooze":
        raise shigoto.Snooze(120)
    if kind == "exit":
        os._exit(3)
    raise Unpicklable(7, "no pickle")


class IsolatedClass(shigoto.Worker):
    isolation = "process"
    max_attempts = 1

    def perform(self, args: dict[str, Any]) -> int:
        return os.getpid()


# -- global limits --------------------------------------------------------------------------


@shigoto.worker(queue="limited", max_attempts=1)
def interval(ms: int, log: str) -> None:
    """Sleeps `ms` and appends its interval (system-wide monotonic clock) to a per-process file
    under `log`: no database involved, so a killed connection or a restart loses no record."""
    job = shigoto.current_job()
    start = time.monotonic()
    time.sleep(ms / 1000)
    end = time.monotonic()
    with Path(log, f"{os.getpid()}.log").open("a", encoding="utf-8") as out:
        out.write(f"{job.id} {start} {end}\n")


def intervals(log: Path) -> list[tuple[int, float, float]]:
    found = []
    for path in log.glob("*.log"):
        for line in path.read_text("utf-8").splitlines():
            job_id, start, end = line.split()
            found.append((int(job_id), float(start), float(end)))
    return found


def max_overlap(spans: list[tuple[int, float, float]]) -> int:
    """The most intervals open at one instant (an end at the same instant as a start first)."""
    events = sorted([(s, 1) for _, s, _ in spans] + [(e, -1) for _, _, e in spans])
    open_now = peak = 0
    for _, step in events:
        open_now += step
        peak = max(peak, open_now)
    return peak
