"""`Admissions`, the execution chain's one place for flow control's say on a job: the order of
the questions, what each answer does, and that every admission that counted a job hears how
its attempt ended, whatever ended it."""

from __future__ import annotations

from typing import Any

import pytest

from shigoto.job import Job, JobState
from shigoto.runtime.admission import Admission, Admissions, Admitted
from shigoto.runtime.outcome import Completion

JOB = Job(id=7, queue="q", worker="w", args={}, state=JobState.EXECUTING, attempt=1)


class Recorder:
    """Stands where `PutBack` stands (a callable taking ids and why): records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], str]] = []

    async def __call__(self, ids: list[int], *, why: str, **_: Any) -> list[int]:
        self.calls.append((list(ids), why))
        return list(ids)


class Step:
    """An admission answering `answer`, noting when it is asked and how its job ended."""

    def __init__(self, name: str, answer: str, log: list[str]) -> None:
        self.name, self.answer, self.log = name, answer, log

    async def admit(self, job: Job) -> Admitted:
        self.log.append(f"admit {self.name}")
        if self.answer == "put_back":
            return Admitted.put_back(f"{self.name} is full")
        if self.answer == "kept":
            return Admitted.kept(f"{self.name} keeps it")

        async def done(completion: Completion | None, error: BaseException | None) -> None:
            ended = "error" if error else ("outcome" if completion else "nothing")
            self.log.append(f"done {self.name}: {ended}")

        return Admitted.run(done=done)


def _chain(log: list[str], *answers: str) -> tuple[Admissions, Recorder]:
    put_back = Recorder()
    steps = [Step(f"s{i}", answer, log) for i, answer in enumerate(answers)]
    assert all(isinstance(step, Admission) for step in steps)
    return Admissions(steps, put_back), put_back  # type: ignore[arg-type]


async def test_every_admission_is_asked_in_order_and_hears_the_outcome_innermost_first() -> None:
    log: list[str] = []
    admissions, put_back = _chain(log, "run", "run")
    done = Completion(JOB, JobState.COMPLETED)

    async def perform(_job: Job) -> Completion:
        log.append("perform")
        return done

    assert await admissions(JOB, perform) is done
    assert log == ["admit s0", "admit s1", "perform", "done s1: outcome", "done s0: outcome"]
    assert put_back.calls == []


async def test_a_put_back_stops_the_questions_and_goes_through_the_one_put_back() -> None:
    log: list[str] = []
    admissions, put_back = _chain(log, "run", "put_back", "run")

    async def perform(_job: Job) -> Completion:
        raise AssertionError("a refused job never performs")

    assert await admissions(JOB, perform) is None
    assert log == ["admit s0", "admit s1", "done s0: nothing"]
    assert put_back.calls == [([7], "s1 is full")]


async def test_a_kept_job_ends_the_chain_without_a_put_back() -> None:
    log: list[str] = []
    admissions, put_back = _chain(log, "run", "kept")

    async def perform(_job: Job) -> Completion:
        raise AssertionError("a kept job never performs")

    assert await admissions(JOB, perform) is None
    assert log == ["admit s0", "admit s1", "done s0: nothing"]
    assert put_back.calls == []


async def test_an_attempt_that_raises_still_reaches_every_done_step() -> None:
    log: list[str] = []
    admissions, _ = _chain(log, "run", "run")

    async def perform(_job: Job) -> Completion:
        raise RuntimeError("the chain below failed")

    with pytest.raises(RuntimeError, match="chain below"):
        await admissions(JOB, perform)
    assert log[-2:] == ["done s1: error", "done s0: error"]

