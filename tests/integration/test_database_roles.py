"""The three database roles of docs/database-roles.md, through real connections as each role.

Roles are made on the test server with unique names and given exactly what
`shigoto.db.roles.grants` prints; each is dropped afterwards (DROP OWNED first, which also
revokes its grants and default privileges in the test database). The enqueuer enqueues and
reads its jobs back, and is refused everything else; the runner runs jobs end to end (cron
leadership and a global limit included); the migrator migrates an empty database, and a table
added later reaches the runner through default privileges. Sealed args cannot be moved into a
job whose forwarding rule would open them, neither by a forged copy nor through a real forward.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

import shigoto
from shigoto import cron
from shigoto.cli import commands
from shigoto.db import database, insert_encryption, roles
from shigoto.encryption import sealing
from shigoto.encryption.envelope import DecryptionError, JobBinding
from shigoto.encryption.keys import ENV_VAR, Key, KeyRing
from tests.support.in_process import running
from tests.support.waiting import until

ECHO = "tests.support.process_workers.echo"
CHARGE = "tests.support.encryption_workers.charge"
KEY = Key.from_secret(b"r" * 32)

#: Makes a role of a kind in the test database: `make(kind) -> connection URL as that role`.
MakeRole = Callable[..., str]


def _as(url: str, user: str) -> str:
    return make_conninfo(**{**conninfo_to_dict(url), "user": user})


def _drop_role(url: str, name: str) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                  (name,))  # fmt: skip
        c.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def _apply(url: str, statements: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        for statement in statements:
            c.execute(statement.encode())


@pytest.fixture
def make_role(db_url: str, conn: psycopg.Connection[Any]) -> Iterator[MakeRole]:
    """Roles in the test database, granted what `roles.grants` says; the migrator's name is
    the superuser that migrated the template (it owns the tables)."""
    made: list[str] = []
    owner = conn.execute("SELECT current_user").fetchone()[0]  # type: ignore[index]

    def make(kind: str) -> str:
        name = f"shigoto_{kind[:3]}_{uuid.uuid4().hex[:10]}"
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        made.append(name)
        _apply(db_url, roles.grants(kind, name=name, owner=owner))
        return _as(db_url, name)

    yield make
    database.close_pools()
    for name in made:
        _drop_role(db_url, name)


@pytest.fixture
def ring(monkeypatch: pytest.MonkeyPatch) -> Iterator[KeyRing]:
    monkeypatch.delenv(ENV_VAR, raising=False)
    keys = KeyRing([KEY])
    sealing.use_keys(keys)
    insert_encryption._ENCRYPTED_QUEUES.clear()
    yield keys
    sealing.reload_keys()
    insert_encryption._ENCRYPTED_QUEUES.clear()


def _rows(conn: psycopg.Connection[Any], query: str, *params: Any) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, params).fetchall()


# -- the grants themselves ------------------------------------------------------------------


def test_the_grants_name_every_table_and_sequence(conn: psycopg.Connection[Any]) -> None:
    tables = {r["relname"] for r in _rows(
        conn, "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
              "AND relkind IN ('r', 'p') AND relname LIKE 'shigoto\\_%%'")}  # fmt: skip
    sequences = {r["relname"] for r in _rows(
        conn, "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
              "AND relkind = 'S' AND relname LIKE 'shigoto\\_%%'")}  # fmt: skip
    assert tables == set(roles.TABLES)
    assert sequences == set(roles.SEQUENCES)


def test_grants_quote_names_and_refuse_unknown_roles() -> None:
    statements = roles.grants("enqueuer", schema='we"ird', name="svc")
    assert 'GRANT USAGE ON SCHEMA "we""ird" TO "svc";' in statements
    assert not any("shigoto_cron" in s or "DELETE" in s for s in statements)
    with pytest.raises(ValueError, match="role must be one of"):
        roles.grants("admin")


def test_shigoto_roles_prints_the_grants(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert commands.main(["roles", "--sql", "--role", "enqueuer", "--name", "svc",
                          "--schema", "jobs"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out == roles.script(["enqueuer"], schema="jobs", name="svc")
    assert 'GRANT INSERT (id, queue' in out and 'TO "svc";' in out
    monkeypatch.setenv("SHIGOTO_ROLE", "runner")
    monkeypatch.setenv("SHIGOTO_ROLE_OWNER", "owner_x")
    assert commands.main(["roles", "--sql"]) == 0
    out = capsys.readouterr().out
    assert 'FOR ROLE "owner_x" IN SCHEMA "public"' in out and "-- enqueuer" not in out
    assert commands.main(["roles", "--sql", "--name", "x"]) == 0  # SHIGOTO_ROLE names the role
    monkeypatch.delenv("SHIGOTO_ROLE")
    assert commands.main(["roles", "--sql", "--name", "x"]) == 2
    assert "--name needs --role" in capsys.readouterr().err
    assert commands.main(["roles", "--sql"]) == 0
    out = capsys.readouterr().out
    assert all(f"-- {r} (shigoto_{r})" in out for r in roles.ROLES)


# -- the enqueuer ---------------------------------------------------------------------------


def test_the_enqueuer_enqueues_and_reads_its_jobs(
    make_role: MakeRole, conn: psycopg.Connection[Any]
) -> None:
    url = make_role("enqueuer")
    one = shigoto.enqueue(ECHO, {"n": 1}, database_url=url)
    later = shigoto.enqueue(ECHO, {"n": 2}, schedule_in=60, database_url=url)
    unique = [shigoto.enqueue(ECHO, {"n": 3}, unique={"keys": ["worker", "args"]},
                              database_url=url) for _ in range(2)]  # fmt: skip
    assert unique[0].id == unique[1].id
    many = shigoto.enqueue_many([{"worker": ECHO, "args": {"n": i}} for i in range(3)],
                                database_url=url)  # fmt: skip
    with psycopg.connect(url) as own:  # the service's own transaction
        inside = shigoto.enqueue(ECHO, {"n": 9}, conn=own)
        own.execute("SELECT 1")
    assert later.state == "scheduled"
    assert shigoto.get_job(one.id, database_url=url).args == {"n": 1}
    assert shigoto.get_job(inside.id, database_url=url).state == "available"
    assert len(many) == 3
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', result = '{\"ok\": 1}', "
                 "completed_at = now(), finished_at = now() WHERE id = %s", (one.id,))  # fmt: skip
    assert shigoto.wait_for(one.id, timeout=10, database_url=url) == {"ok": 1}


async def test_the_enqueuer_enqueues_with_asyncio(
    make_role: MakeRole, conn: psycopg.Connection[Any]
) -> None:
    url = make_role("enqueuer")
    job = await shigoto.aenqueue(ECHO, {"n": 1}, database_url=url)
    async with await psycopg.AsyncConnection.connect(url) as own:
        inside = await shigoto.aenqueue(ECHO, {"n": 2}, conn=own)
    assert (await shigoto.aget_job(inside.id, database_url=url)).args == {"n": 2}
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', result = '7', completed_at = now(), "
                 "finished_at = now() WHERE id = %s", (job.id,))  # fmt: skip
    assert await shigoto.await_for(job.id, timeout=10, database_url=url) == 7


@pytest.mark.parametrize("statement", [
    "UPDATE shigoto_cron SET worker = 'evil.worker', args = '{}'",
    "INSERT INTO shigoto_cron (name, expression, worker) VALUES ('x', '* * * * *', 'evil')",
    "UPDATE shigoto_queues SET paused = true",
    "INSERT INTO shigoto_queues (name, paused) VALUES ('default', true)",
    "UPDATE shigoto_leaders SET leader_id = 'me'",
    "DELETE FROM shigoto_leaders",
    "UPDATE shigoto_jobs SET state = 'executing', attempt = attempt + 1",  # a claim
    "UPDATE shigoto_jobs SET meta = '{}', args = '{}'",
    "DELETE FROM shigoto_jobs",
    "INSERT INTO shigoto_jobs (queue, worker, result) VALUES ('default', 'w', '{}')",
    "SELECT * FROM shigoto_nodes",
])  # fmt: skip
def test_the_enqueuer_is_refused_the_rest(make_role: MakeRole, statement: str) -> None:
    url = make_role("enqueuer")
    with psycopg.connect(url) as c, pytest.raises(psycopg.errors.InsufficientPrivilege):
        c.execute(statement.encode())


def test_the_enqueuer_cannot_pause_a_queue(make_role: MakeRole) -> None:
    url = make_role("enqueuer")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        shigoto.pause_queue("default", database_url=url)


# -- the runner -----------------------------------------------------------------------------


async def test_the_runner_runs_jobs_cron_and_limits(
    make_role: MakeRole, conn: psycopg.Connection[Any]
) -> None:
    url = make_role("runner")
    jobs = [shigoto.enqueue(ECHO, {"n": i}) for i in range(4)]
    stored = cron.build_schedule("roles-minute", "* * * * *", ECHO, {"cron": True})
    async with running(
        url, {"default": 2}, cron_schedules=[stored], cron_interval=0.2, leader_interval=0.2,
        global_concurrency={"default": 1}, imports=["tests.support.process_workers"],
    ) as runner:  # fmt: skip
        await until(lambda: runner.elector.is_leader, message="the runner role leads")
        conn.execute("UPDATE shigoto_cron SET last_slot_at = now() - interval '1 hour' "
                      "WHERE name = 'roles-minute'")  # fmt: skip
        await until(lambda: all(shigoto.get_job(j.id).state == "completed" for j in jobs)
                    and _rows(conn, "SELECT 1 FROM shigoto_jobs WHERE state = 'completed' "
                                    "AND args = '{\"cron\": true}'"),
                    message="jobs and the cron slot completed as the runner role")  # fmt: skip
    assert shigoto.get_job(jobs[0].id).result == {"n": 0}
    assert _rows(conn, "SELECT global_concurrency FROM shigoto_queues WHERE name = 'default'")


def test_the_runner_may_not_change_the_schema(make_role: MakeRole) -> None:
    url = make_role("runner")
    with psycopg.connect(url) as c:
        for statement in ("CREATE TABLE sneaky (id int)", "DROP TABLE shigoto_cron",
                          "DELETE FROM shigoto_schema_migrations"):  # fmt: skip
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(statement.encode())
            c.rollback()
    assert shigoto.migrate(url) == []


# -- the migrator ---------------------------------------------------------------------------


def test_the_migrator_migrates_and_new_tables_reach_the_runner(empty_db_url: str) -> None:
    names = {kind: f"shigoto_{kind[:3]}_{uuid.uuid4().hex[:10]}" for kind in roles.ROLES}
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        for name in names.values():
            c.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    try:
        _apply(empty_db_url, roles.grants("migrator", name=names["migrator"]))
        migrator = _as(empty_db_url, names["migrator"])
        assert shigoto.migrate(migrator)
        for kind in ("runner", "enqueuer"):  # as the migrator, who owns the tables
            _apply(migrator, roles.grants(kind, name=names[kind], owner=names["migrator"]))
        with psycopg.connect(migrator, autocommit=True) as c:  # a later migration's table
            c.execute("CREATE TABLE shigoto_later (id bigserial PRIMARY KEY)")
        with psycopg.connect(_as(empty_db_url, names["runner"])) as c:
            c.execute("INSERT INTO shigoto_later DEFAULT VALUES")
        with psycopg.connect(_as(empty_db_url, names["enqueuer"])) as c, \
                pytest.raises(psycopg.errors.InsufficientPrivilege):  # fmt: skip
            c.execute("SELECT * FROM shigoto_later")
        assert shigoto.enqueue(ECHO, {}, database_url=_as(empty_db_url, names["enqueuer"])).id
    finally:
        database.close_pools()
        for name in reversed(list(names.values())):
            _drop_role(empty_db_url, name)


# -- sealed args stay with their job --------------------------------------------------------


def _opens(row: dict[str, Any], ring: KeyRing) -> Any:
    """What the runner's opener makes of a row's args (the forwarding rule included)."""
    own = JobBinding("public", row["queue"], row["worker"], row["id"])
    value = sealing.sealed_or_plain(row["args"], own, row["meta"], "args")
    return value.open(ring) if isinstance(value, sealing.SealedValue) else value


def _secret_job(ring: KeyRing) -> shigoto.Job:
    shigoto.set_queue("pay", encrypted=True, forward={"discarded": "pay-dead"})
    return shigoto.enqueue(CHARGE, {"card": "4111-secret"}, queue="pay")


def test_a_forged_forwarded_copy_is_refused(
    make_role: MakeRole, conn: psycopg.Connection[Any], ring: KeyRing
) -> None:
    secret = _secret_job(ring)
    with psycopg.connect(make_role("enqueuer")) as c, \
            pytest.raises(psycopg.errors.InsufficientPrivilege, match="forward"):  # fmt: skip
        c.execute(
            "INSERT INTO shigoto_jobs (queue, worker, args, meta) "
            "SELECT 'pay-dead', worker, args, %s FROM shigoto_jobs WHERE id = %s",
            (Jsonb({"forwarded_from": {"id": secret.id, "queue": "pay"},
                    "forward_chain": ["pay"]}), secret.id),
        )  # fmt: skip
    assert not _rows(conn, "SELECT id FROM shigoto_jobs WHERE queue = 'pay-dead'")


def test_a_forward_never_carries_args_sealed_for_another_job(
    make_role: MakeRole, conn: psycopg.Connection[Any], ring: KeyRing
) -> None:
    secret = _secret_job(ring)
    with psycopg.connect(make_role("enqueuer"), autocommit=True) as c:  # a replay into 'pay'
        replay = c.execute(
            "INSERT INTO shigoto_jobs (queue, worker, args, max_attempts) "
            "SELECT queue, worker, args, 1 FROM shigoto_jobs WHERE id = %s RETURNING id",
            (secret.id,),
        ).fetchone()[0]  # type: ignore[index]
    with psycopg.connect(make_role("runner"), autocommit=True) as c:  # the completer discards
        for job_id in (replay, secret.id):
            c.execute("UPDATE shigoto_jobs SET state = 'discarded', finished_at = now() "
                      "WHERE id = %s", (job_id,))  # fmt: skip
    copies = _rows(conn, "SELECT * FROM shigoto_jobs WHERE queue = 'pay-dead' ORDER BY id")
    assert [c["meta"]["forwarded_from"]["id"] for c in copies] == [secret.id]
    assert _opens(copies[0], ring) == {"card": "4111-secret"}  # the genuine forward still opens
    with pytest.raises(DecryptionError):  # and the replayed row itself never opened
        _opens(_rows(conn, "SELECT * FROM shigoto_jobs WHERE id = %s", replay)[0], ring)

