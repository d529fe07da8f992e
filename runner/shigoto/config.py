"""Typed settings read from the environment, validated with hints on how to fix them.

Every CLI flag has an env var; the CLI passes flags explicitly, so flags win.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shigoto.errors import ConfigurationError, ValidationError

ENV_DATABASE_URL = "SHIGOTO_DATABASE_URL"
ENV_SCHEMA = "SHIGOTO_SCHEMA"
ENV_QUEUES = "SHIGOTO_QUEUES"
ENV_IMPORT = "SHIGOTO_IMPORT"
ENV_WORKER_PREFIXES = "SHIGOTO_WORKER_PREFIXES"
#: Flow control of one runner (`shigoto run --capacity / --shed-target / --shed-interval`).
ENV_CAPACITY = "SHIGOTO_CAPACITY"
ENV_SHED_TARGET = "SHIGOTO_SHED_TARGET"
ENV_SHED_INTERVAL = "SHIGOTO_SHED_INTERVAL"
#: Connections (docs/connections.md): what the database URL goes through, the direct URL for
#: what needs a session when that is a transaction pooler, and a runner's cap.
ENV_POOLER = "SHIGOTO_POOLER"
ENV_DIRECT_DATABASE_URL = "SHIGOTO_DIRECT_DATABASE_URL"
ENV_MAX_CONNECTIONS = "SHIGOTO_MAX_CONNECTIONS"
#: The pod this runner runs in (the operator sets it from the downward API): the name the
#: nodes table records, so the operator can tell which pod runs which jobs.
ENV_POD_NAME = "SHIGOTO_POD_NAME"
#: `SHIGOTO_POOLER` values: `none` (PostgreSQL itself, or a pooler in session mode) and
#: `transaction` (PgBouncer's pool_mode=transaction, or any pooler that may hand each
#: transaction to another server session).
POOLERS = ("none", "transaction")

DEFAULT_SCHEMA = "public"
#: The queue of a job enqueued without one.
DEFAULT_QUEUE = "default"
DEFAULT_QUEUES = {DEFAULT_QUEUE: 10}
MAX_QUEUE_NAME = 128
#: The one rule for queue names, shared with the CRD's pattern and the database's CHECK:
#: safe in URLs, label values, metric labels and `NAME=N` lists alike.
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_QUEUE_NAME_RE = re.compile(QUEUE_NAME_PATTERN)

_SCHEMA_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def database_url(explicit: str | None = None, env: Mapping[str, str] = os.environ) -> str:
    """The URL to use: the explicit one, else SHIGOTO_DATABASE_URL, else a clear error."""
    url = explicit or env.get(ENV_DATABASE_URL)
    if not url:
        raise ConfigurationError(
            f"no database configured: pass database_url= or set {ENV_DATABASE_URL} "
            "(e.g. postgresql://user:pass@host:5432/db)"
        )
    return url


def schema(explicit: str | None = None, env: Mapping[str, str] = os.environ) -> str:
    """The schema holding the tables; validated so it can never smuggle SQL."""
    name = explicit or env.get(ENV_SCHEMA) or DEFAULT_SCHEMA
    if not _SCHEMA_RE.fullmatch(name):
        raise ConfigurationError(
            f"{ENV_SCHEMA}: {name!r} is not a plain PostgreSQL identifier; use letters, digits "
            "and underscores, starting with a letter or underscore (at most 63 characters)"
        )
    return name


def queue_name_problem(name: object) -> str | None:
    """Why `name` is not a valid queue name, or None when it is."""
    if not isinstance(name, str) or not name:
        return f"must be a non-empty string, got {name!r}"
    if len(name) > MAX_QUEUE_NAME:
        return f"must be at most {MAX_QUEUE_NAME} characters, got {len(name)}"
    if not _QUEUE_NAME_RE.fullmatch(name):  # `$` alone would let a trailing newline in
        return (
            f"{name!r} is not a queue name: use letters, digits, '.', '_' and '-', starting "
            "with a letter or digit"
        )
    return None


def parse_queues(text: str) -> dict[str, int]:
    """Parse `default=10,emails=5` (also whitespace-separated) into {queue: concurrency}."""
    queues: dict[str, int] = {}
    for part in text.split(","):
        words = part.split()
        if len(words) > 1 and any("=" not in word for word in words):
            # `--queue "my queue=1"` must not quietly serve the queues `my` and `queue`
            raise ConfigurationError(
                f"queues: {part.strip()!r} is not NAME=CONCURRENCY: a queue name cannot "
                "contain spaces; separate queues with commas, e.g. emails=5,reports=1"
            )
    for item in re.split(r"[,\s]+", text.strip()):
        if not item:
            continue
        name, sep, limit = item.partition("=")
        name = name.strip()
        if not sep:
            limit = "10"
        problem = queue_name_problem(name)
        if problem:
            raise ConfigurationError(
                f"queues: {item!r} needs a queue name of 1 to {MAX_QUEUE_NAME} characters "
                f"({problem}), written as NAME=CONCURRENCY (e.g. emails=5)"
            )
        try:
            concurrency = int(limit)
        except ValueError:
            raise ConfigurationError(
                f"queues: concurrency of {name!r} must be a whole number, got {limit!r} "
                "(write NAME=CONCURRENCY, e.g. emails=5)"
            ) from None
        if concurrency < 1:
            raise ConfigurationError(
                f"queues: concurrency of {name!r} must be at least 1, got {concurrency}"
            )
        queues[name] = concurrency
    if not queues:
        raise ConfigurationError("queues: give at least one queue, e.g. default=10")
    return queues


def queues_from_env(env: Mapping[str, str] = os.environ) -> dict[str, int]:
    text = env.get(ENV_QUEUES)
    return parse_queues(text) if text else dict(DEFAULT_QUEUES)


def imports_from_env(env: Mapping[str, str] = os.environ) -> list[str]:
    return [m.strip() for m in env.get(ENV_IMPORT, "").split(",") if m.strip()]


def pooler(explicit: str | None = None, env: Mapping[str, str] = os.environ) -> str:
    """What the database URL goes through: the explicit value, else SHIGOTO_POOLER, else
    `none`; validated, since a typo here would leave prepared statements on behind PgBouncer."""
    value = (explicit or env.get(ENV_POOLER) or "none").strip().lower()
    if value not in POOLERS:
        raise ConfigurationError(
            f"{ENV_POOLER} / --pooler: {value!r} is not one of {', '.join(POOLERS)}; use "
            "`transaction` when the database URL goes through PgBouncer in transaction mode"
        )
    return value


def direct_database_url(
    explicit: str | None = None, env: Mapping[str, str] = os.environ
) -> str | None:
    """The URL that reaches PostgreSQL itself, for what needs a session (LISTEN, the liveness
    lock, migrations) when the main URL is a transaction pooler; None when not given."""
    return explicit or env.get(ENV_DIRECT_DATABASE_URL) or None


def max_connections(
    explicit: int | None = None, env: Mapping[str, str] = os.environ
) -> int | None:
    """A runner's cap on its connections: the explicit value, else SHIGOTO_MAX_CONNECTIONS,
    else None (no cap). Whether it is large enough is `runtime.connection_budget`'s call."""
    if explicit is not None:
        return explicit
    raw = env.get(ENV_MAX_CONNECTIONS, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(
            f"{ENV_MAX_CONNECTIONS}: must be a whole number of connections, got {raw!r}"
        ) from None


def normalise_prefixes(prefixes: Iterable[str]) -> tuple[str, ...]:
    """Package prefixes as `--worker-prefix` takes them (`myapp`, `myapp.jobs.`), validated:
    each one a dotted name of identifiers, so a prefix never widens to "everything"."""
    cleaned = []
    for raw in prefixes:
        prefix = raw.strip().rstrip(".")
        if not prefix:
            continue
        if not all(part.isidentifier() for part in prefix.split(".")):
            raise ValidationError(
                "worker_prefixes", f"{raw!r} is not a dotted package name such as myapp.jobs"
            )
        cleaned.append(prefix)
    return tuple(cleaned)


def worker_prefixes(
    explicit: Iterable[str] | None = None, env: Mapping[str, str] = os.environ
) -> tuple[str, ...]:
    """Packages whose workers a runner may import on first use (`--worker-prefix`), else
    SHIGOTO_WORKER_PREFIXES (comma separated), else none: only `--import`ed workers run."""
    if explicit is None:
        explicit = env.get(ENV_WORKER_PREFIXES, "").split(",")
    try:
        return normalise_prefixes(explicit)
    except ValidationError as exc:
        raise ConfigurationError(
            f"{ENV_WORKER_PREFIXES} / --worker-prefix: {exc.message}"
        ) from None


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    """How a runner behaves; the defaults are what production wants."""

    poll_interval: float = 1.0
    """Fallback polling when no NOTIFY arrives (a lost notification costs at most this)."""
    stage_interval: float = 0.5
    """How often due scheduled/retryable jobs are made available (bounds their lateness)."""
    shutdown_timeout: float = 15.0
    heartbeat_interval: float = 30.0
    rescue_after: float | None = None
    """A node silent this long (seconds) is dead and its jobs are rescued; default
    2 x heartbeat_interval + 30 s, so one late heartbeat never triggers a rescue."""
    rescue_interval: float = 15.0
    leader_interval: float = 1.0
    """How often a follower tries to take leadership (bounds hand-over time after a death)."""
    cron_interval: float = 1.0
    settings_interval: float = 2.0
    """How often shared queue settings (global limit, paused) are re-read."""
    prune_interval: float = 3600.0
    prune_after: float = 14 * 86400.0
    """Finished jobs older than this (seconds since finishing) move to the archive."""
    archive_retention: float = 30 * 86400.0
    """Archived jobs older than this are deleted."""
    claim_batch: int = 100
    """Upper bound on one claim, whatever the free capacity."""
    sync_threads: int | None = None
    """Thread pool size for sync workers; default: the sum of queue concurrencies."""
    worker_prefixes: tuple[str, ...] | None = None
    """Packages whose workers may be imported when a job first names them (on a thread);
    None: SHIGOTO_WORKER_PREFIXES. Other workers must be registered by `imports`."""

    def __post_init__(self) -> None:
        positive = ("poll_interval", "stage_interval", "shutdown_timeout", "heartbeat_interval",
                    "prune_interval", "rescue_interval", "leader_interval", "cron_interval",
                    "settings_interval")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name} must be positive, got {getattr(self, name)}")
        if self.rescue_after is not None and self.rescue_after <= self.heartbeat_interval:
            raise ConfigurationError(
                f"rescue_after ({self.rescue_after}) must exceed heartbeat_interval "
                f"({self.heartbeat_interval}), or live runners would be robbed of their jobs"
            )
        if self.claim_batch < 1:
            raise ConfigurationError(f"claim_batch must be at least 1, got {self.claim_batch}")

    @property
    def effective_rescue_after(self) -> float:
        if self.rescue_after is not None:
            return self.rescue_after
        return 2 * self.heartbeat_interval + 30.0
