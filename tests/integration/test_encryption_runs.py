"""Encrypted jobs end to end against a real PostgreSQL and an in-process runner: sealed at
insert on every path, opened before the perform, failing (never running) on a bad ciphertext
or a missing key, sealed results and error details, uniqueness, encrypted queues, forwarding
and workflows."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import shigoto
from shigoto.db import insert_encryption, inserts
from shigoto.encryption import (
    ENV_VAR,
    DecryptionError,
    JobBinding,
    Key,
    KeyRing,
    envelope_kid,
    is_envelope,
    sealing,
    unseal,
)
from shigoto.encryption.rekey import rekey
from shigoto.relations import unique
from tests.support import encryption_workers as w
from tests.support.encryption_workers import SECRET
from tests.support.in_process import running
from tests.support.waiting import until

IMPORTS = ["tests.support.encryption_workers"]
KEY_A = Key.from_secret(b"a" * 32)
KEY_B = Key.from_secret(b"b" * 32)


@pytest.fixture(autouse=True)
def ring(monkeypatch: pytest.MonkeyPatch) -> Iterator[KeyRing]:
    """Key A for the client and the in-process runner; known encrypted queues forgotten."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    ring = KeyRing([KEY_A])
    sealing.use_keys(ring)
    w.SEEN.clear()
    insert_encryption._ENCRYPTED_QUEUES.clear()
    yield ring
    sealing.reload_keys()
    insert_encryption._ENCRYPTED_QUEUES.clear()


def row(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    found = (
        conn.cursor(row_factory=dict_row)
        .execute("SELECT * FROM shigoto_jobs WHERE id = %s", (job_id,))
        .fetchone()
    )
    assert found is not None
    return found


def opened(value: Any, job: dict[str, Any], field: Any = "args") -> Any:
    binding = JobBinding("public", job["queue"], job["worker"], job["id"])
    return unseal(value, binding, field, KeyRing([KEY_A]))


def state_of(conn: psycopg.Connection[Any], job_id: int, *states: str) -> bool:
    return row(conn, job_id)["state"] in states


# -- enqueue ----------------------------------------------------------------------------------


def test_every_insert_path_seals_args_and_the_caller_keeps_plaintext(
    conn: psycopg.Connection[Any],
) -> None:
    one = shigoto.enqueue(w.charge, {"card": SECRET})
    many = shigoto.enqueue_many([{"worker": w.charge, "args": {"card": SECRET, "amount": i}}
                                 for i in range(3)])  # fmt: skip
    keyed = shigoto.enqueue(w.charge, {"card": SECRET, "amount": 9}, unique=True)
    by_name = shigoto.enqueue(w.charge.name, {"card": SECRET, "amount": 8})
    for job in [one, *many, keyed, by_name]:
        assert job.args["card"] == SECRET  # the caller's Job: plaintext
        stored = row(conn, job.id)
        assert is_envelope(stored["args"]) and envelope_kid(stored["args"]) == KEY_A.kid
        assert stored["args"]["for"] == {"queue": job.queue, "id": job.id}
        assert opened(stored["args"], stored) == job.args
    assert SECRET not in conn.execute("SELECT string_agg(t::text, '') FROM shigoto_jobs t"
                                      ).fetchone()[0]  # fmt: skip


async def test_the_async_twins_seal_too(conn: psycopg.Connection[Any]) -> None:
    one = await shigoto.aenqueue(w.charge, {"card": SECRET})
    [keyed] = await shigoto.aenqueue_many([{"worker": w.charge, "args": {"card": SECRET},
                                            "unique": True}])  # fmt: skip
    for job in (one, keyed):
        stored = row(conn, job.id)
        assert job.args == {"card": SECRET} and opened(stored["args"], stored) == job.args


def test_plain_jobs_keep_the_single_statement() -> None:
    plain = w.plain.new({"card": "x"})
    sealed = w.charge.new({"card": "x"})
    assert inserts.plan([plain]) == "one" and inserts.plan([sealed]) == "one_sealed"
    assert not plain.encrypted and sealed.encrypted


def test_no_key_ring_refuses_before_writing(conn: psycopg.Connection[Any]) -> None:
    sealing.use_keys(None)
    with pytest.raises(shigoto.ConfigurationError) as excinfo:
        shigoto.enqueue(w.charge, {"card": SECRET})
    assert ENV_VAR in str(excinfo.value) and w.charge.name in str(excinfo.value)
    assert conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone() == (0,)


def test_args_holding_the_marker_are_refused() -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        shigoto.enqueue(w.plain, {"$shigoto_enc": 1, "card": "x"})
    assert excinfo.value.field == "args.$shigoto_enc"


# -- execution --------------------------------------------------------------------------------


async def test_the_perform_and_current_job_see_plaintext(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    job = shigoto.enqueue(w.charge, {"card": SECRET, "amount": 5})
    async with running(db_url, imports=IMPORTS):
        await until(lambda: state_of(conn, job.id, "completed"), message="job completed")
    assert w.SEEN == [("charge", {"card": SECRET, "amount": 5,
                                  "current": {"card": SECRET, "amount": 5}})]  # fmt: skip
    assert row(conn, job.id)["result"] == {"charged": 5}  # not an encrypted_result worker


async def test_a_tampered_ciphertext_fails_naming_the_kid_and_never_runs(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    job = shigoto.enqueue(w.charge, {"card": SECRET}, max_attempts=1)
    ct = row(conn, job.id)["args"]["ct"]
    flipped = ("B" if ct[5] == "A" else "A").join([ct[:5], ct[6:]])
    conn.execute("UPDATE shigoto_jobs SET args = jsonb_set(args, '{ct}', to_jsonb(%s::text)) "
                 "WHERE id = %s", (flipped, job.id))  # fmt: skip
    async with running(db_url, imports=IMPORTS):
        await until(lambda: state_of(conn, job.id, "discarded"), message="job discarded")
    [entry] = row(conn, job.id)["errors"]
    assert entry["error"].startswith("DecryptionError: ")
    assert KEY_A.kid in entry["error"] and "does not authenticate" in entry["error"]
    assert w.SEEN == []  # neither the perform nor anything else ran on garbage


async def test_a_ciphertext_copied_to_another_row_fails(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    source = shigoto.enqueue(w.charge, {"card": SECRET}, scheduled_at=None, schedule_in=3600)
    target = shigoto.enqueue(w.charge, {"card": "other"}, max_attempts=1)
    conn.execute("UPDATE shigoto_jobs SET args = (SELECT args FROM shigoto_jobs WHERE id = %s) "
                 "WHERE id = %s", (source.id, target.id))  # fmt: skip
    async with running(db_url, imports=IMPORTS):
        await until(lambda: state_of(conn, target.id, "discarded"), message="copy discarded")
    [entry] = row(conn, target.id)["errors"]
    assert f"sealed for job {source.id}" in entry["error"] and KEY_A.kid in entry["error"]
    assert w.SEEN == []


async def test_a_missing_key_fails_the_attempt_and_a_restored_key_runs_it(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    job = shigoto.enqueue(w.charge, {"card": SECRET}, max_attempts=5)
    sealing.use_keys(KeyRing([KEY_B]))  # the runner lacks key A
    async with running(db_url, imports=IMPORTS):
        await until(lambda: len(row(conn, job.id)["errors"] or []) >= 1, message="attempt failed")
    failed = row(conn, job.id)
    assert failed["state"] in ("retryable", "available")  # retried with backoff, not discarded
    assert KEY_A.kid in failed["errors"][0]["error"]
    assert ENV_VAR in failed["errors"][0]["error"]
    assert w.SEEN == []
    sealing.use_keys(KeyRing([KEY_B, KEY_A]))  # key A put back, after the newest
    async with running(db_url, imports=IMPORTS):
        await until(lambda: state_of(conn, job.id, "completed"), message="job completed")
    assert w.SEEN[0][1]["card"] == SECRET


async def test_an_encrypted_result_is_sealed_and_opens_to_the_value(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    job = shigoto.enqueue(w.echo, {"card": SECRET})
    async with running(db_url, imports=IMPORTS):
        await until(lambda: state_of(conn, job.id, "completed"), message="job completed")
    stored = row(conn, job.id)
    assert is_envelope(stored["result"]) and SECRET not in json.dumps(stored["result"])
    assert opened(stored["result"], stored, "result") == {"card": SECRET}
    with pytest.raises(DecryptionError):  # the column is bound: a result never opens as args
        opened(stored["result"], stored, "args")


async def test_process_isolation_gets_plaintext_through_its_pipe(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    job = shigoto.enqueue(w.isolated, {"card": SECRET})
    async with running(db_url, imports=IMPORTS):
        await until(lambda: state_of(conn, job.id, "completed", "discarded", "retryable"),
                    timeout=60, message="job finished")  # fmt: skip
    stored = row(conn, job.id)
    assert stored["state"] == "completed", stored["errors"]
    assert opened(stored["result"], stored, "result") == {"card": SECRET, "seen": {"card": SECRET}}


async def test_error_entries_keep_the_type_and_seal_the_details(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    job = shigoto.enqueue(w.leaky, {"card": SECRET})
    async with running(db_url, imports=IMPORTS):
        await until(lambda: state_of(conn, job.id, "discarded"), message="job discarded")
    stored = row(conn, job.id)
    assert SECRET not in json.dumps(stored["errors"])
    assert [e["error"] for e in stored["errors"]] == ["ValueError", "ValueError"]
    detail = opened(stored["errors"][0]["sealed"], stored, "error")
    assert detail["error"] == f"ValueError: card {SECRET} was declined"
    assert SECRET in detail["traceback"]
    # on_discard gets plaintext args and every error opened.
    [(what, seen)] = w.SEEN
    assert what == "on_discard" and seen["args"] == {"card": SECRET}
    assert all(SECRET in e["error"] for e in seen["errors"])


# -- uniqueness -------------------------------------------------------------------------------


def test_unique_over_encrypted_args_dedupes_with_a_keyed_digest(
    conn: psycopg.Connection[Any],
) -> None:
    first = shigoto.enqueue(w.charge, {"card": SECRET, "amount": 1}, unique=True)
    again = shigoto.enqueue(w.charge, {"amount": 1.0, "card": SECRET}, unique=True)
    other = shigoto.enqueue(w.charge, {"card": SECRET, "amount": 2}, unique=True)
    assert (again.id, again.conflict) == (first.id, True) and other.id != first.id
    key = row(conn, first.id)["unique_key"]
    assert key.startswith(f"unique:{KEY_A.kid}.")  # an HMAC under the ring's key
    # Not the plain hash of the same args: that one anyone could compute from a guess.
    as_plain = dataclasses.replace(w.charge.new({"card": SECRET, "amount": 1}), encrypted=False)
    assert key != unique.key_of(as_plain, unique.DEFAULT_KEYS)


def test_replacing_args_of_an_encrypted_unique_job_is_refused(
    conn: psycopg.Connection[Any],
) -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        shigoto.enqueue(w.charge, {"card": SECRET}, unique={"replace": ["args"]})
    assert excinfo.value.field == "unique.replace" and "encrypted" in excinfo.value.message
    assert conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone() == (0,)


# -- encrypted queues -------------------------------------------------------------------------


def test_an_encrypted_queue_seals_any_worker_and_refuses_plaintext(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    shigoto.set_queue("vault", encrypted=True)
    assert row_of_queue(conn, "vault") is True
    job = shigoto.enqueue(w.plain, {"card": SECRET}, queue="vault")
    assert is_envelope(row(conn, job.id)["args"])
    # Another process that has not heard of the setting: the database refuses its plaintext;
    # on an autocommit connection the insert is retried once, sealed.
    insert_encryption._ENCRYPTED_QUEUES.clear()
    retried = shigoto.enqueue(w.plain, {"card": SECRET}, queue="vault")
    assert is_envelope(row(conn, retried.id)["args"])
    # Inside the caller's transaction the refusal reaches the caller, nothing is written.
    insert_encryption._ENCRYPTED_QUEUES.clear()
    with psycopg.connect(db_url) as c:
        with pytest.raises(shigoto.ConfigurationError) as excinfo:
            shigoto.enqueue(w.plain, {"card": SECRET}, queue="vault", conn=c)
        c.rollback()
    assert "queue vault is encrypted" in str(excinfo.value)
    assert conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone() == (2,)
    # A plain queue is untouched.
    assert not is_envelope(row(conn, shigoto.enqueue(w.plain, {"card": "x"}).id)["args"])


def row_of_queue(conn: psycopg.Connection[Any], name: str) -> Any:
    found = conn.execute("SELECT encrypted FROM shigoto_queues WHERE name = %s", (name,))
    return found.fetchone()[0]  # type: ignore[index]


async def test_an_encrypted_queue_job_runs_with_plaintext(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    shigoto.set_queue("vault", encrypted=True)
    job = shigoto.enqueue(w.plain, {"card": SECRET}, queue="vault")
    async with running(db_url, {"vault": 2}, imports=IMPORTS):
        await until(lambda: state_of(conn, job.id, "completed"), message="job completed")
    assert w.SEEN == [("plain", {"card": SECRET})]


# -- forwarding and workflows -----------------------------------------------------------------


async def test_a_forwarded_encrypted_job_opens_in_its_dead_letter_queue(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    shigoto.set_queue("enc-main", forward={"discarded": "enc-dead"})
    job = shigoto.enqueue(w.forwarded, {"card": SECRET}, queue="enc-main")
    async with running(db_url, {"enc-main": 1, "enc-dead": 1}, imports=IMPORTS):
        await until(lambda: w.SEEN, message="forwarded copy ran")
    assert w.SEEN == [("forwarded", {"card": SECRET, "queue": "enc-dead"})]
    copy = (
        conn.cursor(row_factory=dict_row)
        .execute(
            "SELECT * FROM shigoto_jobs WHERE meta -> 'forwarded_from' ->> 'id' = %s::text",
            (job.id,),
        )
        .fetchone()
    )
    assert copy is not None and is_envelope(copy["args"])
    assert SECRET not in json.dumps(copy["meta"])  # the copied errors hold no plaintext


async def test_the_databases_own_copies_into_an_encrypted_queue_are_not_refused(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """A forwarded copy and a batch callback are inserted by the database, which holds no key:
    the guard lets them through rather than failing the completions that make them."""
    shigoto.set_queue("vault", encrypted=True)
    shigoto.set_queue("open", forward={"discarded": "vault"})
    failing = shigoto.enqueue(w.plain_fails, {"card": "x"}, queue="open")
    with shigoto.batch(callback=w.batch_done, callback_args={"card": "cb"},
                       callback_options={"queue": "vault"}) as b:  # fmt: skip
        member = b.enqueue(w.charge, {"card": SECRET})
    async with running(db_url, {"open": 1, "default": 2}, imports=IMPORTS):
        await until(lambda: state_of(conn, failing.id, "discarded"), message="discarded")
        await until(lambda: state_of(conn, member.id, "completed"), message="member done")
        await until(lambda: conn.execute("SELECT count(*) FROM shigoto_jobs WHERE queue = "
                                         "'vault'").fetchone() == (2,),
                    message="copy and callback in the encrypted queue")  # fmt: skip


async def test_rekey_reseals_error_details_and_a_forwarded_copys_originals(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    shigoto.set_queue("enc-main", forward={"discarded": "enc-dead"})
    job = shigoto.enqueue(w.leaky, {"card": SECRET}, queue="enc-main")
    async with running(db_url, {"enc-main": 1}, imports=IMPORTS):
        await until(lambda: state_of(conn, job.id, "discarded"), message="job discarded")
    result = rekey(conn, KeyRing([KEY_B, KEY_A]))
    assert result.complete and result.tables[0].rows == 2
    original = row(conn, job.id)
    [copy_id] = conn.execute("SELECT id FROM shigoto_jobs WHERE id <> %s", (job.id,)).fetchone()
    copy = row(conn, copy_id)
    only_b = KeyRing([KEY_B])  # key A dropped: everything still opens
    binding = JobBinding("public", "enc-main", w.leaky.name, job.id)
    for entries in (original["errors"], copy["meta"]["forwarded_from"]["errors"]):
        assert [envelope_kid(e["sealed"]) for e in entries] == [KEY_B.kid, KEY_B.kid]
        assert SECRET in unseal(entries[0]["sealed"], binding, "error", only_b)["error"]
    assert unseal(copy["args"], binding, "args", only_b) == {"card": SECRET}
    assert copy["meta"]["forwarded_from"]["id"] == job.id  # the rest of meta untouched


async def test_a_child_gets_its_parents_sealed_results_opened(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    parent = shigoto.enqueue(w.echo, {"card": SECRET})
    kid = shigoto.enqueue(w.child, {"name": "c"}, depends_on=[parent.id])
    async with running(db_url, imports=IMPORTS):
        await until(lambda: state_of(conn, kid.id, "completed", "discarded"), message="child ran")
    assert is_envelope(row(conn, parent.id)["result"])
    assert [("child", {parent.id: {"card": SECRET}})] == w.SEEN


async def test_a_cron_slot_of_an_encrypted_worker_is_sealed(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    from datetime import UTC, datetime, timedelta

    from psycopg_pool import AsyncConnectionPool

    from shigoto import cron

    t0 = datetime(2030, 1, 1, 10, 0, tzinfo=UTC)
    cron.schedule("charge", "*/5 * * * *", w.charge.name, {"card": SECRET})
    conn.execute("UPDATE shigoto_cron SET last_slot_at = %s WHERE name = 'charge'", (t0,))
    async with AsyncConnectionPool(db_url, min_size=1, max_size=2, open=False,
                                   kwargs={"autocommit": True}) as pool:  # fmt: skip
        scheduler = cron.CronScheduler(
            pool,
            "public",
            is_leader=lambda: True,
            interval=0.1,
            clock=lambda: t0 + timedelta(minutes=5, seconds=1),
        )
        [job_id] = (await scheduler.run_once())["charge"]
    stored = row(conn, job_id)
    assert envelope_kid(stored["args"]) == KEY_A.kid
    assert opened(stored["args"], stored) == {"card": SECRET}
