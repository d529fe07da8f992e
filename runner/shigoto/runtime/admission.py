"""Admission: whether a claimed job may start now, asked of every flow-control feature.

A claim already left out what the features knew at claim time (their claim fragments), but a
job can still arrive where it must not start: a bulkhead filled between the claim and the
start, a worker's global limit was reached by another runner, a rate limit's turn is later, a
breaker opened. So before each perform the runner asks each `Admission`, in order, and acts
on the answer in one place (`Admissions`, a step of the execution chain):

- `Admitted.run(done=...)`: go on; `done(completion, error)` runs once the attempt has ended
  (its outcome, or the exception that ended it), innermost first, whatever happens after;
- `Admitted.put_back(why)`: the job goes back unperformed through `runtime.put_back`, the one
  way to do it, and no later admission is asked;
- `Admitted.kept(why)`: the admission has dealt with the job itself and the chain ends: the
  fence holds it for the liveness prover, flow control deferred it to its reserved turn, a
  global limit handed it back inside the transaction that counted it.

An admission that admitted a job before a later one refused it sees `done(None, None)`, so a
slot it counted or a breaker probe it granted is given back. The runner's admissions, in
order: the bulkheads (no query), global limits, flow control, load shedding's start sample.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from shigoto.job import Job
from shigoto.runtime.chain import Next
from shigoto.runtime.outcome import Completion
from shigoto.runtime.put_back import PutBack

#: What runs once an admitted attempt has ended: its completion (None when the chain ended
#: without one) and the exception that ended it (None when it returned).
Done = Callable[[Completion | None, BaseException | None], Awaitable[None]]


class Verdict(enum.Enum):
    RUN = "run"
    PUT_BACK = "put_back"
    KEPT = "kept"


@dataclass(frozen=True, slots=True)
class Admitted:
    """One admission's answer for one job (build it with `run`, `put_back` or `kept`)."""

    verdict: Verdict
    why: str = ""
    done: Done | None = None

    @classmethod
    def run(cls, done: Done | None = None) -> Admitted:
        return cls(Verdict.RUN, done=done)

    @classmethod
    def put_back(cls, why: str) -> Admitted:
        return cls(Verdict.PUT_BACK, why=why)

    @classmethod
    def kept(cls, why: str) -> Admitted:
        return cls(Verdict.KEPT, why=why)


#: The answer of an admission with nothing to say about a job.
RUN = Admitted.run()


@runtime_checkable
class Admission(Protocol):
    """A flow-control feature's say on each claimed job before it starts."""

    name: str

    async def admit(self, job: Job) -> Admitted: ...


def _always(_job: Job) -> bool:
    return True


class Admissions:
    """The execution chain's step that asks every admission, in order (see the module)."""

    def __init__(self, admissions: Sequence[Admission], put_back: PutBack) -> None:
        self.admissions = tuple(admissions)
        self.put_back = put_back
        #: Each admission's `applies(job)`, if it has one: whether `admit` could answer
        #: anything but a plain RUN for the job (a limit, a cap, a breaker or the fence).
        self._gates = tuple(getattr(a, "applies", _always) for a in self.admissions)

    def applies(self, job: Job) -> bool:
        """Whether any admission has a say on `job`; if none has, the chain leaves this
        step out for it (`chain.chain`)."""
        return any(gate(job) for gate in self._gates)

    async def __call__(self, job: Job, call_next: Next) -> Completion | None:
        dones: list[Done] = []
        for admission in self.admissions:
            try:
                answer = await admission.admit(job)
            except BaseException as exc:
                await _finish(dones, None, exc)
                raise
            if answer.done is not None:
                dones.append(answer.done)
            if answer.verdict is Verdict.RUN:
                continue
            if dones:
                await _finish(dones, None, None)
            if answer.verdict is Verdict.PUT_BACK:
                await self.put_back([job.id], why=answer.why)
            return None
        try:
            completion = await call_next(job)
        except BaseException as exc:
            if dones:
                await _finish(dones, None, exc)
            raise
        if dones:
            await _finish(dones, completion, None)
        return completion


async def _finish(
    dones: list[Done], completion: Completion | None, error: BaseException | None
) -> None:
    """Run the `done` steps innermost first. After an attempt that raised (a cancel among
    others) each is shielded, so the cancel cannot also cut short the bookkeeping of its slots
    and probes; otherwise they run inline, as the middlewares' own code did, with no task of
    their own per job."""
    for done in reversed(dones):
        if error is None:
            await done(completion, None)
        else:
            await asyncio.shield(done(completion, error))


__all__ = ["RUN", "Admission", "Admissions", "Admitted", "Done", "Verdict"]
