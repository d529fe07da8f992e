"""Forwarding: the rule for a queue's `forward` setting, checked before it is written.

A queue's `forward` maps a final state to another queue: the failures (`discarded`,
`cancelled`) for dead-letter queues, and `completed` (migration 0029) for audit trails and
simple pipelines, where the copy carries the original's result in
`meta["forwarded_from"]["result"]` (seed counterpart: Gaffer 0.7's per-terminal-state
`forward`). The forwarding itself is not here: the forwarding step (`shigoto_forward_copy`,
migration 0011, the second step at a final transition: see `relations.steps`) inserts the copy
in the transaction
that moves a job into the state, whichever code path moves it (the completer, `cancel_by`, the
rescuer, a workflow cascade), so a runner killed at any point leaves both rows or neither, and
runners, the CLI and the operator all read the one setting in `shigoto_queues`.

The copy has the original's worker and args, the target queue, attempt 0, state `available`, and
`meta["forwarded_from"] = {"id", "queue", "state", "errors", "result"}`. Loops stop by rule:
`meta["forward_chain"]` lists the queues a job has been forwarded out of, and a job is never
forwarded into one of them, so a chain of dead-letter queues works while a cycle ends after
one round. A completed job is forwarded only when its transaction noted that its queue
forwards `completed` (0029), so a plain completion calls no function: a change of the setting
reaches transactions that start after it committed.

The database checks the same rule (a CHECK constraint of 0011), so a hand-written row cannot
break it either; this module exists to reject bad input with a ValidationError that names the
field and says how to fix it, before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shigoto import config
from shigoto.errors import ValidationError
from shigoto.job import JobState

#: The states whose jobs may be forwarded: every final state. A completed job hands on its
#: result (an audit trail, the next stage of a pipeline); the failures hand on their errors.
FORWARDABLE_STATES: tuple[str, ...] = (
    JobState.DISCARDED.value, JobState.CANCELLED.value, JobState.COMPLETED.value)  # fmt: skip

#: meta key of a forwarded job: where it came from.
FORWARDED_FROM = "forwarded_from"
#: meta key of a forwarded job: every queue it has been forwarded out of, oldest first.
FORWARD_CHAIN = "forward_chain"


def normalise(queue: str, forward: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The `forward` setting of `queue` as stored: the states that are forwarded and their
    target queues, or None when nothing is (`None`, `{}`, or every target None).

    Bad input raises ValidationError naming the field (`forward` or `forward.<state>`): an
    unknown state, a target that is not a queue name, or the queue itself as its own target.
    """
    if forward is None:
        return None
    if not isinstance(forward, Mapping):
        raise ValidationError(
            "forward",
            f"must be a mapping of state to queue such as {{'discarded': '{queue}-dead'}}, or "
            f"None to stop forwarding; got {type(forward).__name__}",
        )
    out: dict[str, str] = {}
    for state, target in forward.items():
        if state not in FORWARDABLE_STATES:
            raise ValidationError(
                f"forward.{state}",
                f"only the final states {', '.join(FORWARDABLE_STATES)} can be forwarded; "
                f"{state!r} is not one of them",
            )
        if target is None:
            continue  # this state is not forwarded
        problem = config.queue_name_problem(target)
        if problem:
            raise ValidationError(f"forward.{state}", f"the target queue {problem}")
        if target == queue:
            raise ValidationError(
                f"forward.{state}",
                f"{queue!r} cannot forward to itself; name another queue, such as "
                f"'{queue}-dead', or None to keep {state} jobs where they are",
            )
        out[str(state)] = target
    return out or None
