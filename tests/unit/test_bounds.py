"""The cuts that bound what one job can make Shigoto store or log (issue 24, point 4)."""

from __future__ import annotations

import logging

import psycopg
import pytest

from shigoto import jobspec, logs
from shigoto.db.insert_refusals import Refusals
from shigoto.errors import (
    MAX_ERROR_BYTES,
    ValidationError,
    cut_text,
    error_message,
    error_traceback,
)  # fmt: skip
from shigoto.runtime.job_log import describe
from shigoto.runtime.outcome import MAX_TRACEBACK_CHARS, error_entry

HUGE = 30 * 1024 * 1024


def _raised(message: str) -> RuntimeError:
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        return exc


def test_a_short_text_is_kept_whole() -> None:
    assert cut_text("short") == "short"
    assert error_message(_raised("boom")) == "RuntimeError: boom"
    assert error_message(RuntimeError()) == "RuntimeError"


def test_a_huge_message_is_cut_with_a_note_of_its_size() -> None:
    message = error_message(_raised("x" * HUGE))
    assert len(message.encode("utf-8")) <= MAX_ERROR_BYTES
    assert message.startswith("RuntimeError: xxx")
    assert message.endswith(f"… [cut: {HUGE + len('RuntimeError: '):,} bytes in all]")
    assert describe(_raised("x" * HUGE)) == message  # the log line names it the same way


@pytest.mark.parametrize("char", ["é", "😀", "\udcff"])
def test_a_cut_never_splits_a_character(char: str) -> None:
    cut = cut_text(char * 100_000, 1000)
    assert len(cut.encode("utf-8", "surrogatepass")) <= 1000
    head = cut.split("…")[0]
    assert set(head) == {char}


def test_an_error_entry_is_bounded_in_message_and_traceback() -> None:
    entry = error_entry(3, _raised("y" * HUGE))
    assert entry["attempt"] == 3
    assert len(entry["error"].encode("utf-8")) <= MAX_ERROR_BYTES
    assert len(entry["traceback"].encode("utf-8")) <= MAX_TRACEBACK_CHARS
    assert "RuntimeError: yyy" in entry["traceback"] and "[cut: " in entry["traceback"]
    assert "test_bounds.py" in entry["traceback"], "the failing frame is kept"


def test_a_deep_traceback_keeps_its_end() -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("at the bottom")
        deep(n - 1)

    try:
        deep(500)
    except ValueError as exc:
        text = error_traceback(exc, 300)
    assert len(text.encode()) <= 330
    assert text.startswith("… [earlier frames cut]")
    assert text.rstrip().endswith("ValueError: at the bottom")


def test_a_log_record_is_bounded_even_when_a_component_quotes_megabytes() -> None:
    record = logging.LogRecord("shigoto", logging.ERROR, __file__, 1, "failed: %s", ("z" * HUGE,),
                               (RuntimeError, _raised("w" * HUGE), None))  # fmt: skip
    logs.RedactingFilter().filter(record)
    assert len(record.getMessage()) <= logs.MAX_RECORD_CHARS + 100
    assert "[cut: " in record.getMessage()
    assert record.exc_text is not None and len(record.exc_text) <= logs.MAX_RECORD_CHARS + 100


def test_tags_are_bounded_in_count_and_length() -> None:
    with pytest.raises(ValidationError, match=f"at most {jobspec.MAX_TAGS} tags") as caught:
        jobspec.build("app.w", {}, tags=["t"] * (jobspec.MAX_TAGS + 1))
    assert caught.value.field == "tags"
    with pytest.raises(ValidationError, match=f"at most {jobspec.MAX_TAG_CHARS} characters") as c:
        jobspec.build("app.w", {}, tags=["t" * 9216])
    assert c.value.field == "tags" and len(str(c.value)) < 200, "the refusal quotes no 9 KB"
    with pytest.raises(ValidationError, match="got 300000"):
        jobspec.build("app.w", {}, tags=[str(i) for i in range(300_000)])
    tags = ["t" * jobspec.MAX_TAG_CHARS] * jobspec.MAX_TAGS
    assert jobspec.build("app.w", {}, tags=tags).tags == tags


class _IndexRowTooBig(psycopg.errors.ProgramLimitExceeded):
    """A ProgramLimitExceeded as the tags index words it (diag is read-only on the real one)."""

    class diag:
        message_primary = ("index row size 9232 exceeds maximum 8152 for index "
                           '"shigoto_jobs_tagged_idx"... tags')  # fmt: skip


def test_a_refusal_of_the_tags_index_blames_tags_not_args() -> None:
    with pytest.raises(ValidationError) as caught, Refusals():
        raise _IndexRowTooBig()
    assert caught.value.field == "tags"
