"""`shigoto demo` end to end: every story ends as intended, with output to a non-terminal.

Assertions are on the rows the demo leaves in its schema, never on the text it prints.
"""

from __future__ import annotations

import io
from collections import Counter
from datetime import timedelta

from rich.console import Console

import shigoto
from shigoto.cli import demo
from shigoto.cli.demo import DemoJob
from shigoto.job import JobState


def _by_story(jobs: list[DemoJob]) -> dict[str, list[DemoJob]]:
    stories: dict[str, list[DemoJob]] = {}
    for job in jobs:
        stories.setdefault(job.story, []).append(job)
    return stories


def test_demo_tells_every_story(db_url):
    # What an earlier run left behind in a demo queue must not leak into this one.
    shigoto.migrate(db_url, schema=demo.DEMO_SCHEMA)
    leftover = shigoto.enqueue(
        "shigoto.cli.demo_workers.send_welcome_email", {"user_id": 0}, queue="demo",
        schedule_in=3600, database_url=db_url, schema=demo.DEMO_SCHEMA,
    )  # fmt: skip

    out = io.StringIO()
    console = Console(file=out, width=120)
    assert not console.is_terminal

    assert demo.main(db_url, console=console) == 0

    jobs = demo.final_jobs(db_url)
    assert leftover.id not in {j.id for j in jobs}
    stories = _by_story(jobs)
    assert set(stories) == set(demo.STORIES)
    assert all(j.state in {JobState.COMPLETED, JobState.DISCARDED, JobState.CANCELLED}
               for j in jobs)  # fmt: skip

    plain = stories["plain"]
    assert len(plain) == 8
    assert {j.state for j in plain} == {JobState.COMPLETED}
    assert all(j.result["sent_to"].endswith("@example.com") for j in plain)

    # Priority decides on a queue of concurrency 2, whatever the insertion order.
    urgent, routine = stories["urgent"], stories["routine"]
    assert {j.priority for j in urgent} == {10} and {j.priority for j in routine} == {0}
    assert max(j.id for j in routine) < min(j.id for j in urgent)
    assert max(j.attempted_at for j in urgent) <= min(j.attempted_at for j in routine)

    for job in stories["scheduled"]:
        assert job.state == JobState.COMPLETED
        assert job.scheduled_at - job.inserted_at >= timedelta(seconds=3)
        assert job.attempted_at >= job.scheduled_at

    (flaky,) = stories["flaky"]
    assert (flaky.state, flaky.attempt) == (JobState.COMPLETED, 3)
    assert [e["attempt"] for e in flaky.errors] == [1, 2]
    assert all("ConnectionError" in e["error"] and e["traceback"] for e in flaky.errors)
    assert flaky.result == {"order_id": 1001, "charged": True}

    # A snooze reschedules without using an attempt and without recording an error.
    (snoozed,) = stories["snooze"]
    assert (snoozed.state, snoozed.attempt, snoozed.errors) == (JobState.COMPLETED, 1, [])
    assert snoozed.scheduled_at - snoozed.inserted_at >= timedelta(seconds=1)

    (report,) = stories["progress"]
    assert (report.state, report.progress) == (JobState.COMPLETED, 100)

    (rejected,) = stories["rejected"]
    assert (rejected.state, rejected.attempt) == (JobState.DISCARDED, 1)
    assert rejected.errors[-1]["error"].startswith("Discard:")

    (exhausted,) = stories["exhausted"]
    assert (exhausted.state, exhausted.attempt) == (JobState.DISCARDED, 1)
    assert "JSONDecodeError" in exhausted.errors[-1]["error"]

    (cancelled,) = stories["cancelled"]
    assert cancelled.state == JobState.CANCELLED
    assert "already refunded" in cancelled.errors[-1]["error"]

    # The runner left: no node of the demo is still registered.
    assert shigoto.status(database_url=db_url, schema=demo.DEMO_SCHEMA).nodes == []
    assert "every job ended as its story says" in out.getvalue()


def _job(story: str, state: JobState, attempt: int = 1, **overrides) -> DemoJob:
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    values = dict(
        id=overrides.pop("id", 1), story=story, worker=f"shigoto.cli.demo_workers.{story}",
        queue="demo", state=state, priority=0, attempt=attempt, errors=[], result=None,
        progress=None, inserted_at=now, scheduled_at=now, attempted_at=now, finished_at=now,
    )  # fmt: skip
    values.update(overrides)
    return DemoJob(**values)


def test_check_names_a_story_that_went_wrong():
    good = {name: _job(name, story.state, story.attempt, id=i)
            for i, (name, story) in enumerate(demo.STORIES.items())}  # fmt: skip
    good["flaky"] = _job("flaky", JobState.COMPLETED, 3, id=100,
                         errors=[{"attempt": 1}, {"attempt": 2}])  # fmt: skip
    good["progress"] = _job("progress", JobState.COMPLETED, id=101, progress=100)
    events = Counter({(good["snooze"].id, "job.snooze"): 1})
    notices = ["import of contacts.xlsx discarded: Discard: ..."]

    assert not any(demo.check(list(good.values()), events, notices).values())

    wrong = {**good, "flaky": _job("flaky", JobState.DISCARDED, 3, id=100)}
    problems = demo.check(list(wrong.values()), events, notices)
    assert problems["flaky"] and not problems["plain"]
    assert demo.check(list(good.values()), Counter(), notices)["snooze"]
