"""The execution chain leaves a layer out of a job's chain when the layer says it has nothing
to do for that job (`applies`), and keeps every layer that has no such say (issue 26)."""

from __future__ import annotations

import asyncio

from shigoto.job import Job, JobState
from shigoto.runtime.admission import Admissions
from shigoto.runtime.chain import Next, chain
from shigoto.runtime.outcome import Completion


def job(job_id: int, depends_on: list[int] | None = None) -> Job:
    return Job(id=job_id, queue="q", worker="w", args={}, state=JobState.EXECUTING,
               attempt=1, depends_on=depends_on)  # fmt: skip


class Layer:
    """A middleware noting the jobs it saw; gated on parents when `gated`."""

    def __init__(self, name: str, seen: list[str], gated: bool) -> None:
        self.name, self.seen = name, seen
        if gated:
            self.applies = lambda j: bool(j.depends_on)

    async def __call__(self, j: Job, call_next: Next) -> Completion | None:
        self.seen.append(f"{self.name} {j.id}")
        return await call_next(j)


def run(handler: Next, j: Job) -> None:
    asyncio.run(handler(j))


def test_a_layer_that_does_not_apply_is_left_out_and_the_others_keep_their_order() -> None:
    seen: list[str] = []
    ended: list[int] = []

    async def terminal(j: Job) -> Completion | None:
        ended.append(j.id)
        return None

    handler = chain([Layer("outer", seen, gated=False), Layer("parents", seen, gated=True),
                     Layer("inner", seen, gated=False)], terminal)  # fmt: skip
    run(handler, job(1))
    run(handler, job(2, depends_on=[1]))
    run(handler, job(3))
    assert seen == ["outer 1", "inner 1", "outer 2", "parents 2", "inner 2", "outer 3", "inner 3"]
    assert ended == [1, 2, 3]


class Gate:
    """An admission whose `applies` answers `answer`."""

    name = "gate"

    def __init__(self, answer: bool | None) -> None:
        if answer is not None:
            self.applies = lambda _j: answer

    async def admit(self, j: Job) -> None:  # never reached in these tests
        raise AssertionError


async def _put_back(ids: list[int], *, why: str) -> list[int]:
    return ids


def test_admissions_apply_when_any_admission_has_a_say_or_one_cannot_tell() -> None:
    assert not Admissions([Gate(False), Gate(False)], _put_back).applies(job(1))
    assert Admissions([Gate(False), Gate(True)], _put_back).applies(job(1))
    # An admission without `applies` is always asked, as before gates existed.
    assert Admissions([Gate(False), Gate(None)], _put_back).applies(job(1))
