"""The loop watch names the job that blocks the event loop, even when the stall began before
that job's perform did (start-up work, a slow callback) and no job was on the stack at first."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from shigoto.job import Job, JobState
from shigoto.runtime.loop_watch import LoopWatch

JOB = Job(id=42, queue="q", worker="app.blocker", args={}, state=JobState.EXECUTING, attempt=1)


def execute(job: Job) -> None:
    """Stands for JobExecutor.execute: its frame holds `job` while a perform blocks."""
    time.sleep(0.8)


def test_a_stall_first_seen_without_a_job_names_the_job_once_it_is_on_the_stack(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        watch = LoopWatch("node-1", execute.__code__, threshold=0.3)
        watch.start()
        try:
            await asyncio.sleep(0.25)  # a tick or two, then one stall in two parts:
            time.sleep(1.2)  # no job on the stack yet (the watch sees it after 0.3 s)
            execute(JOB)  # then the job's perform, before the loop ticks again
            await asyncio.sleep(0.3)
        finally:
            watch.stop()

    with caplog.at_level(logging.WARNING, logger="shigoto.loop"):
        asyncio.run(main())
    blocked = [r.getMessage() for r in caplog.records if "blocked for more than" in r.getMessage()]
    assert blocked and "by job" not in blocked[0], blocked  # first seen: nobody to blame
    assert any("by job 42 (app.blocker)" in m for m in blocked[1:]), blocked
    recovered = [r.getMessage() for r in caplog.records if "was blocked for" in r.getMessage()]
    assert recovered and "by job 42" in recovered[-1], recovered
