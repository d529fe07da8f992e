"""`shigoto rekey` and `shigoto keys`: key rotation from the command line (docs/encryption.md).

`rekey` re-seals every envelope of an older key under the newest key of
`SHIGOTO_ENCRYPTION_KEYS`, in batches of one transaction each (`shigoto.encryption.rekey`):
safe to interrupt, and the next run continues. Exit status: 0 when no row names an older key,
3 when rows remain (executing, locked by a runner, or sealed with a key the ring lacks), so a
script can loop: `until shigoto rekey; do sleep 30; done`; 2 for a configuration error.

`keys generate` prints a new key; `keys list` prints the key ids of the configured ring,
newest first (never a key).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import psycopg

from shigoto import config
from shigoto.encryption import ENV_VAR, KeyRing, generate_key, keys_from_env
from shigoto.encryption.rekey import DEFAULT_BATCH_SIZE, TableCounts, rekey, stale_counts
from shigoto.errors import ConfigurationError

#: Exit status when rows still name an older key after the run.
EXIT_REMAINING = 3
ENV_BATCH_SIZE = "SHIGOTO_REKEY_BATCH_SIZE"
ENV_MAX_BATCHES = "SHIGOTO_REKEY_MAX_BATCHES"


def add_parsers(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add `rekey` and `keys` to the `shigoto` parser; `common` adds --database-url and
    --schema."""
    p = sub.add_parser("rekey", help="re-encrypt stored args and results under the newest key")
    common(p)
    p.add_argument("--batch-size", type=int,
                   help=f"rows per transaction [{ENV_BATCH_SIZE}] (default "
                        f"{DEFAULT_BATCH_SIZE})")  # fmt: skip
    p.add_argument(
        "--max-batches",
        type=int,
        help=f"stop after N batches; the next run continues [{ENV_MAX_BATCHES}]",
    )
    p.add_argument("--dry-run", action="store_true", help="count what would be re-encrypted")
    p.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    p = sub.add_parser("keys", help="encryption keys: generate one, list the configured ids")
    p.add_argument(
        "action",
        choices=["generate", "list"],
        help=f"generate: print a new key; list: the key ids of {ENV_VAR}",
    )


def _whole(flag: str, env: str, given: int | None, default: int | None) -> int | None:
    """A positive whole number from the flag, else the env var, else the default."""
    value: Any = given
    if value is None:
        raw = os.environ.get(env, "").strip()
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ConfigurationError(f"{env} must be a whole number, got {raw!r}") from None
    if value < 1:
        raise ConfigurationError(f"{flag} / {env} must be at least 1, got {value}")
    return int(value)


def _ring() -> KeyRing:
    ring = keys_from_env()
    if ring is None:
        raise ConfigurationError(
            f"{ENV_VAR} is not set: rekey needs the new key first and every older key after "
            "it (comma-separated base64, newest first)"
        )
    return ring


def _url(args: argparse.Namespace) -> str:
    if not args.database_url:
        raise ConfigurationError(
            f"no database: give --database-url or set {config.ENV_DATABASE_URL}"
        )
    return str(args.database_url)


def _progress(counts: TableCounts) -> None:
    print(f"  {counts.table}: {counts.rows} rows re-encrypted ({counts.values} values), "
          f"{counts.failed} failed", file=sys.stderr)  # fmt: skip


def run_rekey(args: argparse.Namespace) -> int:
    batch_size = _whole("--batch-size", ENV_BATCH_SIZE, args.batch_size, DEFAULT_BATCH_SIZE)
    max_batches = _whole("--max-batches", ENV_MAX_BATCHES, args.max_batches, None)
    ring = _ring()
    with psycopg.connect(_url(args), autocommit=True) as conn:
        if args.dry_run:
            return _report_dry(stale_counts(conn, ring, args.schema), ring, args.json)
        print(f"re-encrypting under key id {ring.newest.kid}", file=sys.stderr)
        result = rekey(conn, ring, schema=args.schema, batch_size=batch_size or 1,
                       max_batches=max_batches,
                       on_batch=None if args.json else _progress)  # fmt: skip
    if args.json:
        print(json.dumps({**asdict(result), "complete": result.complete}, indent=2))
    else:
        for t in result.tables:
            print(
                f"{t.table}: {t.rows} rows re-encrypted ({t.values} values), {t.failed} "
                f"failed, {t.remaining} remaining ({t.remaining_executing} executing)"
            )
        for failure in result.failures:
            print(f"failed: {failure.table} job {failure.id}: {failure.error}")
        print("complete" if result.complete else
              f"{result.remaining} rows remain: run shigoto rekey again")  # fmt: skip
    return 0 if result.complete else EXIT_REMAINING


def _report_dry(tables: list[TableCounts], ring: KeyRing, as_json: bool) -> int:
    remaining = sum(t.remaining for t in tables)
    if as_json:
        print(json.dumps({"kid": ring.newest.kid, "tables": [asdict(t) for t in tables],
                          "complete": remaining == 0}, indent=2))  # fmt: skip
    else:
        for t in tables:
            print(
                f"{t.table}: {t.remaining} rows to re-encrypt under {ring.newest.kid} "
                f"({t.remaining_executing} executing)"
            )
    return 0 if remaining == 0 else EXIT_REMAINING


def run_keys(args: argparse.Namespace) -> int:
    if args.action == "generate":
        print(generate_key())
        return 0
    for kid in _ring().kids:
        print(kid)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"rekey": run_rekey, "keys": run_keys}
