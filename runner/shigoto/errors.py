"""One exception tree for everything Shigoto raises, plus the outcomes a worker can signal.

`Snooze`, `Cancel` and `Discard` are outcomes, not failures: a worker raises (or returns) them to
steer its job, so they deliberately do not derive from `Error`.
"""

from __future__ import annotations

import traceback
from datetime import UTC, datetime, timedelta
from typing import Any

#: Most bytes (UTF-8) of an attempt's error message, and of its traceback, that are stored in
#: `errors` or written to a log line; the rest is cut, with a note of the cut. One failing job
#: must not bloat its row (every attempt adds an entry, read back on every claim), nor the
#: runner's memory or its log, however big the exception it raised.
MAX_ERROR_BYTES = 64 * 1024
#: Most bytes of one line of a stored traceback (an exception's own line quotes its message,
#: which is stored whole, up to `MAX_ERROR_BYTES`, in the entry's `error`).
MAX_TRACEBACK_LINE_BYTES = 4 * 1024


def cut_note(total: int) -> str:
    """What ends a cut text: visible, and saying how big the whole was."""
    return f"… [cut: {total:,} bytes in all]"


def utf8_size(text: str) -> int:
    """Bytes of `text` as UTF-8 (lone surrogates counted as their 3 bytes). An ASCII string
    is counted without encoding it: a 30 MB message is not copied to be measured."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def cut_text(text: str, limit: int = MAX_ERROR_BYTES, *, prefix: str = "") -> str:
    """`prefix + text`, at most `limit` bytes of UTF-8: whole if it fits, else its head, cut
    on a character boundary, and `cut_note`. Only the head is ever copied (`prefix + text`
    is never built whole), so cutting a huge message costs no second copy of it."""
    if len(prefix) + len(text) * 4 <= limit:  # fits whatever its characters: no counting
        return prefix + text
    total = utf8_size(prefix) + utf8_size(text)
    if total <= limit:
        return prefix + text
    note = cut_note(total)
    budget = max(limit - utf8_size(prefix) - utf8_size(note), 0)
    return prefix + _utf8_head(text[:budget], budget) + note


def _utf8_head(text: str, size: int) -> str:
    """The longest head of `text` within `size` bytes of UTF-8: a character split by the cut
    is left out whole (lone surrogates, which jsonb callers escape later, are kept)."""
    raw = text.encode("utf-8", "surrogatepass")[:size]
    for trim in range(4):  # a UTF-8 character is at most 4 bytes
        try:
            return raw[: len(raw) - trim].decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            continue
    return raw.decode("utf-8", "ignore")  # pragma: no cover - unreachable for valid input


def error_message(error: BaseException, limit: int = MAX_ERROR_BYTES) -> str:
    """`"Type: message"` (or the type alone when the message is empty), at most `limit`
    bytes: how an error is stored in `errors` and named in log lines."""
    name = type(error).__name__
    try:
        text = str(error)
    except Exception:  # a broken __str__ must not lose the attempt's outcome
        text = "<unprintable message>"
    return cut_text(text, limit, prefix=f"{name}: ") if text else name


def error_traceback(error: BaseException, limit: int = MAX_ERROR_BYTES) -> str:
    """The formatted traceback of `error` (chained exceptions included), its last `limit`
    bytes at most, the most recent frames and the error itself being what explains it."""
    return bounded_traceback(traceback.TracebackException.from_exception(error), limit)


def bounded_traceback(exc: traceback.TracebackException, limit: int = MAX_ERROR_BYTES) -> str:
    """`exc` formatted, its last `limit` bytes at most. Each line is cut to
    `MAX_TRACEBACK_LINE_BYTES` as it is formatted, so an exception quoting megabytes is never
    held formatted whole."""
    lines = [_cut_line(line) for chunk in exc.format()
             for line in chunk.splitlines(keepends=True)]  # fmt: skip
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        size += utf8_size(line)
        if size > limit:
            kept.append("… [earlier frames cut]\n")
            break
        kept.append(line)
    return "".join(reversed(kept))


def _cut_line(line: str) -> str:
    """One line of a traceback, cut, keeping its line end."""
    cut = cut_text(line, MAX_TRACEBACK_LINE_BYTES)
    return cut + "\n" if line.endswith("\n") and not cut.endswith("\n") else cut


class Error(Exception):
    """Base of every error Shigoto raises."""


class ValidationError(Error, ValueError):
    """Input was rejected before anything was written; `field` names what to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ConfigurationError(Error):
    """A setting is missing or malformed; the message says which env var or flag to set."""


class MigrationError(Error):
    """The database schema could not be brought up to date, or is newer than this code."""


class UnknownWorkerError(Error):
    """A job names a worker this process cannot resolve."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"unknown worker {name}: not registered in this runner; add its module to "
            "--import (SHIGOTO_IMPORT), or allow its package with --worker-prefix "
            "(SHIGOTO_WORKER_PREFIXES), or check the name the job was enqueued with"
        )
        self.name = name


class JobTimeoutError(Error, TimeoutError):
    """A perform ran past its timeout; recorded as the attempt's error."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"job timed out after {timeout:g} s")
        self.timeout = timeout


class Outcome(Exception):
    """Base of the non-failure outcomes a perform can raise or return."""


class Snooze(Outcome):
    """Run the job again after `seconds`, or at `until` (an aware datetime), without consuming
    an attempt. `Snooze(30)`, `Snooze(timedelta(minutes=5))`, `Snooze(until=tomorrow_9am)`.

    An absolute time is kept as given and turned into a delay only when the runner records
    the outcome (`seconds`), so a snooze raised long before its perform returned still lands
    on `until`; a time already past makes the job available again at once. The delay is
    measured on the runner's clock and added to the database's, so clock skew between the two
    shifts it (seed counterpart: Gaffer's `{schedule, Timestamp}`)."""

    def __init__(
        self, seconds: float | timedelta | datetime | None = None, *, until: datetime | None = None
    ) -> None:
        if isinstance(seconds, datetime) and until is None:
            seconds, until = None, seconds  # Snooze(some_datetime): the absolute form
        if (seconds is None) == (until is None):
            raise ValidationError("seconds", "give a delay (Snooze(30)) or an absolute "
                                             "time (Snooze(until=aware_datetime)), not both "
                                             "or neither")  # fmt: skip
        self.until = _snooze_until(until) if until is not None else None
        self._delay = _snooze_delay(seconds) if seconds is not None else 0.0
        super().__init__(f"snoozed until {self.until.isoformat()}" if self.until is not None
                         else f"snoozed for {self._delay:g} s")  # fmt: skip

    @property
    def seconds(self) -> float:
        """Seconds from now until the job may run again (never negative)."""
        if self.until is None:
            return self._delay
        return max(0.0, (self.until - datetime.now(UTC)).total_seconds())


def _snooze_delay(seconds: Any) -> float:
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
        raise ValidationError("seconds", f"snooze needs a non-negative number of seconds or a "
                                         f"timedelta, got {seconds!r}")  # fmt: skip
    return float(seconds)


def _snooze_until(until: Any) -> datetime:
    if not isinstance(until, datetime):
        raise ValidationError("until", f"must be a datetime, got {type(until).__name__}")
    if until.tzinfo is None or until.utcoffset() is None:
        raise ValidationError("until", f"{until.isoformat()} is naive; give a timezone "
                                       "(datetime(..., tzinfo=timezone.utc)), since the "
                                       "database stores UTC")  # fmt: skip
    return until


class Cancel(Outcome):
    """Stop the job for good, as cancelled, recording `reason`."""

    def __init__(self, reason: str = "cancelled by worker") -> None:
        super().__init__(reason)
        self.reason = reason


class Discard(Outcome):
    """Stop the job for good, as discarded, recording `reason`; `on_discard` still runs."""

    def __init__(self, reason: str = "discarded by worker") -> None:
        super().__init__(reason)
        self.reason = reason
