"""`shigoto demo` end to end: every story ends as intended, with output to a non-terminal.

Assertions are on the rows the demo leaves in its schema, never on the text it prints.
"""

from __future__ import annotations

import io
from collections import Counter
from datetime import UTC, datetime, timedelta

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

    # The workflow: a diamond, each step started only after its parents finished, and the last
    # step saw both parents' results through current_job().parent_results.
    steps = {j.step: j for j in stories["workflow"]}
    assert set(steps) == set(demo.WORKFLOW_STEPS)
    assert {j.state for j in steps.values()} == {JobState.COMPLETED}
    assert len({j.meta["workflow"]["id"] for j in steps.values()}) == 1
    for step, after in demo.WORKFLOW_STEPS.items():
        parents = [steps[p] for p in after]
        assert sorted(steps[step].depends_on or []) == sorted(p.id for p in parents)
        assert all(steps[step].attempted_at >= p.finished_at for p in parents)
    ship = steps["ship_order"]
    assert ship.result == {
        "order_id": 1003, "parents": sorted([steps["charge_payment"].id, steps["pack_parcel"].id]),
        "charged": 42.5, "parcel": "PCL-1003",
    }  # fmt: skip

    # The batch: three thumbnails in one batch, and its callback enqueued once, after all of
    # them finished, with the counts among its args.
    thumbnails = stories["batch"]
    assert len(thumbnails) == demo.BATCH_SIZE == 3
    assert {j.state for j in thumbnails} == {JobState.COMPLETED}
    (batch_id,) = {j.batch_id for j in thumbnails}
    assert batch_id is not None
    (callback,) = stories["callback"]
    assert (callback.short_worker, callback.state, callback.attempt) == (
        "album_ready", JobState.COMPLETED, 1)  # fmt: skip
    assert callback.meta["batch_callback"]["batch_id"] == batch_id
    counts = {"id": batch_id, "total": 3, "completed": 3, "discarded": 0, "cancelled": 0}
    assert callback.args == {"album": "holiday", "batch": counts}
    assert callback.result == {"album": "holiday", "thumbnails": 3, "of": 3}
    assert callback.inserted_at >= max(j.finished_at for j in thumbnails)

    # The runner left: no node of the demo is still registered.
    assert shigoto.status(database_url=db_url, schema=demo.DEMO_SCHEMA).nodes == []
    assert "every job ended as its story says" in out.getvalue()


def _job(story: str, state: JobState, attempt: int = 1, **overrides) -> DemoJob:
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
    del good["workflow"], good["batch"], good["callback"]
    flow = _workflow()
    thumbnails = [_job("batch", JobState.COMPLETED, id=300 + i, batch_id=9) for i in range(3)]
    counts = {"id": 9, "total": 3, "completed": 3, "discarded": 0, "cancelled": 0}
    callback = _job("callback", JobState.COMPLETED, id=310, args={"album": "a", "batch": counts})
    jobs = [*good.values(), *flow.values(), *thumbnails, callback]
    events = Counter({(good["snooze"].id, "job.snooze"): 1})
    notices = ["import of contacts.xlsx discarded: Discard: ..."]

    assert not any(demo.check(jobs, events, notices).values())

    wrong = [_job("flaky", JobState.DISCARDED, 3, id=100) if j.id == 100 else j for j in jobs]
    problems = demo.check(wrong, events, notices)
    assert problems["flaky"] and not problems["plain"]
    assert demo.check(jobs, Counter(), notices)["snooze"]

    # A step that started before a parent finished, or a last step blind to its parents.
    early = {**flow, "ship_order": _step(flow, "ship_order", 203, attempted=1)}
    assert demo.check([*good.values(), *early.values(), *thumbnails, callback], events,
                      notices)["workflow"]  # fmt: skip
    blind = {**flow, "ship_order": _step(flow, "ship_order", 203, result={"parents": []})}
    assert demo.check([*good.values(), *blind.values(), *thumbnails, callback], events,
                      notices)["workflow"]  # fmt: skip
    # A callback with the wrong counts, or one that ran twice.
    wrong_counts = {**counts, "completed": 2, "discarded": 1}
    short = _job("callback", JobState.COMPLETED, id=310, args={"album": "a", "batch": wrong_counts})
    assert demo.check([*good.values(), *flow.values(), *thumbnails, short], events,
                      notices)["callback"]  # fmt: skip
    twice = [*jobs, _job("callback", JobState.COMPLETED, id=311, args=callback.args)]
    assert demo.check(twice, events, notices)["callback"]


_START = datetime(2026, 1, 1, tzinfo=UTC)


def _step(
    flow: dict[str, DemoJob], step: str, id: int, attempted: int | None = None, **overrides
) -> DemoJob:
    """The workflow step `step` as job `id`, started `attempted` seconds in (by default once
    its parents have finished: level by level, a second each)."""
    after = demo.WORKFLOW_STEPS[step]
    level = 1 + max((int((flow[p].finished_at - _START).total_seconds()) for p in after),
                    default=-1)  # fmt: skip
    start = _START + timedelta(seconds=level if attempted is None else attempted)
    values = dict(worker=f"shigoto.cli.demo_workers.{step}", attempted_at=start,
                  finished_at=start + timedelta(seconds=0.5), meta={"workflow": {"step": step}},
                  depends_on=[flow[p].id for p in after] or None)  # fmt: skip
    return _job("workflow", JobState.COMPLETED, id=id, **{**values, **overrides})


def _workflow() -> dict[str, DemoJob]:
    flow: dict[str, DemoJob] = {}
    for i, step in enumerate(demo.WORKFLOW_STEPS):
        flow[step] = _step(flow, step, 200 + i)
    parents = sorted(flow[p].id for p in demo.WORKFLOW_STEPS["ship_order"])
    flow["ship_order"] = _step(flow, "ship_order", 203, result={"parents": parents})
    return flow
