"""The admission policies of deploy/policies/ against the CRDs: every Secret a Queue or a
CronSchedule can name is one the policy makes the requesting user able to `get`.

The Secret-reference fields are derived from crds.py's schemas, so a new `*SecretRef` field (or
an opaque core/v1 field that can hold one) fails here until the policy reads it. The policy's
own CEL that lists the references is evaluated with cel-python on an object naming a different
Secret in every such field; the authorization checks themselves need a real API server
(tests/e2e/test_real_cluster.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from shigoto_operator import crds

POLICIES = Path(__file__).resolve().parents[2] / "deploy" / "policies"

#: Opaque core/v1 types the CRDs embed, and where each holds a Secret reference (a path below
#: one item, ending at the reference object; "" for none). A core/v1 type not listed here fails
#: test_every_opaque_core_type_is_known: decide whether it can name a Secret first.
CORE_SECRET_PATHS: dict[str, list[str]] = {
    "EnvVar": ["valueFrom.secretKeyRef"],
    "EnvFromSource": ["secretRef"],
    "ResourceRequirements": [],
    "Toleration": [],
    "Affinity": [],
}
#: Where the same opaque types name a ConfigMap (the runner pods get it without the operator).
CORE_CONFIG_MAP_PATHS: dict[str, list[str]] = {
    "EnvVar": ["valueFrom.configMapKeyRef"],
    "EnvFromSource": ["configMapRef"],
}


def _policy(file: str) -> dict[str, Any]:
    [policy] = [
        d for d in yaml.safe_load_all((POLICIES / file).read_text())
        if d and d["kind"] == "ValidatingAdmissionPolicy"
    ]  # fmt: skip
    return dict(policy)


def _variables(policy: Mapping[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


def _is_secret_ref(key: str, node: Mapping[str, Any]) -> bool:
    """A schema node naming a Secret: `...SecretRef`/`secretRef`, or an object (or list of
    objects) whose `name` is described as a Secret's."""
    if re.search(r"secretref$", key, re.IGNORECASE):
        return True
    item = node.get("items", node)
    name = item.get("properties", {}).get("name", {})
    return "Secret" in name.get("description", "")


def _opaque_type(node: Mapping[str, Any]) -> str | None:
    found = re.search(r"core/v1 (\w+)", node.get("description", ""))
    return found.group(1) if found else None


def secret_fields(schema: Mapping[str, Any], path: str = "spec") -> Iterator[tuple[str, bool]]:
    """(path, is a list) of every Secret reference in a spec schema, opaque ones included."""
    for key, node in schema.get("properties", {}).items():
        where = f"{path}.{key}"
        is_list = node.get("type") == "array"
        if _is_secret_ref(key, node):
            yield where, is_list
            continue
        core = _opaque_type(node)
        if core is not None:
            for sub in CORE_SECRET_PATHS.get(core, []):
                yield f"{where}[].{sub}", False
            continue
        yield from secret_fields(node.get("items", node) if is_list else node, where)


def opaque_types(schema: Mapping[str, Any]) -> Iterator[str]:
    for node in schema.get("properties", {}).values():
        core = _opaque_type(node)
        if core is not None:
            yield core
        else:
            yield from opaque_types(node.get("items", node))


def _object(fields: list[tuple[str, bool]]) -> tuple[dict[str, Any], dict[str, str]]:
    """An object naming Secret s<i> in field i (one list item per `[]`), and {name: field}."""
    obj: dict[str, Any] = {"spec": {"runner": {"image": "shigoto-runner:1"}}}
    names = {}
    for i, (path, is_list) in enumerate(fields):
        name = f"s{i}"
        names[name] = path
        node = obj
        *parents, last = path.split(".")
        for part in parents:
            if part.endswith("[]"):
                item: dict[str, Any] = {"name": f"VAR_{i}"}
                node.setdefault(part[:-2], []).append(item)
                node = item
            else:
                node = node.setdefault(part, {})
        node[last] = [{"name": name}] if is_list else {"name": name, "key": "k"}
    return obj, names


def _evaluate(expression: str, obj: Mapping[str, Any]) -> list[list[str]]:
    env = celpy.Environment()
    result = env.program(env.compile(expression)).evaluate({"object": celpy.json_to_cel(obj)})
    return [[str(part) for part in pair] for pair in result]  # type: ignore[union-attr]


KINDS = [
    pytest.param(crds.QUEUE_SCHEMA, "queue-policy.yaml", "queues", id="Queue"),
    pytest.param(crds.CRON_SCHEMA, "cronschedule-policy.yaml", "cronschedules", id="CronSchedule"),
]


def test_the_derivation_finds_the_known_secret_references() -> None:
    """Guards the walk itself: it must see every reference the operator reads today."""
    queue = dict(secret_fields(crds.QUEUE_SCHEMA))
    assert {
        "spec.database.secretRef", "spec.database.migrationSecretRef",
        "spec.database.directUrlSecretRef", "spec.encryption.keysSecretRef",
        "spec.runner.env[].valueFrom.secretKeyRef", "spec.runner.envFrom[].secretRef",
        "spec.runner.imagePullSecrets",
    } == set(queue)  # fmt: skip
    assert set(dict(secret_fields(crds.CRON_SCHEMA))) == {
        "spec.database.secretRef", "spec.database.migrationSecretRef",
        "spec.database.directUrlSecretRef",
    }  # fmt: skip


@pytest.mark.parametrize(("schema", "file", "resource"), KINDS)
def test_every_opaque_core_type_is_known(schema: Any, file: str, resource: str) -> None:
    unknown = set(opaque_types(schema)) - set(CORE_SECRET_PATHS)
    assert not unknown, f"can these name a Secret? add them to CORE_SECRET_PATHS: {unknown}"


@pytest.mark.parametrize(("schema", "file", "resource"), KINDS)
def test_policy_reads_every_secret_reference_of_the_crd(
    schema: Any, file: str, resource: str
) -> None:
    fields = list(secret_fields(schema))
    obj, names = _object(fields)
    listed = _evaluate(_variables(_policy(file))["secretRefs"], obj)
    seen = {name for _, name in listed}
    missing = {names[n] for n in names if n not in seen}
    assert not missing, f"the Secret rule of {file} does not read {sorted(missing)}"
    for field, name in listed:  # the refusal names the field the Secret came from
        assert re.sub(r"\[[^\]]*\]", "[]", field) == names[name], (field, names[name])


def test_queue_policy_reads_every_config_map_of_the_runner_env() -> None:
    obj: dict[str, Any] = {"spec": {"runner": {"image": "shigoto-runner:1"}}}
    runner = obj["spec"]["runner"]
    runner["env"] = [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c1", "key": "k"}}},
                     {"name": "B", "value": "plain"}]  # fmt: skip
    runner["envFrom"] = [{"configMapRef": {"name": "c2"}}, {"prefix": "X_"}]
    listed = _evaluate(_variables(_policy("queue-policy.yaml"))["configMapRefs"], obj)
    assert listed == [
        ["spec.runner.env[A].valueFrom.configMapKeyRef", "c1"],
        ["spec.runner.envFrom[].configMapRef", "c2"],
    ]
    assert set(CORE_CONFIG_MAP_PATHS) <= set(CORE_SECRET_PATHS)


def test_an_object_without_references_lists_none() -> None:
    runner = {"image": "shigoto-runner:1", "env": [{"name": "A", "value": "1"}]}
    obj = {"spec": {"database": {"secretRef": {"name": "db"}}, "runner": runner}}
    assert _evaluate(_variables(_policy("queue-policy.yaml"))["secretRefs"], obj) == [
        ["spec.database.secretRef", "db"]
    ]


def _slots(policy: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [v for v in policy["spec"]["validations"] if "authorizer" in v["expression"]]


@pytest.mark.parametrize(("schema", "file", "resource"), KINDS)
def test_each_check_asks_the_authorizer_once_for_get_as_the_requesting_user(
    schema: Any, file: str, resource: str
) -> None:
    """The API server caps one expression at about two authorization checks and hides the
    authorizer from messageExpressions: one check per validation, the same rule in each slot,
    its message precomputed per slot."""
    policy = _policy(file)
    slots = _slots(policy)
    assert slots, "no Secret rule"
    normal = {re.sub(rf"\b{i}\b", "I", " ".join(s["expression"].split()))
              for i, s in enumerate(slots)}  # fmt: skip
    assert len(normal) == 1, normal
    [rule] = normal
    assert rule.count("authorizer.") == 1 and ".check('get').allowed()" in rule
    assert ".namespace(request.namespace)" in rule
    for i, slot in enumerate(slots):
        assert slot["messageExpression"] == f"variables.refMessages[{i}]"
        assert slot["reason"] == "Forbidden"
    messages = _variables(policy)["refMessages"]
    assert "authorizer" not in messages and "request.userInfo.username" in messages
    cap = [v for v in policy["spec"]["validations"] if v not in slots]
    if resource == "queues":
        [limit] = [v for v in cap if "size(variables.refKeys) <=" in v["expression"]]
        assert limit["expression"] == f"size(variables.refKeys) <= {len(slots)}"
    else:  # a CronSchedule names at most one Secret per field
        assert len(slots) >= len(list(secret_fields(schema)))


@pytest.mark.parametrize(("schema", "file", "resource"), KINDS)
def test_policy_matches_its_kind_on_create_and_on_spec_changes(
    schema: Any, file: str, resource: str
) -> None:
    policy = _policy(file)
    assert policy["spec"]["failurePolicy"] == "Fail"
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == [resource] and rule["operations"] == ["CREATE", "UPDATE"]
    [condition] = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        "request.operation == 'CREATE' || object.spec != oldObject.spec"
    )
