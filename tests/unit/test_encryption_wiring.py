"""Encryption's pure wiring, without a database: which specs are sealed and how they are
written, what uniqueness does with them, and what an encrypted job's error entry keeps."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest

import shigoto
from shigoto import jobspec
from shigoto.db import insert_encryption, insert_plan, inserts
from shigoto.encryption import ENV_VAR, DecryptionError, JobBinding, Key, KeyRing, sealing, unseal
from shigoto.job import Job, JobState
from shigoto.relations import unique
from shigoto.runtime.executor import JobExecutor, error_entry

KEY = Key.from_secret(b"k" * 32)


@shigoto.worker(name="tests.unit.enc.sealed", encrypted=True)
def sealed_worker(card: str) -> None: ...


@shigoto.worker(name="tests.unit.enc.plain")
def plain_worker(card: str) -> None: ...


@pytest.fixture(autouse=True)
def ring() -> Iterator[None]:
    sealing.use_keys(KeyRing([KEY]))
    insert_encryption._ENCRYPTED_QUEUES.clear()
    yield
    sealing.reload_keys()
    insert_encryption._ENCRYPTED_QUEUES.clear()


def context(schema: str = "public") -> inserts.InsertContext:
    return inserts.InsertContext("enqueue", schema, None)


def test_the_worker_or_its_registered_name_decides_and_plain_specs_stay_plain() -> None:
    assert jobspec.build(sealed_worker, {"card": "x"}).encrypted
    assert jobspec.build(sealed_worker.name, {"card": "x"}).encrypted  # by name, registered
    assert not jobspec.build(plain_worker, {"card": "x"}).encrypted
    assert not jobspec.build("not.registered", {"card": "x"}).encrypted


def test_plans_a_single_sealed_row_and_seals_for_the_reserved_id() -> None:
    spec = jobspec.build(sealed_worker, {"card": "x"})
    assert inserts.plan([spec]) == "one_sealed"
    assert inserts.plan([spec, spec]) == "copy"
    keyed = jobspec.build(sealed_worker, {"card": "x"}, unique=True)
    assert inserts.plan([keyed]) == "unique"
    params = insert_plan.sealed_params(spec, 77, "tenant")
    binding = JobBinding("tenant", spec.queue, spec.worker, 77)
    assert unseal(json.loads(params["args"]), binding, "args", KeyRing([KEY])) == {"card": "x"}
    assert spec.args_json == '{"card":"x"}'  # the spec (and the caller's Job) keep plaintext


def test_no_ring_is_a_configuration_error_naming_the_variable_and_worker() -> None:
    sealing.use_keys(None)
    with pytest.raises(shigoto.ConfigurationError) as excinfo:
        jobspec.build(sealed_worker, {"card": "x"})
    assert ENV_VAR in str(excinfo.value) and sealed_worker.name in str(excinfo.value)
    spec = jobspec.build(plain_worker, {"card": "x"}, queue="vault")
    inserts.know_encrypted("public", "vault")
    with pytest.raises(shigoto.ConfigurationError):
        sealing.mark([spec], context())


def test_known_encrypted_queues_mark_their_specs_per_schema() -> None:
    spec = jobspec.build(plain_worker, {"card": "x"}, queue="vault")
    other = jobspec.build(plain_worker, {"card": "x"}, queue="open")
    inserts.know_encrypted("public", "vault")
    marked = sealing.mark([spec, other], context())
    assert [s.encrypted for s in marked] == [True, False]
    assert not sealing.mark([spec], context("elsewhere"))[0].encrypted


def test_the_marker_key_is_reserved_in_args_only() -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build(plain_worker, {"$shigoto_enc": 1})
    assert excinfo.value.field == "args.$shigoto_enc"
    assert jobspec.build(plain_worker, {"card": "x"}, meta={"$shigoto_enc": 1})


def test_unique_keys_of_encrypted_jobs_are_keyed_and_recomputed_when_marked_late() -> None:
    early = jobspec.build(sealed_worker, {"card": "x"}, unique=True)
    key = unique.split(early.unique_key or "")
    assert key is not None and key[0].startswith(f"unique:{KEY.kid}.")
    late = jobspec.build(plain_worker, {"card": "x"}, unique=True)  # a plain hash at build
    marked = dataclasses.replace(late, encrypted=True)
    work = unique.plan([marked])
    assert work.keys[0].startswith(f"unique:{KEY.kid}.")
    assert work.keys[0] != unique.split(late.unique_key or "")[0]  # type: ignore[index]


def test_replacing_args_of_an_encrypted_job_is_refused_early_and_late() -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build(sealed_worker, {"card": "x"}, unique={"replace": ["args", "priority"]})
    assert excinfo.value.field == "unique.replace"
    with pytest.raises(shigoto.ValidationError) as excinfo:
        jobspec.build(sealed_worker, {"card": "x"}, unique={"replace": ["queue"]})
    assert "'queue'" in excinfo.value.message
    assert jobspec.build(sealed_worker, {"card": "x"}, unique={"replace": ["priority"]})
    late = jobspec.build(plain_worker, {"card": "x"}, unique={"replace": ["args"]})
    with pytest.raises(shigoto.ValidationError):
        unique.plan([dataclasses.replace(late, encrypted=True)])


def executor(keys: KeyRing | None) -> JobExecutor:
    return JobExecutor(node="n", resolve=lambda name: None, threads=None,  # type: ignore[arg-type]
                       schema="public", keys=keys)  # fmt: skip


def job(**changes: Any) -> Job:
    base = Job(id=5, queue="default", worker=sealed_worker.name, args={"card": "x"},
               state=JobState.EXECUTING, attempt=1)  # fmt: skip
    return dataclasses.replace(base, **changes)


def test_an_encrypted_jobs_error_entry_keeps_the_type_and_seals_the_rest() -> None:
    try:
        raise ValueError("card 4111 declined")
    except ValueError as exc:
        entry = error_entry(1, exc)
    stored = executor(KeyRing([KEY]))._stored(job(), entry, sealed=True)
    assert stored["error"] == "ValueError" and stored["traceback"] == ""
    assert "4111" not in json.dumps(stored)
    binding = JobBinding("public", "default", sealed_worker.name, 5)
    detail = unseal(stored["sealed"], binding, "error", KeyRing([KEY]))
    assert detail == {"error": entry["error"], "traceback": entry["traceback"]}
    assert "sealed" not in executor(None)._stored(job(), entry, sealed=True)  # no key: type only
    assert executor(None)._stored(job(), entry, sealed=False) == entry  # plain jobs unchanged


def test_a_decryption_error_entry_is_kept_whole() -> None:
    binding = JobBinding("public", "default", sealed_worker.name, 5)
    entry = error_entry(1, DecryptionError(binding, "args", KEY.kid, "gone"))
    assert executor(KeyRing([KEY]))._stored(job(), entry, sealed=True) == entry


def test_sealed_args_without_a_ring_fail_naming_the_kid() -> None:
    spec = jobspec.build(sealed_worker, {"card": "x"})
    envelope = json.loads(insert_plan.sealed_params(spec, 5, "public")["args"])
    with pytest.raises(DecryptionError) as excinfo:
        executor(None)._opened(job(args=envelope))
    assert KEY.kid in str(excinfo.value) and ENV_VAR in str(excinfo.value)
    assert executor(KeyRing([KEY]))._opened(job(args=envelope)).args == {"card": "x"}
