"""The `shigoto` command: a thin shell over the Python API.

Every flag has an env var (shown in --help); flags win. Env vars are read after parsing, so a
malformed one is a one-line error naming it, and never breaks `--help`. Local commands fall
back to the embedded PostgreSQL when no SHIGOTO_DATABASE_URL is set.

Every failure the user can fix ends as `shigoto COMMAND: what and how to fix` on stderr with
exit status 2, never a traceback; database messages are shown with passwords redacted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg

from shigoto import config, logs
from shigoto.cli import dashboard, jobs, queues, rekey
from shigoto.db import embedded
from shigoto.db.roles import ROLES
from shigoto.errors import ConfigurationError, Error, ValidationError
from shigoto.flow.codel import DEFAULT_INTERVAL as SHED_INTERVAL
from shigoto.runtime import event_loop
from shigoto.runtime.rescuer import STUCK_AFTER
from shigoto.runtime.worker_callbacks import CALLBACK_TIMEOUT

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DEFAULT_HEALTH_HOST = "0.0.0.0"


# -- values from flags and env vars ---------------------------------------------------------


def _number(text: str, convert: Callable[[str], Any], what: str) -> Any:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


def _seconds(text: str) -> float:
    value = _number(text, float, "a number of seconds")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return float(value)


def _age(text: str) -> float:
    value = _number(text, float, "a number of seconds")
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be zero or more seconds, got {text!r}")
    return float(value)


def _port(text: str) -> int:
    value = _number(text, int, "a port number")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be from 0 to 65535, got {value}")
    return int(value)


def _count(text: str) -> int:
    value = _number(text, int, "a whole number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return int(value)


def _slots(text: str) -> int:
    value = _number(text, int, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return int(value)


def _log_level(text: str) -> str:
    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"must be one of {', '.join(LOG_LEVELS)}, got {text!r}"
        )
    return text.lower()


def _log_format(text: str) -> str:
    if text not in ("text", "json"):
        raise argparse.ArgumentTypeError(f"must be text or json, got {text!r}")
    return text


def _flag(text: str) -> bool:
    return text.strip().lower() not in ("", "0", "false", "no", "off")


#: Settings that come from a flag or, when the flag is absent, from an env var, else a default.
_FROM_ENV: dict[str, tuple[str, Callable[[str], Any], Any]] = {
    "log_level": ("SHIGOTO_LOG_LEVEL", _log_level, "info"),
    "log_format": ("SHIGOTO_LOG_FORMAT", _log_format, "text"),
    "poll_interval": ("SHIGOTO_POLL_INTERVAL", _seconds, 1.0),
    "shutdown_timeout": ("SHIGOTO_SHUTDOWN_TIMEOUT", _seconds, 15.0),
    "heartbeat_interval": ("SHIGOTO_HEARTBEAT_INTERVAL", _seconds, 30.0),
    "rescue_after": ("SHIGOTO_RESCUE_AFTER", _seconds, None),
    "health_port": ("SHIGOTO_HEALTH_PORT", _port, None),
    "health_host": ("SHIGOTO_HEALTH_HOST", str, DEFAULT_HEALTH_HOST),
    "prune_after": ("SHIGOTO_PRUNE_AFTER", _age, None),
    "archive_retention": ("SHIGOTO_ARCHIVE_RETENTION", _age, None),
    "no_migrate": ("SHIGOTO_NO_MIGRATE", _flag, False),
    "otel": ("SHIGOTO_OTEL", _flag, False),
    "max_stuck_threads": ("SHIGOTO_MAX_STUCK_THREADS", _count, None),
    "callback_timeout": ("SHIGOTO_CALLBACK_TIMEOUT", _seconds, CALLBACK_TIMEOUT),
    "stuck_after": ("SHIGOTO_STUCK_AFTER", _seconds, STUCK_AFTER),
    "capacity": (config.ENV_CAPACITY, _slots, None),
    "shed_target": (config.ENV_SHED_TARGET, _seconds, None),
    "shed_interval": (config.ENV_SHED_INTERVAL, _seconds, SHED_INTERVAL),
    "max_connections": (config.ENV_MAX_CONNECTIONS, _count, None),
    "pooler": (config.ENV_POOLER, str, None),
    "direct_database_url": (config.ENV_DIRECT_DATABASE_URL, str, None),
}


def _resolve_env(args: argparse.Namespace) -> None:
    for dest, (env, convert, default) in _FROM_ENV.items():
        if dest not in vars(args) or getattr(args, dest) is not None:
            continue  # not this command's setting, or given as a flag
        raw = os.environ.get(env, "")
        if not raw.strip():
            setattr(args, dest, default)
            continue
        try:
            setattr(args, dest, convert(raw))
        except argparse.ArgumentTypeError as exc:
            raise ConfigurationError(f"{env}: {exc}") from None


def _env_help(env: str, text: str = "") -> str:
    return f"{text} [{env}]".strip()


# -- database URL, redaction ----------------------------------------------------------------


def redact(text: str, url: str | None = None) -> str:
    """`text` with any password in it masked (see `shigoto.logs.redact`)."""
    return logs.redact(text, url)


def _database_url(args: argparse.Namespace) -> str:
    if args.database_url:
        from psycopg.conninfo import conninfo_to_dict

        logs.remember_secret(args.database_url)  # masked in every later message and log line

        try:
            conninfo_to_dict(args.database_url)
        except psycopg.ProgrammingError as exc:
            raise ConfigurationError(
                f"--database-url / {config.ENV_DATABASE_URL} is not a libpq URL or conninfo "
                f"string ({redact(str(exc).strip(), args.database_url)}); "
                "e.g. postgresql://user@host:5432/dbname"
            ) from None
        return str(args.database_url)
    from shigoto.db.migrate import migrate

    url = embedded.start()
    print(f"no {config.ENV_DATABASE_URL} set: using the embedded PostgreSQL at {url} "
          "(data in .shigoto/; `shigoto embedded url` prints it)", file=sys.stderr)  # fmt: skip
    os.environ[config.ENV_DATABASE_URL] = url
    args.database_url = url
    migrate(url, schema=args.schema)  # a private dev database: keep it current for the user
    return url


#: Python field names as the CLI spells them, so an error names the flag to fix.
_FLAGS = {
    "ids": "--id", "queue": "--queue", "worker": "--worker", "tag": "--tag", "state": "--state",
    "args": "--args", "priority": "--priority", "max_attempts": "--max-attempts",
    "schedule_in": "--schedule-in", "tags": "--tag", "prune_after": "--prune-after",
    "archive_retention": "--archive-retention",
}  # fmt: skip


@contextlib.contextmanager
def _flags_in_errors() -> Iterator[None]:
    try:
        yield
    except ValidationError as exc:
        if exc.field == "filter":
            raise ValidationError(
                "filters", "give at least one of --id, --queue, --worker, --tag, --state (to act "
                "on every job of a state, pass --state explicitly)",
            ) from None  # fmt: skip
        raise ValidationError(_FLAGS.get(exc.field, exc.field), exc.message) from None


# -- the parser -----------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--database-url",
        default=os.environ.get(config.ENV_DATABASE_URL),
        help="libpq URL [SHIGOTO_DATABASE_URL]; default: embedded PostgreSQL",
    )
    p.add_argument("--schema", default=os.environ.get(config.ENV_SCHEMA, config.DEFAULT_SCHEMA),
                   help="schema of the tables [SHIGOTO_SCHEMA] (default: public)")  # fmt: skip


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", type=int, action="append", dest="ids", help="job id (repeatable)")
    p.add_argument("--queue")
    p.add_argument("--worker", help="full name, or its last part (send_welcome)")
    p.add_argument("--tag")
    p.add_argument("--state")
    p.add_argument("--dry-run", action="store_true", help="list the ids, change nothing")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shigoto")
    except PackageNotFoundError:
        from shigoto import __version__

        return __version__


def _add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="claim and execute jobs until SIGTERM/SIGINT")
    _common(p)
    p.add_argument("--queue", action="append", dest="queues",
                   help="NAME=CONCURRENCY, repeatable [SHIGOTO_QUEUES] (default: default=10)")
    p.add_argument("--import", action="append", dest="imports",
                   help="module defining workers, repeatable [SHIGOTO_IMPORT]; the current "
                   "directory is on the import path")
    p.add_argument("--worker-prefix", action="append", dest="worker_prefixes",
                   metavar="PACKAGE", help="package whose workers may be imported when a job "
                   "first names them, repeatable [SHIGOTO_WORKER_PREFIXES]; otherwise only "
                   "--import'ed workers run")  # fmt: skip
    p.add_argument("--max-stuck-threads", type=_count, help=_env_help(
        "SHIGOTO_MAX_STUCK_THREADS", "sync performs past their timeout that may still hold a "
        "thread before the runner drains and exits non-zero (default: total concurrency)"))
    p.add_argument("--callback-timeout", type=_seconds, help=_env_help(
        "SHIGOTO_CALLBACK_TIMEOUT", "seconds a worker's backoff or on_discard may take "
        f"(default {CALLBACK_TIMEOUT:g})"))
    p.add_argument("--stuck-after", type=_seconds, help=_env_help(
        "SHIGOTO_STUCK_AFTER", "seconds after which a job without a timeout of its own that is "
        f"still executing is rescued, even from a live runner (default {STUCK_AFTER:g})"))
    p.add_argument("--health-port", type=_port, help=_env_help(
        "SHIGOTO_HEALTH_PORT", "serve /healthz, /readyz, /metrics on this port (0: any free)"))
    p.add_argument("--health-host", help=_env_help(
        "SHIGOTO_HEALTH_HOST", f"address the health server listens on (default "
        f"{DEFAULT_HEALTH_HOST}; 127.0.0.1 for this machine only)"))
    p.add_argument("--poll-interval", type=_seconds,
                   help=_env_help("SHIGOTO_POLL_INTERVAL", "(default 1)"))
    p.add_argument("--shutdown-timeout", type=_seconds, help=_env_help(
        "SHIGOTO_SHUTDOWN_TIMEOUT", "seconds in-flight jobs get on SIGTERM (default 15)"))
    p.add_argument("--no-migrate", action="store_true", default=None,
                   help=_env_help("SHIGOTO_NO_MIGRATE", "do not apply migrations at start"))
    p.add_argument("--otel", action="store_true", default=None, help=_env_help(
        "SHIGOTO_OTEL", "trace executions and enqueues with OpenTelemetry (shigoto[otel]; "
        "spans go to the global tracer provider, e.g. set up by opentelemetry-instrument)"))
    p.add_argument("--global-concurrency", action="append", metavar="NAME=N",
                   help="at most N jobs of queue NAME execute across all runners; stored in the "
                   "database for every runner, repeatable [SHIGOTO_GLOBAL_CONCURRENCY]")
    p.add_argument("--heartbeat-interval", type=_seconds, help=_env_help(
        "SHIGOTO_HEARTBEAT_INTERVAL", "seconds between node heartbeats (default 30)"))
    p.add_argument("--rescue-after", type=_seconds, help=_env_help(
        "SHIGOTO_RESCUE_AFTER",
        "seconds of silence after which a node's jobs are rescued (default 2 x heartbeat + 30)"))
    _flow_flags(p)
    _connection_flags(p)
    _retention(p)
    p.add_argument("--event-loop", choices=event_loop.CHOICES, default="auto",
                   help="auto (default): uvloop when it is installed (pip install "
                   "'shigoto[uvloop]'; the runner image has it), which costs less CPU per job; "
                   "asyncio: the standard library's loop")
    p.add_argument("--cron", nargs="?", const="", default=os.environ.get("SHIGOTO_CRON"),
                   metavar="FILE", help="run the cron scheduler here (leader-elected); FILE, a "
                   "JSON list of schedules, is stored first [SHIGOTO_CRON]")  # fmt: skip


def _connection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-connections", type=_count, metavar="N", help=_env_help(
        config.ENV_MAX_CONNECTIONS, "at most N database connections for this runner, all "
        "together: its pool, LISTEN, liveness lock, elector and its performs' enqueues; refused "
        "at start below the least it can work with (docs/connections.md; default: no cap)"))
    p.add_argument("--pooler", choices=config.POOLERS, help=_env_help(
        config.ENV_POOLER, "transaction: the database URL goes through PgBouncer in "
        "transaction mode; no prepared statements on it, and LISTEN, the liveness lock and "
        "migrations use --direct-database-url (default none)"))
    p.add_argument("--direct-database-url", metavar="URL", help=_env_help(
        config.ENV_DIRECT_DATABASE_URL, "the server itself, past the pooler, for what needs a "
        "session; without it a runner behind a transaction pooler polls and counts by its "
        "lease (docs/connections.md)"))


def _flow_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--capacity", type=_slots, metavar="N", help=_env_help(
        config.ENV_CAPACITY, "at most N jobs at once across all queues of this runner, shared "
        "by queue weight (set_queue(name, weight=W)); idle queues lend theirs; each --queue "
        "concurrency stays that queue's ceiling (default: no runner-wide cap)"))
    p.add_argument("--shed-target", type=_seconds, metavar="SECONDS", help=_env_help(
        config.ENV_SHED_TARGET, "load shedding: when even the shortest claim-to-start latency "
        "over --shed-interval stays above this, stop claiming the lowest priorities first; they "
        "stay available for other runners (default: off)"))
    p.add_argument("--shed-interval", type=_seconds, metavar="SECONDS", help=_env_help(
        config.ENV_SHED_INTERVAL, "how long latency must stay above --shed-target before "
        f"shedding a band, and below it before taking one back (default {SHED_INTERVAL:g})"))


def _retention(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prune-after", type=_age, metavar="SECONDS", help=_env_help(
        "SHIGOTO_PRUNE_AFTER", "finished jobs move to the archive this long after finishing "
        "(default 14 days)"))
    p.add_argument("--archive-retention", type=_age, metavar="SECONDS", help=_env_help(
        "SHIGOTO_ARCHIVE_RETENTION", "archived jobs are deleted after this long (default 30 days)"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shigoto", description="PostgreSQL job queue")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--log-level", type=_log_level,
                        help=_env_help("SHIGOTO_LOG_LEVEL", ", ".join(LOG_LEVELS)))
    parser.add_argument("--log-format", type=_log_format,
                        help=_env_help("SHIGOTO_LOG_FORMAT", "text or json"))
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("migrate", help="apply pending migrations (idempotent, concurrency-safe)")
    _common(p)
    p.add_argument("--sql", action="store_true",
                   help="print what would run, step by step, and run nothing")  # fmt: skip
    _add_run(sub)

    p = sub.add_parser("enqueue", help="enqueue one job by worker name")
    _common(p)
    p.add_argument("worker")
    p.add_argument("--args", default="{}", help="JSON object")
    p.add_argument("--queue")
    p.add_argument("--priority", type=int)
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--schedule-in", type=float, help="seconds from now")
    p.add_argument("--tag", action="append", dest="tags")

    p = sub.add_parser("status", help="counts by queue and state, paused queues, limits, nodes")
    _common(p)
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true")
    shown.add_argument("--watch", nargs="?", const=2.0, type=_watch_seconds, metavar="SECONDS",
                       help="redraw every SECONDS (default 2) until Ctrl-C")  # fmt: skip
    p.add_argument("--wide", action="store_true",
                   help="every column, full headers (the default fits 100 columns)")  # fmt: skip

    retry_help = ("make matching jobs available again: discarded and cancelled ones, or those "
                  "of --state (completed ones ask first); never a job waiting on its parents")
    for name, about in (("retry", retry_help), ("cancel", "cancel jobs matching the filters")):
        p = sub.add_parser(name, help=about, description=about)
        _common(p)
        _filters(p)
        if name == "retry":
            # No env var: a standing yes would defeat the question.
            p.add_argument("-y", "--yes", action="store_true",
                           help="re-run completed jobs (--state completed) without asking")

    for name, verb in (("pause", "stop runners claiming"), ("resume", "let runners claim")):
        p = sub.add_parser(name, help=f"{verb} jobs of a queue (every runner, within seconds)")
        _common(p)
        p.add_argument("queue_name", metavar="QUEUE")
        p.add_argument("--create", action="store_true", help=(
            "a queue nothing names yet (before its first job); without it a name no job, "
            "setting, runner or cron entry knows is refused"))  # fmt: skip

    p = sub.add_parser("prune", help="archive old finished jobs and delete old archived ones now")
    _common(p)
    _retention(p)

    p = sub.add_parser("embedded", help="the embedded PostgreSQL: url, start, stop")
    p.add_argument("action", choices=["url", "start", "stop"],
                   help="url: print its URL if running; start: keep it running for other tools "
                   "until stop; stop: stop it")  # fmt: skip
    p.add_argument("--data-dir", default=str(embedded.DEFAULT_DIR), help="default .shigoto")

    p = sub.add_parser("bench", help="measure enqueue, processing and pickup latency")
    _common(p)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--finished", type=int, default=0, help="re-measure with N finished rows")
    p.add_argument("--runners", metavar="N[,N...]",
                   help="instead: processing by N real runner processes, e.g. 1,2,4")
    p.add_argument("--global-limit", type=int, metavar="L",
                   help="with --runners: also measure a queue with a global limit of L")
    p.add_argument("--bulk-returning", choices=("ids", "jobs"), default="ids",
                   help="what the bulk phase asks enqueue_many for (ids: no Job per row)")
    # Not imported from shigoto.cli.bench_features: importing it registers the bench's own
    # workers, and then every `shigoto run` would think it had some.
    p.add_argument("--features", action="store_true",
                   help="also measure a fair queue, a rate-limited worker and workflows")
    p.add_argument("--bench-database", default="shigoto_bench", metavar="NAME",
                   help="the scratch database to create and drop (default shigoto_bench)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("demo", help="the whole loop on an embedded PostgreSQL, no setup")
    _common(p)
    rekey.add_parsers(sub, _common)
    jobs.add_parsers(sub, _common)
    queues.add_parsers(sub, _common)
    dashboard.add_parser(sub, _common)
    _add_roles(sub)
    return parser


def _add_roles(sub: Any) -> None:
    """`shigoto roles --sql`: needs no database, so no --database-url (docs/database-roles.md)."""
    p = sub.add_parser("roles", help="print the grants of the migrator, runner and enqueuer roles")
    p.add_argument("--sql", action="store_true", help="print the GRANT statements")
    p.add_argument("--schema", default=os.environ.get(config.ENV_SCHEMA, config.DEFAULT_SCHEMA),
                   help="schema of the tables [SHIGOTO_SCHEMA] (default: public)")  # fmt: skip
    p.add_argument("--role", choices=ROLES, default=os.environ.get("SHIGOTO_ROLE") or None,
                   help="only this role's grants [SHIGOTO_ROLE] (default: all three)")  # fmt: skip
    p.add_argument("--name", default=os.environ.get("SHIGOTO_ROLE_NAME") or None,
                   help="the role's name, with --role [SHIGOTO_ROLE_NAME] (default: "
                        "shigoto_<role>)")  # fmt: skip
    p.add_argument("--owner", default=os.environ.get("SHIGOTO_ROLE_OWNER") or None,
                   help="the migrator's name, for the runner's default privileges "
                        "[SHIGOTO_ROLE_OWNER] (default: shigoto_migrator)")  # fmt: skip


# -- main -----------------------------------------------------------------------------------


def _put_cwd_on_path() -> None:
    """`shigoto run --import myapp.workers` from the project folder finds `myapp`, as with
    Celery and RQ: a console script's sys.path starts with its bin directory, not the cwd."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)


def main(argv: Sequence[str] | None = None) -> int:
    _put_cwd_on_path()
    args = build_parser().parse_args(argv)
    try:
        _resolve_env(args)
        logs.configure(args.log_level, args.log_format)
        return int(_COMMANDS[args.command](args) or 0)
    except KeyboardInterrupt:
        return 130
    except Error as exc:
        return _fail(args, str(exc))
    except psycopg.errors.UndefinedTable as exc:
        return _fail(args, f"{exc.diag.message_primary}; the schema is not set up: run "
                     "`shigoto migrate` against this database first")  # fmt: skip
    except psycopg.errors.InsufficientPrivilege as exc:
        return _fail(args, f"{exc.diag.message_primary}: the database role lacks a grant "
                     "(docs/getting-started.md, 'Migrating role and runtime role')")  # fmt: skip
    except psycopg.OperationalError as exc:
        return _fail(args, f"cannot reach the database: {exc}")
    except psycopg.Error as exc:
        return _fail(args, f"database error ({type(exc).__name__}): {exc}")


def _fail(args: argparse.Namespace, message: str) -> int:
    url = getattr(args, "database_url", None)
    print(f"shigoto {args.command}: {redact(message.strip(), url)}", file=sys.stderr)
    return 2


# -- commands -------------------------------------------------------------------------------


def _migrate(args: argparse.Namespace) -> int:
    from shigoto.db.migrate import migrate, plan

    if args.sql:
        print(plan(_database_url(args), schema=args.schema), end="")
        return 0
    applied = migrate(_database_url(args), schema=args.schema)
    print(f"applied migrations {applied}" if applied else "schema is up to date")
    return 0


def _roles(args: argparse.Namespace) -> int:
    from shigoto.db.roles import script

    if not args.sql:
        raise ConfigurationError("roles only prints grants for now: pass --sql")
    if args.role is not None and args.role not in ROLES:
        raise ConfigurationError(f"SHIGOTO_ROLE: must be one of {', '.join(ROLES)}, "
                                 f"got {args.role!r}")  # fmt: skip
    if args.name is not None and args.role is None:
        raise ConfigurationError("--name needs --role: it names one role")
    chosen = [args.role] if args.role else list(ROLES)
    print(script(chosen, schema=args.schema, name=args.name, owner=args.owner), end="")
    return 0


def _runner(args: argparse.Namespace) -> Any:
    from shigoto.cron.definitions import load_file
    from shigoto.cron.storage import check_worker
    from shigoto.runtime.runner import Runner, check_startup

    queues = (config.parse_queues(",".join(args.queues)) if args.queues
              else config.queues_from_env())  # fmt: skip
    imports = args.imports if args.imports else config.imports_from_env()
    # Before the database is touched (no embedded start, no connection, no migration): a bad
    # --import or a runner that could run nothing stops with one line (issue 25).
    origin = "--import" if args.imports else config.ENV_IMPORT
    check_startup(imports, queues, config.worker_prefixes(args.worker_prefixes), origin)
    schedules = load_file(args.cron) if args.cron else []
    for i, entry in enumerate(schedules):
        check_worker(entry.worker, field=f"--cron[{i}].worker ({args.cron}, {entry.name!r})")
    limits_text = ",".join(args.global_concurrency or []) or os.environ.get(
        "SHIGOTO_GLOBAL_CONCURRENCY"
    )
    limits = config.parse_queues(limits_text) if limits_text else {}
    retention = {k: getattr(args, k) for k in ("prune_after", "archive_retention")
                 if getattr(args, k) is not None}  # fmt: skip
    # The enqueues of this process's performs read them too: a flag reaches them as well.
    for env, value in ((config.ENV_POOLER, args.pooler),
                       (config.ENV_DIRECT_DATABASE_URL, args.direct_database_url)):  # fmt: skip
        if value:
            os.environ[env] = value
    return Runner(
        queues, database_url=_database_url(args), schema=args.schema, imports=imports,
        auto_migrate=not args.no_migrate, poll_interval=args.poll_interval,
        shutdown_timeout=args.shutdown_timeout, cron=args.cron is not None,
        cron_schedules=schedules, global_concurrency=limits,
        heartbeat_interval=args.heartbeat_interval, rescue_after=args.rescue_after,
        worker_prefixes=config.worker_prefixes(args.worker_prefixes),
        max_stuck_threads=args.max_stuck_threads, callback_timeout=args.callback_timeout,
        stuck_after=args.stuck_after, capacity=args.capacity, shed_target=args.shed_target,
        shed_interval=args.shed_interval, freeze_heap=True, **retention,
        max_connections=args.max_connections, pooler=args.pooler,
        direct_database_url=args.direct_database_url,
    )  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    # A SIGTERM while the runner starts (Kubernetes scaling down a pod that just started)
    # must stop it cleanly too: noted here, acted on once the loop's handlers are installed.
    early: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda received, _frame: early.append(received))
    if args.otel:
        from shigoto import otel  # ConfigurationError naming the extra when it is missing

        otel.instrument()
    runner = _runner(args)
    if args.no_migrate:
        # Migrating connects first and fails at once with the server's reason; without it,
        # the runner's pool would retry for 30 s and then say only that it timed out.
        from shigoto.db import database

        psycopg.connect(runner.url, **database.connect_kwargs(runner.url)).close()
    event_loop.run(_serve(runner, args, early), args.event_loop)
    _exit_even_if_threads_linger()
    return 0


async def _serve(runner: Any, args: argparse.Namespace, early: list[int]) -> None:
    _handle_signals(runner, early)
    health_server = await _start_health(runner, args)
    try:
        await runner.run()
    finally:
        if health_server is not None:
            await health_server.stop()


def _handle_signals(runner: Any, early: list[int]) -> None:
    """The first SIGTERM/SIGINT stops gracefully; a second one exits at once. `early`: the
    signals received before the loop could handle them."""
    loop = asyncio.get_running_loop()
    received: list[int] = []
    stopping: list[asyncio.Future[None]] = []

    def on_signal(sig: int) -> None:
        received.append(sig)
        if len(received) == 1:
            if sig == signal.SIGINT:
                print("shigoto run: stopping after the running jobs (press Ctrl-C again to "
                      "exit at once)", file=sys.stderr)  # fmt: skip
            stopping.append(asyncio.ensure_future(runner.stop()))
            return
        print("shigoto run: exiting at once; jobs still running stay executing until a "
              "runner rescues them", file=sys.stderr)  # fmt: skip
        with contextlib.suppress(Exception):
            embedded.release()  # no atexit hooks after os._exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    for sig in early:
        on_signal(sig)


async def _start_health(runner: Any, args: argparse.Namespace) -> Any:
    if args.health_port is None:
        return None
    from shigoto.ops.probes import HealthServer

    server = HealthServer(runner, port=args.health_port, host=args.health_host)
    try:
        await server.start()
    except OSError as exc:
        raise ConfigurationError(
            f"--health-port {args.health_port}: cannot listen on "
            f"{args.health_host}:{args.health_port} ({exc.strerror or exc}); pick a free port, "
            "or 0 for any"
        ) from None
    return server


def _exit_even_if_threads_linger() -> None:
    """A sync perform past its deadline cannot be interrupted; don't let it block the exit."""
    busy = [
        t for t in threading.enumerate() if t.name.startswith("shigoto-worker") and t.is_alive()
    ]
    if busy:
        sys.stdout.flush()
        sys.stderr.flush()
        with contextlib.suppress(Exception):
            embedded.release()
        os._exit(0)


def _enqueue(args: argparse.Namespace) -> int:
    from shigoto.client.enqueuing import enqueue

    try:
        job_args = json.loads(args.args)
    except json.JSONDecodeError as exc:
        raise ValidationError("--args", f"is not valid JSON ({exc})") from None
    with _flags_in_errors():
        job = enqueue(
            args.worker, job_args, queue=args.queue, priority=args.priority,
            max_attempts=args.max_attempts, schedule_in=args.schedule_in, tags=args.tags,
            database_url=_database_url(args), schema=args.schema,
        )  # fmt: skip
    print(json.dumps({"id": job.id, "queue": job.queue, "state": str(job.state)}))
    return 0


def _watch_seconds(text: str) -> float:
    """`--watch`'s interval: a positive number of seconds (0 would redraw in a busy loop)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"needs a positive number of seconds, got {text}")
    return seconds


def _status(args: argparse.Namespace) -> int:
    from shigoto.cli.status_view import render_status, watch_status
    from shigoto.ops.operations import status

    url = _database_url(args)
    if args.watch is not None:
        return watch_status(lambda: status(database_url=url, schema=args.schema), args.watch,
                            wide=args.wide)  # fmt: skip
    st = status(database_url=url, schema=args.schema)
    if args.json:
        print(json.dumps(st.as_dict(), indent=2, default=str))
        return 0
    render_status(st, wide=args.wide)
    return 0


def _bulk(action: str) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        from shigoto.ops import operations

        fn = operations.retry_by if action == "retry" else operations.cancel_by
        filters = {"ids": args.ids, "queue": args.queue, "worker": args.worker,
                   "tag": args.tag, "state": args.state}  # fmt: skip
        where = {"database_url": _database_url(args), "schema": args.schema}
        with _flags_in_errors():
            if action == "retry" and args.state == "completed" and not args.dry_run:
                _confirm_rerun(args, filters, where)
            ids = fn(**filters, dry_run=args.dry_run, **where)
            if not ids:
                why = operations.explain_no_match(action, **filters, **where)
                print(f"shigoto {action}: nothing to {action}: {why}", file=sys.stderr)
        out: dict[str, Any] = {action: ids}
        if args.dry_run:
            out["dry_run"] = True
        print(json.dumps(out))
        return 0

    return command


def _confirm_rerun(
    args: argparse.Namespace, filters: dict[str, Any], where: dict[str, Any]
) -> None:
    """Completed jobs did their work once (an email sent, a card charged): running them again
    must be meant. Counted by a dry run first, so the question names what would happen; asked
    on stderr, so stdout stays the JSON a script reads. With no terminal to ask (a script, a
    pipe) and no --yes, nothing is written."""
    if args.yes:
        return
    from shigoto.ops.operations import retry_by

    count = len(retry_by(**filters, dry_run=True, **where))
    if not count:
        return
    if not sys.stdin.isatty():
        raise ConfigurationError(
            f"--state completed would re-run {count} completed jobs and there is no terminal "
            "to ask: add --yes (-y) to confirm (or --dry-run to list them); nothing was retried"
        )
    print(f"re-run {count} completed jobs? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if answer.strip().lower() not in ("y", "yes"):
        raise ConfigurationError("not confirmed; nothing was retried")


def _pause(paused: bool) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        from shigoto.ops.queues import set_paused

        with _flags_in_errors():
            set_paused(args.queue_name, paused, create=args.create,
                       database_url=_database_url(args), schema=args.schema)  # fmt: skip
        print(json.dumps({"queue": args.queue_name, "paused": paused}))
        return 0

    return command


def _prune(args: argparse.Namespace) -> int:
    from shigoto.ops.operations import prune

    with _flags_in_errors():
        done = prune(prune_after=args.prune_after, archive_retention=args.archive_retention,
                     database_url=_database_url(args), schema=args.schema)  # fmt: skip
    print(json.dumps(done))
    return 0


def _embedded(args: argparse.Namespace) -> int:
    from pathlib import Path

    data_dir = Path(args.data_dir)
    if args.action == "start":
        print(embedded.start(data_dir, keep=True))
        return 0
    if args.action == "stop":
        was = embedded.stop(data_dir)
        print("stopped" if was else "not running", file=sys.stderr)
        return 0
    url = embedded.running_url(data_dir)
    if url is None:
        raise ConfigurationError(
            f"the embedded PostgreSQL in {embedded.pgdata_path(data_dir)} is not running; "
            "`shigoto embedded start` keeps one running"
        )
    print(url)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from shigoto.cli.bench import main as bench_main

    return bench_main(args, _database_url(args))


def _demo(args: argparse.Namespace) -> int:
    from shigoto.cli.demo import main as demo_main

    return demo_main(_database_url(args), schema=args.schema)


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "migrate": _migrate,
    "roles": _roles,
    "run": _run,
    "enqueue": _enqueue,
    "status": _status,
    "retry": _bulk("retry"),
    "cancel": _bulk("cancel"),
    "pause": _pause(True),
    "resume": _pause(False),
    "prune": _prune,
    "embedded": _embedded,
    "bench": _bench,
    "demo": _demo,
    **rekey.COMMANDS,
    **jobs.commands(_database_url),
    **queues.commands(_database_url),
    **dashboard.commands(_database_url),
}

