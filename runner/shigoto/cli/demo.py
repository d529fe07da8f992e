"""`shigoto demo`: the whole life of a job, in one terminal, in about ten seconds.

The demo migrates a schema of its own (`shigoto_demo`), clears what an earlier run left in the
demo queues, starts an in-process `shigoto.Runner` with the workers of `shigoto.cli.demo_workers`,
and enqueues one batch that tells a story for every outcome: plain jobs, two priorities,
scheduled jobs, a job that fails twice then succeeds, one that snoozes, one that reports
progress, two that are discarded and one that is cancelled. Next to it go a small workflow (an
order: `reserve_stock`, then `charge_payment` and `pack_parcel` side by side, then `ship_order`,
which reads its parents' results) and a batch of three thumbnails whose callback `album_ready`
receives the counts. It shows live counts by state and a feed of telemetry events, stops once
every job is finished, and prints the final tables.

`run()` returns a `DemoReport` (the final rows and what went against the story), so tests
assert on data; `main()` is what the CLI calls and turns the report into an exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from shigoto import config, telemetry
from shigoto.cli import demo_workers as workers
from shigoto.client.batching import AsyncBatch, abatch
from shigoto.client.enqueuing import aenqueue_many
from shigoto.client.workflow import Workflow, workflow
from shigoto.db.migrate import migrate
from shigoto.errors import Discard, Error
from shigoto.job import FINISHED_STATES, JobState
from shigoto.runtime.runner import Runner

#: The demo's own schema: it never reads or touches the jobs of a real application.
DEMO_SCHEMA = "shigoto_demo"
#: Queues served by the demo runner, with their concurrency.
QUEUES = {"demo": 4, "demo-media": 2, "demo-reports": 1}
#: Give up (and exit non-zero) if the jobs are not all finished by then.
DEADLINE_SECONDS = 45.0
#: Seconds between two looks at the jobs table.
TICK = 0.2
FEED_LINES = 8
FEED_EVENTS = ("job.stop", "job.exception", "job.snooze", "job.discard", "job.cancel",
               "stager.stage")  # fmt: skip

STATE_STYLE = {
    JobState.SCHEDULED: "blue",
    JobState.AVAILABLE: "white",
    JobState.EXECUTING: "bold cyan",
    JobState.RETRYABLE: "magenta",
    JobState.COMPLETED: "green",
    JobState.DISCARDED: "red",
    JobState.CANCELLED: "yellow",
}


@dataclass(frozen=True, slots=True)
class Story:
    """What should become of the jobs of one story."""

    title: str
    state: JobState
    attempt: int


STORIES: dict[str, Story] = {
    "plain": Story("plain jobs", JobState.COMPLETED, 1),
    "urgent": Story("priority 10", JobState.COMPLETED, 1),
    "routine": Story("priority 0", JobState.COMPLETED, 1),
    "scheduled": Story("scheduled ahead", JobState.COMPLETED, 1),
    "flaky": Story("fails twice, retried", JobState.COMPLETED, 3),
    "snooze": Story("snoozes once", JobState.COMPLETED, 1),
    "progress": Story("reports progress", JobState.COMPLETED, 1),
    "rejected": Story("raises Discard", JobState.DISCARDED, 1),
    "exhausted": Story("fails its one attempt", JobState.DISCARDED, 1),
    "cancelled": Story("raises Cancel", JobState.CANCELLED, 1),
    "workflow": Story("workflow, a diamond", JobState.COMPLETED, 1),
    "batch": Story("batch of thumbnails", JobState.COMPLETED, 1),
    "callback": Story("batch callback", JobState.COMPLETED, 1),
}
#: The order workflow: each step and the steps it runs after.
WORKFLOW_STEPS = {
    "reserve_stock": (),
    "charge_payment": ("reserve_stock",),
    "pack_parcel": ("reserve_stock",),
    "ship_order": ("charge_payment", "pack_parcel"),
}
#: How many thumbnails the batch holds: the count its callback must receive.
BATCH_SIZE = 3


def demo_jobs(now: float) -> list[dict[str, Any]]:
    """The batch the demo enqueues, as `enqueue_many` entries; `now` is the wall clock."""

    def job(story: str, worker: Any, args: dict[str, Any], **options: Any) -> dict[str, Any]:
        return {"worker": worker, "args": args, "meta": {"story": story}, **options}

    jobs = [job("plain", workers.send_welcome_email, {"user_id": i}) for i in range(1, 9)]
    # The routine ones come first in the batch: priority, not insertion order, decides.
    jobs += [job("routine", workers.resize_image, {"image": f"holiday-{i}"}) for i in (1, 2, 3)]
    jobs += [job("urgent", workers.resize_image, {"image": f"avatar-{i}"}, priority=10)
             for i in (1, 2, 3)]  # fmt: skip
    jobs += [job("scheduled", workers.send_reminder, {"user_id": i}, schedule_in=seconds)
             for i, seconds in ((1, 4), (2, 8))]  # fmt: skip
    jobs.append(job("flaky", workers.charge_card, {"order_id": 1001}))
    jobs.append(job("snooze", workers.sync_inventory, {"warehouse": "oslo", "ready_at": now + 3}))
    jobs.append(job("progress", workers.generate_report, {"report": "monthly sales", "pages": 20}))
    jobs.append(job("rejected", workers.ImportContacts,
                    {"file": "contacts.xlsx", "rows": "<a spreadsheet>"}))  # fmt: skip
    jobs.append(job("exhausted", workers.parse_webhook, {"payload": "{not json"}))
    jobs.append(job("cancelled", workers.refund_order, {"order_id": 1002}))
    return jobs


def demo_workflow(order_id: int = 1003) -> Workflow:
    """The order workflow (`WORKFLOW_STEPS`), a diamond; each step is named for its worker."""
    args: dict[str, dict[str, Any]] = {
        "reserve_stock": {"order_id": order_id, "items": ["tea", "kettle"]},
        "charge_payment": {"order_id": order_id, "amount": 42.5},
        "pack_parcel": {"order_id": order_id},
        "ship_order": {"order_id": order_id},
    }
    flow = workflow(f"order {order_id}")
    for step, after in WORKFLOW_STEPS.items():
        flow.add(step, getattr(workers, step), args[step], after=list(after),
                 meta={"story": "workflow"})  # fmt: skip
    return flow


async def enqueue_batch(conn: psycopg.AsyncConnection[Any], schema: str) -> AsyncBatch:
    """The thumbnails, in a batch whose callback `album_ready` the database enqueues once
    they all finished; the callback job's meta names the batch, not a story."""
    async with abatch(callback=workers.album_ready, callback_args={"album": "holiday"},
                      conn=conn, schema=schema) as batch:  # fmt: skip
        await batch.enqueue_many(
            {"worker": workers.make_thumbnail, "args": {"photo": f"holiday-{i}.jpg"},
             "meta": {"story": "batch"}}
            for i in range(1, BATCH_SIZE + 1)
        )  # fmt: skip
    return batch


def story_of(meta: dict[str, Any] | None) -> str:
    """The story a job tells: its meta says so, or, for a batch callback, the batch does."""
    meta = meta or {}
    if "story" in meta:
        return str(meta["story"])
    return "callback" if "batch_callback" in meta else "?"


# -- the report --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DemoJob:
    """One demo job as the jobs table holds it."""

    id: int
    story: str
    worker: str
    queue: str
    state: JobState
    priority: int
    attempt: int
    errors: list[dict[str, Any]]
    result: Any
    progress: int | None
    inserted_at: datetime
    scheduled_at: datetime
    attempted_at: datetime | None
    finished_at: datetime | None
    args: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    depends_on: list[int] | None = None
    batch_id: int | None = None

    @property
    def short_worker(self) -> str:
        return self.worker.rpartition(".")[2]

    @property
    def step(self) -> str | None:
        """The workflow step this job is, if any."""
        return (self.meta.get("workflow") or {}).get("step")

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> DemoJob:
        return cls(
            id=row["id"], story=story_of(row["meta"]), worker=row["worker"],
            queue=row["queue"], state=JobState(row["state"]), priority=row["priority"],
            attempt=row["attempt"], errors=row["errors"], result=row["result"],
            progress=row["progress"], inserted_at=row["inserted_at"],
            scheduled_at=row["scheduled_at"], attempted_at=row["attempted_at"],
            finished_at=row["finished_at"], args=row["args"] or {}, meta=row["meta"] or {},
            depends_on=row["depends_on"], batch_id=row["batch_id"],
        )  # fmt: skip


@dataclass(slots=True)
class DemoReport:
    """The final rows, the telemetry seen per job, and every way the run strayed from the story."""

    jobs: list[DemoJob]
    elapsed: float
    events: Counter[tuple[int, str]] = field(default_factory=Counter)
    notices: list[str] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.problems.values())

    def story(self, name: str) -> list[DemoJob]:
        return [j for j in self.jobs if j.story == name]

    def counts(self) -> dict[str, dict[str, int]]:
        """Jobs by queue and state (every state present, zeros included)."""
        counts: dict[str, dict[str, int]] = {q: {s.value: 0 for s in JobState} for q in QUEUES}
        for j in self.jobs:
            counts.setdefault(j.queue, {s.value: 0 for s in JobState})[j.state.value] += 1
        return counts


def check(
    jobs: list[DemoJob], events: Counter[tuple[int, str]], notices: list[str]
) -> dict[str, list[str]]:
    """Compare the final rows with the stories; returns what went wrong, by story."""
    problems: dict[str, list[str]] = {name: [] for name in STORIES}
    by_story: dict[str, list[DemoJob]] = {name: [] for name in STORIES}
    for j in jobs:
        if j.story not in STORIES:
            problems.setdefault("unknown", []).append(f"job {j.id} tells no known story")
            continue
        by_story[j.story].append(j)
        want = STORIES[j.story]
        if j.state != want.state:
            problems[j.story].append(f"job {j.id} ended {j.state}, expected {want.state}")
        elif j.attempt != want.attempt:
            problems[j.story].append(f"job {j.id} ended at attempt {j.attempt}, "
                                     f"expected {want.attempt}")  # fmt: skip
    for name, group in by_story.items():
        if not group:
            problems[name].append("no job of this story was found")
    urgent = [j.attempted_at for j in by_story["urgent"] if j.attempted_at]
    routine = [j.attempted_at for j in by_story["routine"] if j.attempted_at]
    if urgent and routine and max(urgent) > min(routine):
        problems["urgent"].append("a priority 0 job started before a priority 10 job")
    for j in by_story["scheduled"]:
        if j.attempted_at is not None and j.attempted_at < j.scheduled_at:
            problems["scheduled"].append(f"job {j.id} ran before its scheduled time")
    for j in by_story["flaky"]:
        if len(j.errors) != 2:
            problems["flaky"].append(f"job {j.id} recorded {len(j.errors)} errors, expected 2")
    for j in by_story["snooze"]:
        if events[(j.id, "job.snooze")] != 1:
            problems["snooze"].append(
                f"job {j.id} snoozed {events[(j.id, 'job.snooze')]} times, expected once"
            )
    for j in by_story["progress"]:
        if j.progress != 100:
            problems["progress"].append(f"job {j.id} ended at {j.progress}% progress")
    for j in by_story["rejected"]:
        if not any("contacts.xlsx" in notice for notice in notices):
            problems["rejected"].append(f"on_discard was not called for job {j.id}")
    problems["workflow"] += _check_workflow(by_story["workflow"])
    problems["batch"] += _check_batch(by_story["batch"])
    if not problems["batch"]:
        problems["callback"] += _check_callback(by_story["callback"], by_story["batch"][0])
    return problems


def _check_workflow(steps: list[DemoJob]) -> list[str]:
    """Every step once, each started after its parents finished, and the last step saw both
    parents' results."""
    by_step = {j.step: j for j in steps}
    if sorted(j.step or "?" for j in steps) != sorted(WORKFLOW_STEPS):
        return [f"steps {sorted(j.step or '?' for j in steps)}, expected {sorted(WORKFLOW_STEPS)}"]
    problems = []
    for step, after in WORKFLOW_STEPS.items():
        job = by_step[step]
        parents = [by_step[p] for p in after]
        if sorted(job.depends_on or []) != sorted(p.id for p in parents):
            problems.append(f"{step} #{job.id} depends on {job.depends_on}, expected "
                            f"{sorted(p.id for p in parents)}")  # fmt: skip
        for parent in parents:
            if (job.attempted_at is not None and parent.finished_at is not None
                    and job.attempted_at < parent.finished_at):  # fmt: skip
                problems.append(f"{step} #{job.id} started before {parent.step} finished")
    ship = by_step["ship_order"]
    parent_ids = sorted(by_step[p].id for p in WORKFLOW_STEPS["ship_order"])
    if not isinstance(ship.result, dict) or ship.result.get("parents") != parent_ids:
        problems.append(f"ship_order #{ship.id} did not see its parents' results: {ship.result}")
    return problems


def _check_batch(members: list[DemoJob]) -> list[str]:
    """The thumbnails all went into one batch."""
    batch_ids = {j.batch_id for j in members}
    if len(members) != BATCH_SIZE or len(batch_ids) != 1 or None in batch_ids:
        return [f"{len(members)} thumbnails in batches {batch_ids}, expected {BATCH_SIZE} in one"]
    return []


def _check_callback(callbacks: list[DemoJob], member: DemoJob) -> list[str]:
    """The batch's callback job exists once, with every thumbnail counted as completed."""
    if len(callbacks) != 1:
        return [f"the batch callback job was enqueued {len(callbacks)} times, expected once"]
    (callback,) = callbacks
    want = {"id": member.batch_id, "total": BATCH_SIZE, "completed": BATCH_SIZE,
            "discarded": 0, "cancelled": 0}  # fmt: skip
    if callback.args.get("batch") != want:
        return [f"callback #{callback.id} received {callback.args.get('batch')}, expected {want}"]
    return []


# -- running it --------------------------------------------------------------------------------


def demo_schema(schema: str | None) -> str:
    """The demo's schema: its own unless a schema other than the default is asked for."""
    if schema is None or schema == config.DEFAULT_SCHEMA:
        return DEMO_SCHEMA
    return config.schema(schema)


async def arun(
    database_url: str, *, schema: str | None = None, console: Console | None = None
) -> DemoReport:
    """Run the demo against `database_url` and return its report (asyncio)."""
    console = console or Console()
    schema_name = demo_schema(schema)
    started = time.monotonic()
    await asyncio.to_thread(migrate, database_url, schema=schema_name)
    runner = Runner(QUEUES, database_url=database_url, schema=schema_name, imports=[],
                    auto_migrate=False, shutdown_timeout=2.0)  # fmt: skip
    feed = _Feed(runner.node, started)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await _clear(conn, schema_name)
        workers.discard_notices.clear()
        handle = telemetry.attach(feed.on_event, FEED_EVENTS)
        with _quiet_logs():
            run_task = asyncio.create_task(runner.run(), name="shigoto-demo-runner")
            try:
                await _until_ready(runner, run_task)
                plain = await aenqueue_many(demo_jobs(time.time()), conn=conn, schema=schema_name)
                flow = await demo_workflow().aenqueue(conn=conn, schema=schema_name)
                feed.announce("⑂ workflow  ", f"{len(flow)} steps: reserve_stock → "
                              "charge_payment, pack_parcel → ship_order")  # fmt: skip
                batch = await enqueue_batch(conn, schema_name)
                feed.announce("▦ batch     ", f"#{batch.id}: {BATCH_SIZE} thumbnails, "
                              "then album_ready with the counts")  # fmt: skip
                count = len(plain) + len(flow) + BATCH_SIZE
                queues = " ".join(f"{q}={c}" for q, c in QUEUES.items())
                console.print(f"[bold]Shigoto demo[/]: {count} jobs and a batch callback in "
                              f"schema {schema_name}, queues (concurrency) {queues}",
                              highlight=False, soft_wrap=True)  # fmt: skip
                jobs = await _watch(conn, schema_name, run_task, feed, console, started)
            finally:
                await runner.stop()
                await asyncio.gather(run_task, return_exceptions=True)
                telemetry.detach(handle)
    feed.collect_notices()
    report = DemoReport(jobs, time.monotonic() - started, feed.events, list(feed.notices))
    report.problems = check(report.jobs, report.events, report.notices)
    unfinished = [j.id for j in jobs if j.state not in FINISHED_STATES]
    if unfinished:
        report.problems.setdefault("unknown", []).append(
            f"jobs {unfinished} were not finished after {DEADLINE_SECONDS:.0f} s"
        )
    return report


def run(
    database_url: str, *, schema: str | None = None, console: Console | None = None
) -> DemoReport:
    """Run the demo and return its report."""
    return asyncio.run(arun(database_url, schema=schema, console=console))


def main(database_url: str, *, schema: str | None = None, console: Console | None = None) -> int:
    """The `shigoto demo` command: 0 when every job ended as its story says, else 1."""
    console = console or Console()
    try:
        report = run(database_url, schema=schema, console=console)
    except KeyboardInterrupt:
        console.print("demo interrupted")
        return 130
    print_report(report, console, demo_schema(schema))
    return 0 if report.ok else 1


async def _clear(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    """Forget an earlier run: delete every job of the demo queues (and only those)."""
    await conn.execute(
        sql.SQL("DELETE FROM {} WHERE queue = ANY(%s)").format(
            sql.Identifier(schema, "shigoto_jobs")
        ),
        (list(QUEUES),),
    )


async def _until_ready(runner: Runner, run_task: asyncio.Task[None]) -> None:
    ready = asyncio.create_task(runner.ready.wait())
    await asyncio.wait({ready, run_task}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if ready.done():
        return
    ready.cancel()
    if run_task.done():
        run_task.result()  # raises what stopped the runner
    raise Error("the demo runner did not start within 30 s")


def _select_jobs(schema: str) -> sql.Composed:
    return sql.SQL("SELECT * FROM {} WHERE queue = ANY(%s) ORDER BY id").format(
        sql.Identifier(schema, "shigoto_jobs")
    )


async def _fetch(conn: psycopg.AsyncConnection[Any], schema: str) -> list[DemoJob]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_select_jobs(schema), (list(QUEUES),))
        return [DemoJob.from_row(r) for r in await cur.fetchall()]


def final_jobs(database_url: str, *, schema: str | None = None) -> list[DemoJob]:
    """The demo's jobs as the table holds them now: what a test asserts on after `main()`."""
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        conn.cursor(row_factory=dict_row) as cur,
    ):
        cur.execute(_select_jobs(demo_schema(schema)), (list(QUEUES),))
        return [DemoJob.from_row(r) for r in cur.fetchall()]


async def _watch(
    conn: psycopg.AsyncConnection[Any],
    schema: str,
    run_task: asyncio.Task[None],
    feed: _Feed,
    console: Console,
    started: float,
) -> list[DemoJob]:
    """Show progress until every demo job is finished (or the deadline passes)."""
    deadline = started + DEADLINE_SECONDS
    live = Live(console=console, refresh_per_second=10, transient=True)
    with live if console.is_terminal else contextlib.nullcontext():
        while True:
            jobs = await _fetch(conn, schema)
            feed.collect_notices()
            if console.is_terminal:
                live.update(_live_view(jobs, feed, time.monotonic() - started))
            else:
                for line in feed.take_new():
                    console.print(line, soft_wrap=True)
            if jobs and all(j.state in FINISHED_STATES for j in jobs):
                return jobs
            if run_task.done():
                run_task.result()
                raise Error("the demo runner stopped before the jobs were finished")
            if time.monotonic() > deadline:
                return jobs
            await asyncio.sleep(TICK)


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """Runner INFO lines would tear the live display; warnings and errors still show."""
    logger = logging.getLogger("shigoto")
    previous = logger.level
    if logger.getEffectiveLevel() < logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(previous)


def _role(meta: dict[str, Any]) -> str:
    """What a job is part of, for its feed line."""
    if "workflow" in meta:
        return " (workflow step)"
    if "batch_callback" in meta:
        return " (batch callback)"
    if meta.get("story") == "batch":
        return " (in the batch)"
    return ""


def _error(error: BaseException) -> str:
    if isinstance(error, Discard):
        return str(error)
    return f"{type(error).__name__}: {error}"


class _Feed:
    """Telemetry subscriber: counts events per job and keeps the last lines for display."""

    def __init__(self, node: str, started: float) -> None:
        self.node = node
        self.started = started
        self.events: Counter[tuple[int, str]] = Counter()
        self.lines: deque[Text] = deque(maxlen=FEED_LINES)
        self.notices: list[str] = []
        self._new: deque[Text] = deque()

    def on_event(self, event: str, measurements: dict[str, Any], metadata: dict[str, Any]) -> None:
        if metadata.get("node") != self.node:
            return  # another runner in this process (tests): not ours
        job = metadata.get("job")
        if job is not None:
            self.events[(job.id, event)] += 1
        line = self._describe(event, measurements, metadata)
        if line is not None:
            self._add(line)

    def _describe(
        self, event: str, measurements: dict[str, Any], metadata: dict[str, Any]
    ) -> Text | None:
        if event == "stager.stage":
            queues = ", ".join(metadata.get("queues", []))
            count = measurements["count"]
            return Text.assemble(("↻ due       ", "blue"), f"{count} made available on {queues}")
        job = metadata["job"]
        name = f"{job.worker.rpartition('.')[2]} #{job.id}{_role(job.meta or {})}"
        if event == "job.stop":
            took = measurements["duration"]
            return Text.assemble(("✓ completed ", "green"), name,
                                 f", attempt {job.attempt}, {took:.2f} s")  # fmt: skip
        if event == "job.exception":
            error = _error(metadata["error"])
            return Text.assemble(("✗ failed    ", "magenta"), name,
                                 f", attempt {job.attempt}: {error}")  # fmt: skip
        if event == "job.snooze":
            return Text.assemble(("⏸ snoozed   ", "blue"), name,
                                 f" for {measurements['snooze']:g} s")  # fmt: skip
        if event == "job.discard":
            return Text.assemble(("⊘ discarded ", "red"), name, f": {_error(metadata['error'])}")
        if event == "job.cancel":
            return Text.assemble(("○ cancelled ", "yellow"), name, f": {metadata['reason']}")
        return None

    def announce(self, mark: str, text: str) -> None:
        """A line for something the demo itself did (a workflow or a batch enqueued)."""
        self._add(Text.assemble((mark, "bold"), text))

    def _add(self, text: Text) -> None:
        line = Text()
        line.append(f"{time.monotonic() - self.started:5.1f}s  ", style="dim")
        line.append_text(text)
        self.lines.append(line)
        self._new.append(line)

    def collect_notices(self) -> None:
        """Pick up what `on_discard` callbacks reported since the last look."""
        fresh = workers.discard_notices[len(self.notices) :]
        for notice in fresh:
            self.notices.append(notice)
            self._add(Text.assemble(("✉ on_discard ", "red"), notice))

    def take_new(self) -> list[Text]:
        taken = list(self._new)
        self._new.clear()
        return taken


# -- rendering ---------------------------------------------------------------------------------


def counts_table(counts: dict[str, dict[str, int]], title: str) -> Table:
    """Jobs by state (rows) and queue (columns), with totals."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("state")
    for queue in counts:
        table.add_column(queue, justify="right")
    table.add_column("all", justify="right", style="bold")
    for state in JobState:
        row = [counts[q].get(state.value, 0) for q in counts]
        table.add_row(Text(state.value, style=STATE_STYLE[state]), *(_count(n) for n in row),
                      _count(sum(row)))  # fmt: skip
    return table


def _count(n: int) -> str:
    return str(n) if n else "·"


def stories_table(
    jobs: list[DemoJob], title: str, problems: dict[str, list[str]] | None = None
) -> Table:
    """One row per story: its worker, where its jobs are, the highest attempt reached."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("story", no_wrap=True)
    table.add_column("worker", no_wrap=True, overflow="ellipsis", max_width=20)
    table.add_column("jobs")
    table.add_column("attempt", justify="right")
    if problems is not None:
        table.add_column("ok", justify="center")
    order = list(JobState)
    for key, story in STORIES.items():
        group = [j for j in jobs if j.story == key]
        states = sorted(Counter(j.state for j in group).items(), key=lambda i: order.index(i[0]))
        shown = Text(", ").join(
            Text(f"{n} {s}" if len(group) > 1 else str(s), style=STATE_STYLE[s]) for s, n in states
        )
        progress = [j.progress for j in group if j.progress is not None]
        if progress and len(group) == 1:
            shown.append(f" {progress[0]}%")
        cells: list[RenderableType] = [
            story.title,
            ", ".join(dict.fromkeys(j.short_worker for j in group)),  # in enqueue order
            shown,
            str(max(j.attempt for j in group)) if group else "-",
        ]
        if problems is not None:
            ok = not problems.get(key)
            cells.append(Text("✓", style="green") if ok else Text("✗", style="bold red"))
        table.add_row(*cells)
    return table


def _live_view(jobs: list[DemoJob], feed: _Feed, elapsed: float) -> RenderableType:
    """Counts by state, a bar per job reporting progress, the latest events; fits 24 rows."""
    counts: dict[str, dict[str, int]] = {q: {} for q in QUEUES}
    for j in jobs:
        row = counts.setdefault(j.queue, {})
        row[j.state.value] = row.get(j.state.value, 0) + 1
    parts: list[RenderableType] = [counts_table(counts, "jobs by state")]
    bars = Table.grid(padding=(0, 1))
    for j in jobs:
        if j.progress is not None:
            style = STATE_STYLE[j.state]
            bar = ProgressBar(total=100, completed=j.progress, width=30, complete_style=style)
            bars.add_row(f"{j.short_worker} #{j.id}", bar, Text(f"{j.progress}%", style=style))
    if bars.row_count:
        parts.append(bars)
    events = Table.grid()
    events.add_column(no_wrap=True, overflow="ellipsis")
    for line in feed.lines:
        events.add_row(line)
    waiting = sum(1 for j in jobs if j.state not in FINISHED_STATES)
    parts += [
        Text("events", style="italic"),
        events,
        Text(f"{elapsed:.1f} s · {waiting} of {len(jobs)} jobs to finish", style="dim"),
    ]
    return Group(*parts)


def print_report(report: DemoReport, console: Console, schema: str) -> None:
    console.print(counts_table(report.counts(), "final state by queue"))
    console.print(stories_table(report.jobs, "stories", report.problems))
    for notice in report.notices:
        console.print(f"[red]on_discard[/]: {notice}", soft_wrap=True)
    if report.ok:
        console.print(f"[green]✓[/] every job ended as its story says: {len(report.jobs)} jobs "
                      f"in {report.elapsed:.1f} s")  # fmt: skip
    else:
        console.print("[bold red]✗ the demo did not go as intended:[/]")
        for story, messages in report.problems.items():
            for message in messages:
                console.print(f"  {story}: {message}")
    console.print(f"The rows stay in schema {schema}: try `shigoto status --schema {schema}`.",
                  style="dim", soft_wrap=True)  # fmt: skip
