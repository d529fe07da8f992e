"""The dashboard as a function from a request to a response: routing, input checks, auth,
and the JSON of each endpoint. No sockets: `server` is the thin shell that feeds it from
HTTP, and tests call `Dashboard.handle` directly.

Every answer carries the security headers (`auth.SECURITY_HEADERS`), errors included. API
answers are JSON with `Cache-Control: no-store`; input errors are 400 `{"error", "field"}`.
Reads need no token, but every job they carry goes through `views.redact` for the request's
`auth.Viewer` (a viewer without the token sees no args, results, error messages, meta, tags,
partition or unique keys; nor may it filter by them); actions are POST only and need the token
(`auth.Auth.refuse_action`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import psycopg

from shigoto.client import jobs as job_api
from shigoto.client.job_filters import name_scan
from shigoto.client.jobs import JobRecord
from shigoto.dashboard import actions, assets, readings, views
from shigoto.dashboard.auth import (
    SECURITY_HEADERS,
    Auth,
    ShowArgs,
    header,
    host_name,
    loopback_host,
)
from shigoto.dashboard.live import KEEPALIVE, POLL_INTERVAL, Changes
from shigoto.dashboard.sources import Source, SourceList, Sources, as_sources
from shigoto.errors import ValidationError

log = logging.getLogger("shigoto.dashboard")

_JOB = re.compile(r"^/api/jobs/([^/]+)$")
_JOB_ACTION = re.compile(r"^/api/jobs/([^/]+)/([^/]+)$")
_QUEUE_ACTION = re.compile(r"^/api/queues/([^/]+)/([^/]+)$")
#: The job API's argument names as the query string spells them.
_FIELDS = {"args_contains": "args", "job_id": "id"}
#: Seconds the counts of a database are shared between requests (the overview and queues
#: pages of every viewer), unless a change was seen meanwhile.
COUNTS_TTL = 1.0
#: Ids one page of an args-filtered job list searches (`list_jobs(scan_limit=)`): no index
#: serves an args filter. On 1,100,000 jobs a page of 50,000 ids took 25-60 ms from cache but
#: up to 0.5 s when its rows had to be read in; 20,000 keeps even that under 300 ms.
ARGS_SCAN = 20_000


@dataclass(frozen=True, slots=True)
class Request:
    """What the handler needs of an HTTP request: method, target (path and query, as sent)
    and headers."""

    method: str
    target: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Response:
    """An answer: a whole `body`, or a `stream` of chunks (server-sent events)."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    stream: Iterator[bytes] | None = None

    def json(self) -> Any:
        """The body decoded (tests)."""
        return json.loads(self.body)


class HTTPError(Exception):
    """An answer other than 200, raised anywhere below `handle`."""

    def __init__(self, status: int, message: str, field: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = dict(headers or {})


def _encode(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def json_response(status: int, body: Any, headers: Mapping[str, str] | None = None) -> Response:
    data = json.dumps(body, default=_encode, ensure_ascii=False).encode("utf-8")
    return Response(status, {"Content-Type": "application/json; charset=utf-8",
                             "Cache-Control": "no-store", **(headers or {})}, data)  # fmt: skip


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shigoto")
    except PackageNotFoundError:  # a checkout on the path without an install
        return "unknown"


class Dashboard:
    """The dashboard of the databases in `sources` (a list of `Source`, or a callable returning
    the current list, asked again on each request: the operator's known databases).

    `token` None makes it read-only. `loopback_only` refuses requests whose Host header is not
    a loopback name (set it when listening on a loopback address). `args_scan` is how many
    ids one page of a job list filtered by args searches. `close()` stops the change pollers
    (ending every event stream) and closes the pools."""

    def __init__(
        self,
        sources: SourceList | Sources,
        *,
        token: str | None = None,
        show_args: ShowArgs | str = ShowArgs.TOKEN,
        static_dir: Path | None = None,
        loopback_only: bool = False,
        poll_interval: float = POLL_INTERVAL,
        keepalive: float = KEEPALIVE,
        args_scan: int = ARGS_SCAN,
    ) -> None:
        self.sources = as_sources(sources)
        self.auth = Auth(token, ShowArgs(show_args))
        self.static_dir = static_dir or assets.STATIC_DIR
        self.loopback_only = loopback_only
        self.args_scan = args_scan
        self.changes = Changes(poll_interval, keepalive)
        self.version = _version()
        self._counts_lock = threading.Lock()
        self._counts_cache: dict[tuple[str, str], tuple[float, int | None, readings.Counts]] = {}
        self._get_routes: dict[str, Callable[[Request, dict[str, str]], Response]] = {
            "/api/session": self._session, "/api/overview": self._overview,
            "/api/queues": self._queues, "/api/jobs": self._jobs, "/api/cron": self._cron,
            "/api/nodes": self._nodes, "/api/events": self._events,
        }  # fmt: skip

    def close(self) -> None:
        self.changes.close()
        self.sources.close()

    # -- entry point ------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        """The answer to `request`, with the security headers, whatever happens."""
        try:
            response = self._route(request)
        except HTTPError as exc:
            body: dict[str, Any] = {"error": exc.message}
            if exc.field:
                body["field"] = exc.field
            response = json_response(exc.status, body, exc.headers)
        except Exception as exc:
            response = self.error_response(exc)
        response.headers.update(SECURITY_HEADERS)
        return response

    def error_response(self, exc: Exception) -> Response:
        """The answer to an unexpected failure: 503 for the database's troubles, else 500
        (logged with its traceback; the client learns nothing of the internals)."""
        if isinstance(exc, psycopg.errors.QueryCanceled):
            message = ("the database took too long to answer (statement timeout); narrow the "
                       "filter, e.g. add a queue or worker to an args filter")  # fmt: skip
            return json_response(503, {"error": message})
        if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedColumn):
            return json_response(503, {"error": "the database's schema is not up to date: run "
                                       "`shigoto migrate` against it"})  # fmt: skip
        if isinstance(exc, psycopg.OperationalError):
            log.warning("dashboard: database unreachable: %s", exc)
            return json_response(503, {"error": "database unreachable"})
        log.exception("dashboard: request failed")
        return json_response(500, {"error": "internal error (see the dashboard's log)"})

    def _route(self, request: Request) -> Response:
        self._check_host(request)
        parts = urlsplit(request.target)
        path = parts.path
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        method = request.method.upper()
        action = _JOB_ACTION.match(path) or _QUEUE_ACTION.match(path)
        if action:
            if method != "POST":
                raise HTTPError(405, "actions are POST only", headers={"Allow": "POST"})
            return self._act(request, query, path, action)
        if method not in ("GET", "HEAD"):
            raise HTTPError(405, f"{method} is not allowed here; reads are GET",
                            headers={"Allow": "GET, HEAD"})  # fmt: skip
        if path in self._get_routes:
            return self._get_routes[path](request, query)
        job = _JOB.match(path)
        if job:
            return self._job(request, query, job.group(1))
        if path == "/" or path == "/index.html":
            return self._static("index.html")
        if path.startswith("/static/"):
            return self._static(unquote(path.removeprefix("/static/")))
        raise HTTPError(404, f"no such page: {path}")

    def _check_host(self, request: Request) -> None:
        if not self.loopback_only:
            return
        given = header(request.headers, "Host")
        if given is None or not loopback_host(host_name(given)):
            raise HTTPError(403, "this dashboard listens on a loopback address and answers "
                            "only to localhost names (Host header)")  # fmt: skip

    # -- helpers ----------------------------------------------------------------------------

    def _source(self, query: Mapping[str, str]) -> Source:
        try:
            return self.sources.get(query.get("db") or None)
        except ValidationError as exc:
            raise HTTPError(404, exc.message, "db") from None

    def _conn(self, source: Source) -> AbstractContextManager[psycopg.Connection[Any]]:
        return self.sources.pool(source).connection()

    def _counts(self, conn: psycopg.Connection[Any], source: Source) -> readings.Counts:
        """The counts of `source`, shared by the requests of COUNTS_TTL seconds: each open page
        re-fetches on every change event, and without this each viewer would count the backlog
        again. An entry is stale as soon as the change poller has seen a change since it was
        made, so a page refreshed on a change event never gets counts from before it."""
        key = (source.url, source.schema)
        version = self.changes.version(key)
        with self._counts_lock:
            cached = self._counts_cache.get(key)
        if cached is not None:
            made, seen, counts = cached
            if seen == version and time.monotonic() - made < COUNTS_TTL:
                return counts
        found = readings.counts(conn, source.schema)
        with self._counts_lock:
            self._counts_cache[key] = (time.monotonic(), version, found)
        return found

    def _static(self, relative: str) -> Response:
        found = assets.find(self.static_dir, relative)
        if found is None:
            raise HTTPError(404, "no such file")
        return Response(200, {"Content-Type": found.content_type, "Cache-Control": "no-cache"},
                        found.body)  # fmt: skip

    # -- reads ------------------------------------------------------------------------------

    def _session(self, request: Request, query: dict[str, str]) -> Response:
        return json_response(200, {
            "authenticated": self.auth.authenticated(request.headers),
            "actions_enabled": self.auth.actions_enabled,
            "show_args": str(self.auth.show_args),
            "databases": self.sources.names(),
            "version": self.version,
        })  # fmt: skip

    def _overview(self, request: Request, query: dict[str, str]) -> Response:
        source = self._source(query)
        with self._conn(source) as conn:
            counts = self._counts(conn, source)
            body = {
                "now": readings.now(conn), "counts": counts.totals(), "exact": counts.exact,
                "series": readings.series(conn, source.schema),
                "nodes": readings.node_count(conn, source.schema),
            }  # fmt: skip
        return json_response(200, body)

    def _queues(self, request: Request, query: dict[str, str]) -> Response:
        source = self._source(query)
        with self._conn(source) as conn:
            counts = self._counts(conn, source)
            settings = readings.queue_settings(conn, source.schema)
            runners = readings.runners_by_queue(readings.nodes(conn, source.schema))
        names = sorted(counts.by_queue.keys() | settings.keys() | runners.keys())
        empty = dict.fromkeys(readings.STATES, 0)
        default = readings.setting_of(None)
        queues = [
            {"name": name, "counts": counts.by_queue.get(name, empty), "exact": counts.exact,
             **settings.get(name, default), "runners": runners.get(name, 0)}
            for name in names
        ]  # fmt: skip
        return json_response(200, {"queues": queues})

    def _jobs(self, request: Request, query: dict[str, str]) -> Response:
        source = self._source(query)
        viewer = self.auth.viewer(request.headers)
        filters = _job_filters(query)
        refusal = views.filter_refusal(filters, viewer)
        if refusal is not None:
            raise HTTPError(403, refusal[1], refusal[0])
        # An args filter has no index, nor (migration 0028) a queue or worker filter: each
        # page searches a bounded stretch of ids and may come back short or empty, saying how
        # far it looked, with `next` carrying on from there.
        scan = name_scan(filters["queue"], filters["worker"])
        if filters["args_contains"] is not None:
            scan = min(scan or self.args_scan, self.args_scan)
        with self._conn(source) as conn, _named_fields():
            page = job_api.list_jobs(**filters, scan_limit=scan, conn=conn, schema=source.schema)
        return json_response(200, {
            "jobs": views.summaries(page.jobs, viewer), "next": page.next,
            "partial": page.partial, "scanned_to_id": page.scanned_to_id,
        })  # fmt: skip

    def _job(self, request: Request, query: dict[str, str], raw_id: str) -> Response:
        source = self._source(query)
        job_id = _job_id(raw_id)
        viewer = self.auth.viewer(request.headers)
        with self._conn(source) as conn:
            job = job_api.get_job(job_id, conn=conn, schema=source.schema, keep_sealed=True)
            if job is None:
                raise HTTPError(404, f"job {job_id}: not found (never enqueued here, or deleted)")
            family = job_api.relatives(job, conn=conn, schema=source.schema)
            ids = [r["id"] for r in family.parents + family.children]
            rows = readings.jobs_by_ids(conn, source.schema, ids) if ids else {}
        return json_response(200, {
            "job": views.job_detail(job, viewer),
            "parents": views.summaries(_known(rows, family.parents), viewer),
            "children": views.summaries(_known(rows, family.children), viewer),
        })  # fmt: skip

    def _cron(self, request: Request, query: dict[str, str]) -> Response:
        source = self._source(query)
        with self._conn(source) as conn:
            return json_response(200, {"schedules": readings.cron(conn, source.schema)})

    def _nodes(self, request: Request, query: dict[str, str]) -> Response:
        source = self._source(query)
        with self._conn(source) as conn:
            return json_response(200, {"nodes": readings.nodes(conn, source.schema)})

    def _events(self, request: Request, query: dict[str, str]) -> Response:
        source = self._source(query)
        pool = self.sources.pool(source)

        def read_mark() -> Any:
            with pool.connection() as conn:
                return readings.change_mark(conn, source.schema)

        stream = self.changes.stream((source.url, source.schema), read_mark)
        return Response(200, {"Content-Type": "text/event-stream; charset=utf-8",
                              "Cache-Control": "no-store", "X-Accel-Buffering": "no"},
                        stream=stream)  # fmt: skip

    # -- actions ----------------------------------------------------------------------------

    def _act(self, request: Request, query: dict[str, str], path: str, match: re.Match[str]
             ) -> Response:  # fmt: skip
        refusal = self.auth.refuse_action(request.headers)
        if refusal is not None:
            extra = {"WWW-Authenticate": "Bearer"} if refusal.status == 401 else None
            raise HTTPError(refusal.status, refusal.message, headers=extra)
        target, verb = unquote(match.group(1)), match.group(2)
        source = self._source(query)
        with self._counts_lock:  # the page re-fetches next: let it see its own action
            self._counts_cache.pop((source.url, source.schema), None)
        try:
            if path.startswith("/api/jobs/"):
                if verb not in actions.JOB_ACTIONS:
                    raise HTTPError(404, f"no job action {verb!r}; use retry, cancel or delete")
                job_id = _job_id(target)
                before = self._job_before(source, job_id) if verb == "delete" else None
                after = actions.job_action(lambda: self._conn(source), source, job_id, verb)
                shown = after or before
                assert shown is not None
                body: dict[str, Any] = {
                    "ok": True,
                    "job": views.job_summary(shown, self.auth.viewer(request.headers)),
                }
                if verb == "delete":
                    body["deleted"] = True
                return json_response(200, body)
            if verb not in actions.QUEUE_ACTIONS:
                raise HTTPError(404, f"no queue action {verb!r}; use pause or resume")
            with _named_fields():
                actions.queue_action(lambda: self._conn(source), source, target, verb)
            with self._conn(source) as conn:
                setting = readings.queue_setting(conn, source.schema, target)
            return json_response(200, {"ok": True, "queue": {"name": target, **setting}})
        except actions.ActionRefused as exc:
            raise HTTPError(exc.status, str(exc)) from None

    def _job_before(self, source: Source, job_id: int) -> JobRecord | None:
        with self._conn(source) as conn:
            return job_api.get_job(job_id, conn=conn, schema=source.schema, keep_sealed=True)


def _known(rows: Mapping[int, JobRecord], family: list[dict[str, Any]]) -> list[JobRecord]:
    return [rows[r["id"]] for r in family if r["id"] in rows]


def _job_id(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise HTTPError(400, f"{raw!r} is not a job id (a positive integer)", "id")
    return int(raw)


@contextlib.contextmanager
def _named_fields() -> Iterator[None]:
    """A ValidationError of the job API becomes a 400 naming the query parameter."""
    try:
        yield
    except ValidationError as exc:
        raise HTTPError(400, exc.message, _FIELDS.get(exc.field, exc.field)) from None


def _job_filters(query: Mapping[str, str]) -> dict[str, Any]:
    """The job API's filters from the query string; empty parameters count as absent."""

    def text(name: str) -> str | None:
        value = query.get(name, "").strip()
        return value or None

    states = [s.strip() for s in (query.get("state") or "").split(",") if s.strip()]
    args = text("args")
    contains = None
    if args is not None:
        try:
            contains = json.loads(args)
        except json.JSONDecodeError as exc:
            raise HTTPError(400, f"is not valid JSON ({exc.msg}); give a JSON object such as "
                            '{"invoice_id": 42}', "args") from None  # fmt: skip
        if not isinstance(contains, dict):
            raise HTTPError(400, 'must be a JSON object such as {"invoice_id": 42}', "args")
    raw_limit = text("limit")
    limit = job_api.DEFAULT_LIMIT
    if raw_limit is not None:
        if not raw_limit.isdigit():
            raise HTTPError(400, f"must be a whole number from 1 to {job_api.MAX_LIMIT}, got "
                            f"{raw_limit!r}", "limit")  # fmt: skip
        limit = int(raw_limit)
    return {
        "queue": text("queue"), "worker": text("worker"), "state": states or None,
        "tag": text("tag"), "args_contains": contains, "limit": limit, "after": text("after"),
    }  # fmt: skip
