"""What one attempt ended as (`Completion`), and whether the database can store it.

No I/O: the executor builds completions, the completer writes them, and the checks here
keep a value jsonb would refuse out of a batch it would otherwise sink whole.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from shigoto.errors import MAX_ERROR_BYTES, cut_text, error_message, error_traceback
from shigoto.job import Job, JobState

log = logging.getLogger("shigoto.executor")

#: Most bytes of a stored traceback: its end, where the failing frame and the error are.
MAX_TRACEBACK_CHARS = 20_000


@dataclass(frozen=True, slots=True)
class Completion:
    """The outcome of one attempt, as the completer writes it."""

    job: Job
    state: JobState
    delay: float | None = None
    result_json: str | None = None
    error: dict[str, Any] | None = None
    snooze: bool = False
    #: The last progress the perform reported: written with the outcome, so it can never be
    #: lost to a progress write that lands after the attempt has ended.
    progress: int | None = None
    #: What runs once the outcome is written (the worker's `on_discard`): never before, so a
    #: callback cannot outlive an outcome that was lost, and never inside the job's task, so a
    #: shutdown cancelling unfinished performs cannot cut it short and put the job back.
    after: Callable[[], Awaitable[None]] | None = field(default=None, compare=False)


def error_entry(
    attempt: int, error: BaseException, *, with_traceback: bool = True
) -> dict[str, Any]:
    """One element of `errors`; the database adds `at` with its own clock. The message and
    the traceback are cut (`shigoto.errors.MAX_ERROR_BYTES`, `MAX_TRACEBACK_CHARS`) before
    anything else copies them: a job raising a 30 MB message stores and logs 64 KiB."""
    tb = error_traceback(error, MAX_TRACEBACK_CHARS) if with_traceback else ""
    return {"attempt": attempt, "error": _clean(error_message(error)), "traceback": _clean(tb)}


def bounded_reason(text: str) -> str:
    """A reason written as an error entry (an operator's cancel, a refused write), cut and
    made storable like an exception's message."""
    return _clean(cut_text(text, MAX_ERROR_BYTES))


def _clean(text: str) -> str:
    """jsonb rejects NUL and lone surrogates; errors must always be recordable."""
    return text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")


#: Largest result stored, in bytes of JSON: the same bound as args and meta (a CHECK
#: constraint enforces it in the table).
MAX_RESULT_BYTES = 16 * 1024 * 1024
#: A `\u0000` escape that is not itself an escaped backslash followed by "u0000".
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def storable_problem(text: str) -> str | None:
    """Why jsonb would refuse this JSON text (ASCII-escaped, as `json.dumps` writes it), or
    None. A refused value would make the database reject its whole acknowledgement batch."""
    if len(text) > MAX_RESULT_BYTES:
        return f"it is {len(text)} bytes as JSON, over the limit of {MAX_RESULT_BYTES}"
    if _NUL_ESCAPE.search(text):
        return "it contains a NUL character (\\u0000), which PostgreSQL's jsonb rejects"
    if "\\ud" in text or "\\uD" in text:
        try:
            json.dumps(json.loads(text), ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return "it contains a lone surrogate, which PostgreSQL's jsonb rejects"
    return None


def _result_json(value: Any, job: Job) -> tuple[str | None, str | None]:
    """The result as stored, and why it cannot be (None if it can)."""
    if value is None:
        return None, None
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        log.warning(
            "result of job %s (%s) is not JSON-serialisable and was not stored: %s",
            job.id, job.worker, exc, extra={"job_id": job.id, "worker": job.worker},
        )  # fmt: skip
        return None, None
    problem = storable_problem(text)
    if problem is not None:
        log.warning("result of job %s (%s) not storable: %s", job.id, job.worker, problem,
                    extra=_fields(job))  # fmt: skip
        return None, f"result not storable: {problem}"
    return text, None


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A jsonb value of a claimed row that the runner could not decode (nested deeper than
    Python's JSON decoder goes). It stands in for the value so the claim that fetched it
    succeeds; the job it belongs to is then discarded alone, and its co-claimed jobs run."""

    error: str


def undecodable_problem(job: Job) -> str | None:
    """Why `job` cannot run because a column of its row did not decode, or None."""
    for column in ("args", "meta", "errors"):
        value = getattr(job, column)
        if isinstance(value, Undecodable):
            return f"{column} not decodable: {value.error}"
    return None


def unstorable(completion: Completion, reason: str) -> Completion:
    """The completion as written when the database refused it: same outcome, no result, and
    one error entry saying why (it replaces the original entry, which may be what was
    refused). The perform itself ended; re-running it would repeat its side effects."""
    entry = {"attempt": completion.job.attempt, "error": bounded_reason(reason), "traceback": ""}
    return replace(completion, result_json=None, error=entry)




def _fields(job: Job) -> dict[str, Any]:
    return {"job_id": job.id, "worker": job.worker, "queue": job.queue}


__all__ = [
    "MAX_RESULT_BYTES", "MAX_TRACEBACK_CHARS", "Completion", "Undecodable", "bounded_reason",
    "error_entry",
    "storable_problem", "undecodable_problem", "unstorable",
]  # fmt: skip
