"""PostgreSQL's refusals of an insert, turned into the client's errors.

Bad input that only the database can see is reported like every other input problem, as a
`ValidationError` naming the field, or as the `EncryptedQueueError` the insert path retries:
its size limits, the workflow trigger's unknown parents (the sync path checks parents in a
hook before writing; an async insert learns it from the trigger, with nothing written either
way), and migration 0018's refusal of plaintext args for an encrypted queue.
"""

from __future__ import annotations

from typing import Any

import psycopg

from shigoto.db.insert_encryption import ENCRYPTED_QUEUE_CHECK, EncryptedQueueError
from shigoto.errors import ValidationError

#: Largest args/meta the client accepts; quoted in the error PostgreSQL's own limits turn into.
#: The same figure as `jobspec.MAX_ARGS_BYTES` (jobspec sits above this layer).
MAX_BYTES = 16 * 1024 * 1024

#: The same figure as `jobspec.MAX_TAG_CHARS`.
MAX_TAG_CHARS = 255

#: How migration 0009's trigger words an unknown parent.
UNKNOWN_PARENT = "job depends on a job that does not exist"


def _too_large(message: str) -> ValidationError:
    """PostgreSQL's refusal of a value over one of its own limits, blaming the field at
    fault: an index row too big comes from the tags index (args and meta are not indexed),
    anything else from the args or meta."""
    if "index row" in message and "tags" in message:
        return ValidationError(
            "tags", f"a tag is too long for the tags index ({message}); tags may be at most "
            f"{MAX_TAG_CHARS} characters each",
        )  # fmt: skip
    return ValidationError(
        "args", f"the job is too large for PostgreSQL ({message}); args and meta may be at "
        f"most {MAX_BYTES} bytes of JSON each",
    )  # fmt: skip


class Refusals:
    """Translates the refusals above as they leave its block. Both a sync and an async
    context manager: the writing conversation is written once, async, and its sync twin is
    generated (`async with` becomes `with`)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        if (
            isinstance(exc, psycopg.errors.CheckViolation)
            and exc.diag.constraint_name == ENCRYPTED_QUEUE_CHECK
        ):
            raise EncryptedQueueError(exc.diag.message_detail or "?", retried=False) from None
        if isinstance(exc, psycopg.errors.ForeignKeyViolation) and (
            exc.diag.message_primary or ""
        ).startswith(UNKNOWN_PARENT):
            raise ValidationError(
                "depends_on",
                f"{exc.diag.message_primary}; give the ids of jobs that exist (a parent that "
                "was pruned to the archive counts as finished)",
            ) from None
        if isinstance(exc, psycopg.errors.ProgramLimitExceeded):
            raise _too_large(exc.diag.message_primary or "") from None

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(kind, exc, tb)
