"""One exception tree for everything Shigoto raises, plus the outcomes a worker can signal.

`Snooze`, `Cancel` and `Discard` are outcomes, not failures: a worker raises (or returns) them to
steer its job, so they deliberately do not derive from `Error`.
"""

from __future__ import annotations


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
    """Run the job again after `seconds`, without consuming an attempt."""

    def __init__(self, seconds: float) -> None:
        if seconds < 0:
            raise ValidationError("seconds", f"snooze needs a non-negative delay, got {seconds}")
        super().__init__(f"snoozed for {seconds:g} s")
        self.seconds = float(seconds)


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
