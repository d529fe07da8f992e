"""What one attempt ended as (`Completion`), and whether the database can store it.

No I/O: the executor builds completions, the completer writes them, and the checks here
keep a value jsonb would refuse out of a batch it would otherwise sink whole.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sysconfig
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from shigoto.errors import MAX_ERROR_BYTES, bounded_traceback, cut_text, error_message
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
    tb = job_traceback(error, MAX_TRACEBACK_CHARS) if with_traceback else ""
    return {"attempt": attempt, "error": _clean(error_message(error)), "traceback": _clean(tb)}


#: Where Shigoto's own modules live, and the standard library's (its thread pool and asyncio
#: frames sit between the executor and a sync worker).
_SHIGOTO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                      for k in ("stdlib", "platstdlib")})  # fmt: skip


def _ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_SHIGOTO_DIR)


def _machinery(filename: str) -> bool:
    """A frame of Shigoto or of the standard library (not of a package installed beside it)."""
    path = os.path.abspath(filename)
    return _ours(path) or (path.startswith(_STDLIB_DIRS) and "-packages" not in path)


class _Trimmed(traceback.StackSummary):
    """A stack whose first `omitted` frames (Shigoto's) were dropped; formats a line saying
    so where they were, so a reader knows the trace was cut and by how much."""

    omitted = 0

    def format(self, *args: Any, **kwargs: Any) -> list[str]:
        return [f"  … {self.omitted} frames of shigoto omitted\n", *super().format(*args, **kwargs)]


def _trim(exc: traceback.TracebackException, seen: set[int]) -> None:
    """Drop the leading run of frames of Shigoto's machinery (the executor, its thread
    dispatch, the middleware chain) from `exc` and every exception chained to it, when a
    frame of the user's code follows and the run holds at least one Shigoto frame: the user
    reads their own frame first. Frames below the first user frame are kept whatever they
    are (a user's middleware calls back into Shigoto's chain)."""
    if id(exc) in seen:
        return
    seen.add(id(exc))
    frames = list(exc.stack)
    lead = 0
    while lead < len(frames) and _machinery(frames[lead].filename):
        lead += 1
    if 0 < lead < len(frames) and any(_ours(f.filename) for f in frames[:lead]):
        trimmed = _Trimmed(frames[lead:])
        trimmed.omitted = lead
        exc.stack = trimmed
    for other in (exc.__cause__, exc.__context__, *(getattr(exc, "exceptions", None) or ())):
        if other is not None:
            _trim(other, seen)


def job_traceback(error: BaseException, limit: int = MAX_TRACEBACK_CHARS) -> str:
    """The traceback stored with a failed attempt: `shigoto.errors.bounded_traceback` (its
    last `limit` bytes, each line cut), starting at the user's frame (`_trim`): the seven frames of
    executor, thread pool and worker call above it told nothing and pushed the user's frame
    below the fold of the dashboard's job page (issue 25)."""
    exc = traceback.TracebackException.from_exception(error)
    _trim(exc, set())
    return bounded_traceback(exc, limit)


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
    "error_entry", "job_traceback",
    "storable_problem", "undecodable_problem", "unstorable",
]  # fmt: skip
