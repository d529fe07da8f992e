"""The pure core of encryption at rest: keys, envelopes, keyed unique digests, the forwarding
rule and the rekey planner. No database."""

from __future__ import annotations

import base64
import copy
import os
from collections.abc import Callable
from typing import Any

import pytest

from shigoto.encryption import (
    ENV_VAR,
    DecryptionError,
    JobBinding,
    KeyRing,
    binding_for,
    generate_key,
    is_envelope,
    keys_from_env,
    parse_keys,
    seal,
    unique_digest,
    unique_digests,
    unseal,
)
from shigoto.encryption.keys import Key, key_id
from shigoto.encryption.rekey import RekeyRow, plan_batch
from shigoto.errors import ConfigurationError, Error, ValidationError

OLD, NEW = os.urandom(32), os.urandom(32)
JOB = JobBinding(schema="public", queue="billing", worker="app.charge", job_id=41)
ARGS = {"card": "4111-1111-1111-1111", "amount": 1250, "note": "café ☕"}
SECRET_TEXT = "4111-1111-1111-1111"


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.fixture
def ring() -> KeyRing:
    return KeyRing([NEW, OLD])


# Envelopes


def test_seal_then_unseal_gives_the_value_back(ring: KeyRing) -> None:
    envelope = seal(ARGS, JOB, "args", ring)
    assert is_envelope(envelope)
    assert envelope["kid"] == ring.newest.kid
    assert envelope["for"] == {"queue": "billing", "id": 41}
    assert unseal(envelope, JOB, "args", ring) == ARGS


def test_the_envelope_holds_no_plaintext(ring: KeyRing) -> None:
    text = repr(seal(ARGS, JOB, "args", ring))
    for fragment in (SECRET_TEXT, "1250", "café", "card", "amount"):
        assert fragment not in text


def test_each_seal_has_its_own_nonce(ring: KeyRing) -> None:
    first, second = seal(ARGS, JOB, "args", ring), seal(ARGS, JOB, "args", ring)
    assert first["nonce"] != second["nonce"]
    assert first["ct"] != second["ct"]


def test_results_round_trip_and_any_json_value(ring: KeyRing) -> None:
    for value in (None, 3, "text", [1, {"b": 2.5}], {"nested": {"x": [True, False]}}):
        assert unseal(seal(value, JOB, "result", ring), JOB, "result", ring) == value


def test_a_ciphertext_copied_to_another_job_does_not_open(ring: KeyRing) -> None:
    envelope = seal(ARGS, JOB, "args", ring)
    other = JobBinding("public", "billing", "app.charge", 99)
    with pytest.raises(DecryptionError, match="sealed for job 41 in queue billing") as info:
        unseal(envelope, other, "args", ring)
    assert "job 99" in str(info.value)


def test_rewriting_for_to_the_new_row_fails_authentication(ring: KeyRing) -> None:
    """The clear `for` is only a hint: the tag binds the job, so editing it does not help."""
    envelope = seal(ARGS, JOB, "args", ring)
    envelope["for"] = {"queue": "billing", "id": 99}
    other = JobBinding("public", "billing", "app.charge", 99)
    with pytest.raises(DecryptionError, match="does not authenticate"):
        unseal(envelope, other, "args", ring)


@pytest.mark.parametrize(
    ("binding", "field"),
    [
        (JobBinding("tenant_b", "billing", "app.charge", 41), "args"),
        (JobBinding("public", "billing", "app.refund", 41), "args"),
        (JOB, "result"),
    ],
    ids=["other schema", "other worker", "args opened as result"],
)
def test_schema_worker_and_column_are_bound(ring: KeyRing, binding: JobBinding, field: str) -> None:
    envelope = seal(ARGS, JOB, "args", ring)
    with pytest.raises(DecryptionError, match="does not authenticate"):
        unseal(envelope, binding, field, ring)  # type: ignore[arg-type]


@pytest.mark.parametrize("part", ["ct", "nonce"])
def test_a_tampered_envelope_does_not_open(ring: KeyRing, part: str) -> None:
    envelope = seal(ARGS, JOB, "args", ring)
    raw = bytearray(base64.urlsafe_b64decode(envelope[part]))
    raw[0] ^= 0x01
    envelope[part] = base64.urlsafe_b64encode(bytes(raw)).decode()
    with pytest.raises(DecryptionError) as info:
        unseal(envelope, JOB, "args", ring)
    assert "does not authenticate" in info.value.reason
    assert info.value.kid == ring.newest.kid
    assert SECRET_TEXT not in str(info.value)


def test_a_missing_key_names_the_key_id_and_the_job_never_the_plaintext() -> None:
    envelope = seal(ARGS, JOB, "args", KeyRing([OLD]))
    with pytest.raises(DecryptionError) as info:
        unseal(envelope, JOB, "args", KeyRing([NEW]))
    message = str(info.value)
    assert key_id(OLD) in message and "job 41" in message and "app.charge" in message
    assert ENV_VAR in message and key_id(NEW) in message  # what the ring holds instead
    assert SECRET_TEXT not in message and b64(OLD) not in message and b64(NEW) not in message
    assert isinstance(info.value, Error)


def test_an_older_key_of_the_ring_still_opens() -> None:
    sealed_before_rotation = seal(ARGS, JOB, "args", KeyRing([OLD]))
    rotated = KeyRing([NEW, OLD])
    assert unseal(sealed_before_rotation, JOB, "args", rotated) == ARGS
    assert seal(ARGS, JOB, "args", rotated)["kid"] == key_id(NEW)


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda e: e.pop("nonce"), "expected exactly the keys"),
        (lambda e: e.update({"$shigoto_enc": 2}), "unknown version"),
        (lambda e: e.update({"$shigoto_enc": True}), "unknown version"),
        (lambda e: e.update({"for": {"queue": "billing", "id": True}}), "`for`"),
        (lambda e: e.update({"nonce": "AAAA"}), "nonce"),
        (lambda e: e.update({"kid": 7}), "kid"),
    ],
)
def test_a_malformed_envelope_is_refused_with_what_is_wrong(
    ring: KeyRing, mutate: Callable[[dict[str, Any]], object], reason: str
) -> None:
    envelope = seal(ARGS, JOB, "args", ring)
    mutate(envelope)
    with pytest.raises(DecryptionError, match="malformed envelope") as info:
        unseal(envelope, JOB, "args", ring)
    assert reason in info.value.reason


def test_plain_args_are_not_an_envelope_and_do_not_open(ring: KeyRing) -> None:
    assert not is_envelope(ARGS)
    with pytest.raises(DecryptionError, match="not an object"):
        unseal(ARGS, JOB, "args", ring)


def test_sealing_a_non_json_value_names_the_field_not_the_value(ring: KeyRing) -> None:
    with pytest.raises(ValidationError) as info:
        seal({"secret-value": float("nan")}, JOB, "args", ring)
    assert info.value.field == "args" and "secret-value" not in str(info.value)
    with pytest.raises(ValidationError):
        seal({"when": object()}, JOB, "result", ring)


# Keys


def test_keys_parse_newest_first_with_stable_ids() -> None:
    ring = parse_keys(f" {b64(NEW)} ,{b64(OLD)}")
    assert ring.kids == (key_id(NEW), key_id(OLD))
    assert ring.newest.secret == NEW
    assert parse_keys(b64(NEW)).newest.kid == ring.newest.kid
    assert len(ring.newest.kid) == 8 and key_id(NEW) != key_id(OLD)


def test_url_safe_base64_is_accepted_too() -> None:
    raw = bytes([0xFB, 0xFF] * 16)  # encodes with '+' and '/' in the standard alphabet
    assert parse_keys(base64.urlsafe_b64encode(raw).decode()).newest.secret == raw


def test_generated_keys_are_valid() -> None:
    assert len(parse_keys(generate_key()).newest.secret) == 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"{b64(NEW)},not*base64!", "key 2 of 2 (newest first) is not valid base64"),
        (f"{b64(NEW)},{b64(os.urandom(16))}", "key 2 of 2 (newest first) decodes to 16 bytes"),
        (f"{b64(NEW)},{b64(OLD)},{b64(NEW)}", "key 3 of 3 repeats key 1"),
        (f"{b64(NEW)},", "key 2 of 2 (newest first) is empty"),
    ],
    ids=["not base64", "wrong length", "duplicate", "stray comma"],
)
def test_bad_keys_name_the_variable_the_position_and_the_fix(text: str, expected: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_keys(text)
    message = str(info.value)
    assert message.startswith(ENV_VAR) and expected in message
    assert "generate" in message or "list each key once" in message
    for entry in text.split(","):
        if entry:
            assert entry not in message


def test_keys_come_from_the_environment_or_encryption_is_off() -> None:
    assert keys_from_env({}) is None
    assert keys_from_env({ENV_VAR: "  "}) is None
    ring = keys_from_env({ENV_VAR: f"{b64(NEW)},{b64(OLD)}"})
    assert ring is not None and ring.kids == (key_id(NEW), key_id(OLD))


def test_reprs_never_show_key_material() -> None:
    ring = KeyRing([NEW])
    for text in (repr(ring), repr(ring.newest), str(ring.newest)):
        assert b64(NEW) not in text and repr(NEW) not in text and key_id(NEW) in text


def test_explicit_keys_are_checked_too() -> None:
    with pytest.raises(ConfigurationError, match="32 bytes"):
        KeyRing([os.urandom(24)])
    with pytest.raises(ConfigurationError, match="no encryption key"):
        KeyRing([])
    with pytest.raises(ConfigurationError, match="repeats key 1"):
        KeyRing([NEW, Key.from_secret(NEW)])


# Keyed unique digests


def test_unique_digests_are_equal_for_equal_values() -> None:
    key = KeyRing([NEW]).newest
    first = unique_digest({"worker": "app.charge", "args": {"a": 1, "b": [1.0, "x"]}}, key)
    second = unique_digest({"args": {"b": [1, "x"], "a": 1.0}, "worker": "app.charge"}, key)
    assert first == second and first.startswith(key.kid + ".")


def test_unique_digests_differ_across_values_and_keys() -> None:
    new, old = KeyRing([NEW, OLD])
    material = {"args": {"email": "someone@example.com"}}
    assert unique_digest(material, new) != unique_digest(material, old)
    assert unique_digest(material, new) != unique_digest({"args": {"email": "x@y.z"}}, new)
    assert "someone" not in unique_digest(material, new)


def test_unique_digests_cover_the_whole_ring_newest_first() -> None:
    ring = KeyRing([NEW, OLD])
    material = {"args": {"order": 7}}
    before_rotation = unique_digest(material, KeyRing([OLD]).newest)
    assert unique_digests(material, ring) == (unique_digest(material, ring.newest), before_rotation)


# Forwarding


def forwarded_copy(
    original: JobBinding, *, job_id: int = 77, chain: list[str] | None = None
) -> tuple[JobBinding, dict[str, Any]]:
    copy_binding = JobBinding(original.schema, "billing-dead", original.worker, job_id)
    meta = {"forwarded_from": {"id": original.job_id, "queue": original.queue,
                               "state": "discarded", "errors": [], "result": None},
            "forward_chain": [original.queue] if chain is None else chain}  # fmt: skip
    return copy_binding, meta


def test_a_forwarded_copy_opens_its_originals_args(ring: KeyRing) -> None:
    envelope = seal(ARGS, JOB, "args", ring)
    own, meta = forwarded_copy(JOB)
    binding = binding_for(own, meta, envelope)
    assert binding == JOB
    assert unseal(envelope, binding, "args", ring) == ARGS


def test_a_second_hop_still_names_the_first_queue(ring: KeyRing) -> None:
    envelope = seal(ARGS, JOB, "args", ring)
    own = JobBinding("public", "archive", JOB.worker, 120)
    meta = {"forwarded_from": {"id": 77, "queue": "billing-dead"},
            "forward_chain": ["billing", "billing-dead"]}  # fmt: skip
    assert unseal(envelope, binding_for(own, meta, envelope), "args", ring) == ARGS


def test_an_ordinary_job_opens_with_its_own_binding(ring: KeyRing) -> None:
    envelope = seal(ARGS, JOB, "args", ring)
    assert binding_for(JOB, {}, envelope) is JOB


@pytest.mark.parametrize(
    "case",
    ["not forwarded", "queue not on the chain", "original id not older", "chain not a list"],
)
def test_the_forwarding_rule_refuses_what_forwarding_cannot_produce(
    ring: KeyRing, case: str
) -> None:
    envelope = seal(ARGS, JOB, "args", ring)
    own, meta = forwarded_copy(JOB)
    if case == "not forwarded":
        meta = {}
    elif case == "queue not on the chain":
        meta["forward_chain"] = ["payments"]
    elif case == "original id not older":
        own, meta = forwarded_copy(JOB, job_id=30)
    else:
        meta["forward_chain"] = "billing"
    assert binding_for(own, meta, envelope) == own
    with pytest.raises(DecryptionError, match="sealed for job 41"):
        unseal(envelope, binding_for(own, meta, envelope), "args", ring)


def test_forwarding_never_crosses_workers(ring: KeyRing) -> None:
    envelope = seal(ARGS, JOB, "args", ring)
    own, meta = forwarded_copy(JOB)
    other_worker = JobBinding(own.schema, own.queue, "app.refund", own.job_id)
    with pytest.raises(DecryptionError, match="does not authenticate"):
        unseal(envelope, binding_for(other_worker, meta, envelope), "args", ring)


# Rekey planner


def row(binding: JobBinding, args: Any, result: Any = None, meta: Any = None) -> RekeyRow:
    return RekeyRow(binding.job_id, binding.queue, binding.worker, args, result, meta or {})


def test_the_planner_reseals_only_values_of_older_keys() -> None:
    old_ring, ring = KeyRing([OLD]), KeyRing([NEW, OLD])
    stale = row(JOB, seal(ARGS, JOB, "args", old_ring), seal({"ok": 1}, JOB, "result", ring))
    fresh_job = JobBinding("public", "billing", "app.charge", 42)
    fresh = row(fresh_job, seal(ARGS, fresh_job, "args", ring))
    plain = row(JobBinding("public", "billing", "app.charge", 43), {"plain": True})
    plan = plan_batch([stale, fresh, plain], ring, "public")
    assert [c.id for c in plan.changes] == [41] and plan.values == 1
    new_args = plan.changes[0].changes["args"]
    assert new_args["kid"] == ring.newest.kid
    assert unseal(new_args, JOB, "args", KeyRing([NEW])) == ARGS
    assert not plan.failures


def test_the_planner_keeps_a_forwarded_copys_binding() -> None:
    old_ring, ring = KeyRing([OLD]), KeyRing([NEW, OLD])
    own, meta = forwarded_copy(JOB)
    meta["forwarded_from"]["result"] = seal({"partial": 1}, JOB, "result", old_ring)
    plan = plan_batch([row(own, seal(ARGS, JOB, "args", old_ring), meta=meta)], ring, "public")
    changes = plan.changes[0].changes
    assert set(changes) == {"args", "forwarded_result"}
    assert unseal(changes["args"], binding_for(own, meta, changes["args"]), "args", ring) == ARGS
    assert changes["forwarded_result"]["for"] == {"queue": "billing", "id": 41}


def test_the_planner_reports_a_row_it_cannot_open_and_leaves_it_whole() -> None:
    lost = KeyRing([os.urandom(32)])
    ring = KeyRing([NEW, OLD])
    broken = row(JOB, seal(ARGS, JOB, "args", KeyRing([OLD])),
                 result=seal({"r": 1}, JOB, "result", lost))  # fmt: skip
    original = copy.deepcopy(broken)
    plan = plan_batch([broken], ring, "public")
    assert not plan.changes
    [(job_id, error)] = plan.failures
    assert job_id == 41 and error.kid == lost.newest.kid and SECRET_TEXT not in str(error)
    assert broken == original
