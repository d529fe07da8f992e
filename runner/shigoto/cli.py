"""The `shigoto` command: a thin shell over the Python API.

Every flag has an env var (shown in --help); flags win. Local commands fall back to the
embedded PostgreSQL when no SHIGOTO_DATABASE_URL is set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

import psycopg

from shigoto import config, embedded, logs
from shigoto.errors import Error


def _env(name: str, default: Any = None) -> Any:
    return os.environ.get(name, default)


def _database_url(args: argparse.Namespace) -> str:
    if args.database_url:
        return args.database_url
    from shigoto.migrate import migrate

    url = embedded.start()
    print("no SHIGOTO_DATABASE_URL set: using the embedded PostgreSQL in .shigoto/",
          file=sys.stderr)  # fmt: skip
    os.environ[config.ENV_DATABASE_URL] = url
    migrate(url, schema=args.schema)  # a private dev database: keep it current for the user
    return url


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--database-url",
        default=_env(config.ENV_DATABASE_URL),
        help="libpq URL [SHIGOTO_DATABASE_URL]; default: embedded PostgreSQL",
    )
    p.add_argument("--schema", default=_env(config.ENV_SCHEMA, config.DEFAULT_SCHEMA),
                   help="schema of the tables [SHIGOTO_SCHEMA] (default: public)")  # fmt: skip


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", type=int, action="append", dest="ids", help="job id (repeatable)")
    p.add_argument("--queue")
    p.add_argument("--worker")
    p.add_argument("--tag")
    p.add_argument("--state")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shigoto", description="PostgreSQL job queue")
    parser.add_argument(
        "--log-level",
        default=_env("SHIGOTO_LOG_LEVEL", "info"),
        help="[SHIGOTO_LOG_LEVEL] debug, info, warning, error",
    )
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=_env("SHIGOTO_LOG_FORMAT", "text"),
        help="[SHIGOTO_LOG_FORMAT]",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("migrate", help="apply pending migrations (idempotent, concurrency-safe)")
    _common(p)

    p = sub.add_parser("run", help="claim and execute jobs until SIGTERM/SIGINT")
    _common(p)
    p.add_argument(
        "--queue",
        action="append",
        dest="queues",
        help="NAME=CONCURRENCY, repeatable [SHIGOTO_QUEUES] (default: default=10)",
    )
    p.add_argument(
        "--import",
        action="append",
        dest="imports",
        help="module defining workers, repeatable [SHIGOTO_IMPORT]",
    )
    p.add_argument(
        "--health-port",
        type=int,
        default=_env("SHIGOTO_HEALTH_PORT"),
        help="serve /healthz, /readyz, /metrics on this port [SHIGOTO_HEALTH_PORT]",
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=float(_env("SHIGOTO_POLL_INTERVAL", 1.0)),
        help="[SHIGOTO_POLL_INTERVAL]",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=float(_env("SHIGOTO_SHUTDOWN_TIMEOUT", 15.0)),
        help="seconds in-flight jobs get on SIGTERM [SHIGOTO_SHUTDOWN_TIMEOUT]",
    )
    p.add_argument(
        "--no-migrate",
        action="store_true",
        default=_env("SHIGOTO_NO_MIGRATE", "") not in ("", "0", "false"),
        help="do not apply migrations at start [SHIGOTO_NO_MIGRATE]",
    )
    p.add_argument(
        "--global-concurrency",
        action="append",
        metavar="NAME=N",
        help="at most N jobs of queue NAME execute across all runners; stored in the database "
        "for every runner, repeatable [SHIGOTO_GLOBAL_CONCURRENCY]",
    )
    p.add_argument(
        "--heartbeat-interval",
        type=float,
        default=float(_env("SHIGOTO_HEARTBEAT_INTERVAL", 30.0)),
        help="seconds between node heartbeats [SHIGOTO_HEARTBEAT_INTERVAL]",
    )
    p.add_argument(
        "--rescue-after",
        type=float,
        default=_env("SHIGOTO_RESCUE_AFTER"),
        help="seconds of silence after which a node's jobs are rescued "
        "(default 2 x heartbeat + 30) [SHIGOTO_RESCUE_AFTER]",
    )
    p.add_argument(
        "--cron",
        nargs="?",
        const="",
        default=_env("SHIGOTO_CRON"),
        metavar="FILE",
        help="run the cron scheduler here (leader-elected); FILE, a JSON list of schedules, "
        "is stored first [SHIGOTO_CRON]",
    )

    p = sub.add_parser("enqueue", help="enqueue one job by worker name")
    _common(p)
    p.add_argument("worker")
    p.add_argument("--args", default="{}", help="JSON object")
    p.add_argument("--queue")
    p.add_argument("--priority", type=int)
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--schedule-in", type=float, help="seconds from now")
    p.add_argument("--tag", action="append", dest="tags")

    p = sub.add_parser("status", help="counts by queue and state, oldest available job, nodes")
    _common(p)
    p.add_argument("--json", action="store_true")

    for name, verb in (("retry", "make available again"), ("cancel", "cancel")):
        p = sub.add_parser(name, help=f"{verb} jobs matching the filters")
        _common(p)
        _filters(p)

    p = sub.add_parser("bench", help="measure enqueue, processing and pickup latency")
    _common(p)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--finished", type=int, default=0, help="re-measure with N finished rows")
    p.add_argument("--runners", metavar="N[,N...]",
                   help="instead: processing by N real runner processes, e.g. 1,2,4")
    p.add_argument("--global-limit", type=int, metavar="L",
                   help="with --runners: also measure a queue with a global limit of L")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("demo", help="the whole loop on an embedded PostgreSQL, no setup")
    _common(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    try:
        return int(_COMMANDS[args.command](args) or 0)
    except Error as exc:
        print(f"shigoto {args.command}: {exc}", file=sys.stderr)
        return 2
    except psycopg.errors.UndefinedTable as exc:
        print(f"shigoto {args.command}: {exc.diag.message_primary}; the schema is not set up: "
              "run `shigoto migrate` against this database first", file=sys.stderr)  # fmt: skip
        return 2
    except psycopg.OperationalError as exc:
        print(f"shigoto {args.command}: cannot reach the database: {exc}", file=sys.stderr)
        return 2


def _migrate(args: argparse.Namespace) -> int:
    from shigoto.migrate import migrate

    applied = migrate(_database_url(args), schema=args.schema)
    print(f"applied migrations {applied}" if applied else "schema is up to date")
    return 0


def _run(args: argparse.Namespace) -> int:
    from shigoto.runner import Runner

    queues = (config.parse_queues(",".join(args.queues)) if args.queues
              else config.queues_from_env())  # fmt: skip
    imports = args.imports if args.imports else config.imports_from_env()
    from shigoto.cron import load_file

    schedules = load_file(args.cron) if args.cron else []
    limits_text = ",".join(args.global_concurrency or []) or _env("SHIGOTO_GLOBAL_CONCURRENCY")
    limits = config.parse_queues(limits_text) if limits_text else {}
    runner = Runner(
        queues, database_url=_database_url(args), schema=args.schema, imports=imports,
        auto_migrate=not args.no_migrate, poll_interval=args.poll_interval,
        shutdown_timeout=args.shutdown_timeout, cron=args.cron is not None,
        cron_schedules=schedules, global_concurrency=limits,
        heartbeat_interval=args.heartbeat_interval,
        rescue_after=float(args.rescue_after) if args.rescue_after else None,
    )  # fmt: skip

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(runner.stop()))
        health_server = None
        if args.health_port is not None:  # 0 is valid: any free port, logged at start
            from shigoto.probes import HealthServer

            health_server = HealthServer(runner, port=int(args.health_port))
            await health_server.start()
        try:
            await runner.run()
        finally:
            if health_server is not None:
                await health_server.stop()

    asyncio.run(serve())
    _exit_even_if_threads_linger()
    return 0


def _exit_even_if_threads_linger() -> None:
    """A sync perform past its deadline cannot be interrupted; don't let it block the exit."""
    busy = [
        t for t in threading.enumerate() if t.name.startswith("shigoto-worker") and t.is_alive()
    ]
    if busy:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _enqueue(args: argparse.Namespace) -> int:
    from shigoto.client import enqueue
    from shigoto.errors import ValidationError

    try:
        job_args = json.loads(args.args)
    except json.JSONDecodeError as exc:
        raise ValidationError("--args", f"is not valid JSON ({exc})") from None
    job = enqueue(
        args.worker, job_args, queue=args.queue, priority=args.priority,
        max_attempts=args.max_attempts, schedule_in=args.schedule_in, tags=args.tags,
        database_url=_database_url(args), schema=args.schema,
    )  # fmt: skip
    print(json.dumps({"id": job.id, "queue": job.queue, "state": str(job.state)}))
    return 0


def _status(args: argparse.Namespace) -> int:
    from shigoto.operations import status
    from shigoto.status_view import render_status

    st = status(database_url=_database_url(args), schema=args.schema)
    if args.json:
        print(json.dumps(st.as_dict(), indent=2, default=str))
    else:
        render_status(st)
    return 0


def _bulk(action: str):
    def command(args: argparse.Namespace) -> int:
        from shigoto import operations

        fn = operations.retry_by if action == "retry" else operations.cancel_by
        ids = fn(
            ids=args.ids, queue=args.queue, worker=args.worker, tag=args.tag, state=args.state,
            database_url=_database_url(args), schema=args.schema,
        )  # fmt: skip
        print(json.dumps({action: ids}))
        return 0

    return command


def _bench(args: argparse.Namespace) -> int:
    from shigoto.bench import main as bench_main

    return bench_main(args, _database_url(args))


def _demo(args: argparse.Namespace) -> int:
    from shigoto.demo import main as demo_main

    return demo_main(_database_url(args), schema=args.schema)


_COMMANDS = {
    "migrate": _migrate,
    "run": _run,
    "enqueue": _enqueue,
    "status": _status,
    "retry": _bulk("retry"),
    "cancel": _bulk("cancel"),
    "bench": _bench,
    "demo": _demo,
}

if __name__ == "__main__":
    sys.exit(main())
