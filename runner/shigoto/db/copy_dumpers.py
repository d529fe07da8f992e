"""How a bulk insert's rows travel: a binary COPY with fixed column types.

A batch is written with `COPY ... FROM STDIN (FORMAT BINARY)`: with the types fixed up front
psycopg skips the per-value dumper lookup and text escaping, and the server parses the rows
more cheaply. The args and meta are JSON text `jobspec` already validated and serialised;
they go out as jsonb's binary form (a version byte, then that text), so nothing is serialised
a second time.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.string import StrBinaryDumper

#: Column types of `insert_statements.copy_jobs`, in order.
COPY_TYPES = (
    "int8", "text", "text", "jsonb", "text", "int4", "int4", "float8", "timestamptz",
    "timestamptz", "text[]", "jsonb", "int8[]", "text", "int8", "text",
)  # fmt: skip

#: jsonb's binary format is a version byte, then the text: the COPY rows carry the JSON
#: text that `jobspec` validated and serialised with this byte in front
#: (`insert_plan.rows_of`), so a plain str dumper sends it as it is.
JSONB_VERSION = "\x01"
EMPTY_JSONB = JSONB_VERSION + "{}"


def _c_str_dumper() -> type | None:
    """psycopg's compiled binary str dumper, when psycopg runs on its C implementation: it
    encodes a value in a fraction of a Python dumper's time (a third of a bulk insert's
    client CPU per job went to the Python one). Private in psycopg; absent, or changed, the
    Python dumper below does the same."""
    if psycopg.pq.__impl__ not in ("binary", "c"):
        return None
    try:
        from psycopg_binary import _psycopg as compiled  # type: ignore[import-not-found]
    except ImportError:
        try:
            from psycopg_c import _psycopg as compiled  # type: ignore[import-not-found,no-redef]
        except ImportError:
            return None
    base = getattr(compiled, "_StrBinaryDumper", None)
    if not isinstance(base, type):
        return None
    try:
        return type("_JsonbTextDumper", (base,), {"oid": psycopg.postgres.types["jsonb"].oid})
    except TypeError:
        return None


class _PyJsonbTextDumper(StrBinaryDumper):
    """The same in Python: the text as UTF-8, already prefixed with jsonb's version byte."""

    oid = psycopg.postgres.types["jsonb"].oid


_JsonTextDumper: type = _c_str_dumper() or _PyJsonbTextDumper


def prepare_copy(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """Make `cur` send jsonb columns as the prefixed text the rows carry."""
    cur.adapters.register_dumper(None, _JsonTextDumper)  # by oid only: COPY's set_types
