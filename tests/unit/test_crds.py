"""The CRDs: generated files current, schemas structural, examples valid, bad input rejected.

No API server runs here, so this file stands in for the parts of one that decide what
`kubectl apply` accepts: defaulting (`crds.apply_defaults`), OpenAPI schema validation (the
schema translated to JSON Schema, strict about unknown fields like kubectl's default
`--validate=strict`), and the CEL `x-kubernetes-validations` rules (evaluated with cel-python).
The structural-schema rules of apiextensions.k8s.io/v1 are checked directly on the data.
"""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml

from shigoto_operator import crds

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "deploy" / "examples"
DOCS = ROOT / "docs" / "kubernetes.md"

CRDS = {crds.QUEUE_KIND: crds.queue_crd(), crds.CRON_KIND: crds.cron_crd()}

#: The only places where unknown fields are kept on purpose: Kubernetes types passed verbatim
#: into the pod template, and a job's free-form args. Anywhere else is a typo trap.
PRESERVE_UNKNOWN = {
    crds.QUEUE_KIND: {
        "spec.runner.env[]",
        "spec.runner.envFrom[]",
        "spec.runner.resources",
        "spec.runner.tolerations[]",
        "spec.runner.affinity",
    },
    crds.CRON_KIND: {"spec.args"},
}


def root_schema(kind: str) -> dict[str, Any]:
    return CRDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


# --- a stand-in for the API server's admission of a custom object ------------------------------


def to_json_schema(node: Mapping[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Translate the OpenAPI v3 subset Kubernetes uses into plain JSON Schema.

    x-kubernetes-* keys go (CEL rules are evaluated separately); `nullable` widens the type;
    objects with known properties reject unknown ones unless they preserve unknown fields,
    as `kubectl apply` does with strict field validation. `metadata` is left open: only the
    restrictions the CRD states on it apply.
    """
    out: dict[str, Any] = {
        key: value
        for key, value in node.items()
        if not key.startswith("x-kubernetes-")
        and key not in ("nullable", "properties", "items", "additionalProperties")
    }
    if node.get("nullable"):
        out["type"] = [node["type"], "null"]
    # OpenAPI v3.0 (and so Kubernetes) spells an exclusive bound as a boolean beside minimum;
    # JSON Schema draft 7 as the bound itself.
    if out.pop("exclusiveMinimum", False):
        out["exclusiveMinimum"] = out.pop("minimum")
    if out.pop("exclusiveMaximum", False):
        out["exclusiveMaximum"] = out.pop("maximum")
    if "properties" in node:
        out["properties"] = {
            name: to_json_schema(sub, (*path, name)) for name, sub in node["properties"].items()
        }
        if not node.get("x-kubernetes-preserve-unknown-fields") and path != ("metadata",):
            out["additionalProperties"] = False
    if isinstance(node.get("additionalProperties"), Mapping):
        out["additionalProperties"] = to_json_schema(node["additionalProperties"], (*path, "*"))
    if "items" in node:
        out["items"] = to_json_schema(node["items"], (*path, "[]"))
    return out


@dataclass(frozen=True)
class Rejection:
    """Why an object was refused: `by` is "schema" (with the JSON Schema keyword) or "cel"."""

    by: str
    rule: str
    path: str
    message: str


def cel_rejections(schema: Mapping[str, Any], value: Any, path: str = "") -> Iterator[Rejection]:
    """Evaluate every x-kubernetes-validations rule on the node it is attached to."""
    if value is None:
        return
    env = celpy.Environment()
    for check in schema.get("x-kubernetes-validations", []):
        program = env.program(env.compile(check["rule"]))
        result = program.evaluate({"self": celpy.json_to_cel(value)})
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            where = path + check.get("fieldPath", "")  # where the API server reports it
            yield Rejection("cel", check["rule"], where, check.get("message", check["rule"]))
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                yield from cel_rejections(sub, value[name], f"{path}.{name}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from cel_rejections(schema["items"], item, f"{path}[{i}]")


def admit(obj: Mapping[str, Any]) -> tuple[dict[str, Any], list[Rejection]]:
    """Default, then validate, like the API server: the defaulted object and every rejection.

    CEL rules run only on an object that passed the schema, as the API server does not get to
    them (or they see garbage) otherwise.
    """
    schema = root_schema(obj["kind"])
    defaulted = crds.apply_defaults(schema, obj)
    validator = jsonschema.Draft7Validator(to_json_schema(schema))
    rejections = [
        Rejection(
            "schema", str(error.validator), ".".join(map(str, error.absolute_path)), error.message
        )
        for error in validator.iter_errors(defaulted)
    ]
    if not rejections:
        rejections = list(cel_rejections(schema, defaulted))
    return defaulted, rejections


# --- the generated files -----------------------------------------------------------------------


def test_generated_files_are_current() -> None:
    stale = crds.stale_files(ROOT / "crds")
    assert stale == [], f"{stale} out of date: run `python -m shigoto_operator.crds`"


def test_check_mode_reports_stale_files(tmp_path: Path) -> None:
    """`--check` is what CI can run; it must fail on a missing or edited file, write nothing."""
    assert crds.main(["--check", "--dir", str(tmp_path)]) == 1
    assert list(tmp_path.iterdir()) == []
    assert crds.main(["--dir", str(tmp_path)]) == 0
    assert crds.main(["--check", "--dir", str(tmp_path)]) == 0
    queue_file = tmp_path / crds.CRD_FILES[0]
    queue_file.write_text(queue_file.read_text() + "# edited\n")
    assert crds.main(["--check", "--dir", str(tmp_path)]) == 1


def test_rendered_yaml_is_the_python_data() -> None:
    for name, kind in zip(crds.CRD_FILES, CRDS, strict=True):
        assert yaml.safe_load((ROOT / "crds" / name).read_text()) == CRDS[kind]
    kustomization = yaml.safe_load((ROOT / "crds" / "kustomization.yaml").read_text())
    assert kustomization["resources"] == list(crds.CRD_FILES)


def test_module_stays_pure() -> None:
    """The renderer and the shared defaults must load without kopf, kubernetes or psycopg."""
    source = Path(crds.__file__).read_text()
    imported = set(re.findall(r"^\s*(?:from|import)\s+([A-Za-z_][\w]*)", source, re.M))
    assert not imported & {"kopf", "kubernetes", "psycopg", "shigoto"}, imported


# --- names and wiring --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "plural"), [(crds.QUEUE_KIND, "queues"), (crds.CRON_KIND, "cronschedules")]
)
def test_names_follow_the_contract(kind: str, plural: str) -> None:
    spec = CRDS[kind]["spec"]
    assert CRDS[kind]["metadata"]["name"] == f"{plural}.shigoto.dev"
    assert spec["group"] == "shigoto.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == kind
    assert spec["names"]["plural"] == plural
    assert spec["names"]["categories"] == ["shigoto"]
    assert "cs" not in spec["names"]["shortNames"], "cs is componentstatuses'"
    [version] = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"observedGeneration", "conditions"} <= set(status)


def _resolve(schema: Mapping[str, Any], json_path: str) -> Mapping[str, Any] | None:
    node: Mapping[str, Any] | None = schema
    for part in json_path.strip(".").split("."):
        node = (node or {}).get("properties", {}).get(part)
    return node


@pytest.mark.parametrize("kind", list(CRDS))
def test_printer_columns_point_at_typed_fields(kind: str) -> None:
    """A column whose path is misspelt stays silently empty; check each resolves and agrees."""
    version = CRDS[kind]["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    for column in version["additionalPrinterColumns"]:
        if column["jsonPath"] == ".metadata.creationTimestamp":
            assert column["type"] == "date"
            continue
        node = _resolve(schema, column["jsonPath"])
        assert node is not None, f"{column['name']}: {column['jsonPath']} is not in the schema"
        if column["type"] == "date":
            assert node["type"] == "string" and node.get("format") == "date-time", column
        else:
            assert node["type"] == column["type"], column


def test_queue_columns_are_the_ones_kubectl_get_queues_promises() -> None:
    columns = CRDS[crds.QUEUE_KIND]["spec"]["versions"][0]["additionalPrinterColumns"]
    default = [(c["name"], c["jsonPath"]) for c in columns if not c.get("priority")]
    assert default == [
        ("Queue", ".spec.queueName"),
        ("Concurrency", ".spec.concurrency"),
        ("Ready", ".status.readyReplicas"),
        ("Desired", ".status.desiredReplicas"),
        ("Available", ".status.jobs.available"),
        ("Executing", ".status.jobs.executing"),
        ("Discarded", ".status.jobs.discarded"),
        ("Age", ".metadata.creationTimestamp"),
    ]
    cron = CRDS[crds.CRON_KIND]["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in cron if not c.get("priority")] == [
        "Schedule",
        "Suspend",
        "Last Schedule",
        "Next Schedule",
        "Age",
    ]


def test_exported_spec_schemas_are_the_ones_in_the_crds() -> None:
    """The operator imports QUEUE_SCHEMA / CRON_SCHEMA: they must be what the CRDs carry."""
    assert root_schema(crds.QUEUE_KIND)["properties"]["spec"] == crds.QUEUE_SCHEMA
    assert root_schema(crds.CRON_KIND)["properties"]["spec"] == crds.CRON_SCHEMA
    assert root_schema(crds.QUEUE_KIND)["properties"]["status"] == crds.QUEUE_STATUS_SCHEMA
    assert root_schema(crds.CRON_KIND)["properties"]["status"] == crds.CRON_STATUS_SCHEMA


# --- structural schema -------------------------------------------------------------------------


def _walk(node: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}" if path else name)
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from _walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


def structural_violations(schema: Mapping[str, Any]) -> list[str]:
    """The apiextensions.k8s.io/v1 structural-schema rules (and a few of our own)."""
    found = []
    for path, node in _walk(schema, ""):
        where = path or "<root>"
        if "type" not in node and not (
            node.get("x-kubernetes-preserve-unknown-fields")
            or node.get("x-kubernetes-int-or-string")
        ):
            found.append(f"{where}: no type")
        if "properties" in node and "additionalProperties" in node:
            found.append(f"{where}: both properties and additionalProperties")
        for junctor in ("allOf", "anyOf", "oneOf", "not"):
            if junctor in node:
                found.append(f"{where}: uses {junctor} (keep the schema junctor-free)")
        for name in node.get("required", []):
            if name not in node.get("properties", {}):
                found.append(f"{where}: requires unknown field {name}")
        if "enum" in node:
            python_type = {"string": str, "integer": int}[node["type"]]
            if not all(isinstance(v, python_type) for v in node["enum"]):
                found.append(f"{where}: enum values are not {node['type']}")
        if "default" in node:
            errors = list(
                jsonschema.Draft7Validator(to_json_schema(node)).iter_errors(
                    crds.apply_defaults(node, node["default"])
                )
            )
            if errors:
                found.append(f"{where}: default {node['default']!r} fails its own schema")
            if path.startswith("metadata"):
                found.append(f"{where}: defaults under metadata are not allowed")
    metadata = schema.get("properties", {}).get("metadata", {})
    if set(metadata.get("properties", {})) - {"name", "generateName"}:
        found.append("metadata: only name and generateName may be restricted")
    return found


@pytest.mark.parametrize("kind", list(CRDS))
def test_schema_is_structural(kind: str) -> None:
    assert structural_violations(root_schema(kind)) == []


def _nodes(schema: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every schema node with its path, the root included."""
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), Mapping):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from _nodes(schema["additionalProperties"], f"{path}.*")


def rule_failures_on(schema: Mapping[str, Any], value: Any, path: str) -> list[str]:
    """CEL rules of `schema` and below that do not hold on `value`, errors included.

    The API server validates a default exactly as written, before nested defaults fill it,
    and refuses the whole CRD when a rule errs on it ("no such key"). cel-python raises
    (or returns an error object) where the server's CEL would, so both count as failures.
    """
    failures = []
    try:
        failures = [f"{r.path}: {r.rule}" for r in cel_rejections(schema, value, path)]
    except Exception as exc:  # cel-python raises on some evaluation errors
        failures.append(f"{path}: {exc}")
    return failures


@pytest.mark.parametrize("kind", list(CRDS))
def test_every_rule_holds_on_its_default_as_the_api_server_checks_it(kind: str) -> None:
    """The regression a real API server found: `autoscaling` defaults to `{}`, and a rule
    reading `self.minReplicas` failed on it, so `kubectl apply -k crds/` refused the CRD."""
    failures = []
    for path, node in _nodes(root_schema(kind)):
        if "default" in node:
            failures += rule_failures_on(node, copy.deepcopy(node["default"]), path)
    assert failures == []


@pytest.mark.parametrize("kind", list(CRDS))
def test_every_object_rule_holds_on_a_partial_object(kind: str) -> None:
    """An object node with rules must accept `{}` (every field left out): a rule may compare
    fields only once both are there (`has()`), since defaults may not have filled them."""
    failures = []
    for path, node in _nodes(root_schema(kind)):
        if node.get("x-kubernetes-validations") and node.get("type") == "object":
            for check in node["x-kubernetes-validations"]:
                failures += rule_failures_on(
                    {"x-kubernetes-validations": [check]}, {}, f"{path} ({check['rule']})"
                )
    assert failures == []


def test_the_default_check_fails_on_the_rule_that_broke_real_clusters() -> None:
    """Proof the two tests above can fail: the original rule errs on the `{}` default."""
    node = {
        "type": "object",
        "default": {},
        "properties": {"minReplicas": {"type": "integer"}, "maxReplicas": {"type": "integer"}},
        "x-kubernetes-validations": [{"rule": "self.minReplicas <= self.maxReplicas"}],
    }
    assert rule_failures_on(node, node["default"], ".spec.autoscaling") != []


def test_structural_check_catches_each_violation() -> None:
    """The check above proves nothing unless it fails on schemas that break the rules."""
    broken = {
        "type": "object",
        "required": ["missing"],
        "properties": {
            "metadata": {"type": "object", "properties": {"labels": {"type": "object"}}},
            "untyped": {"description": "no type"},
            "both": {
                "type": "object",
                "properties": {},
                "additionalProperties": {"type": "string"},
            },
            "junctor": {"type": "string", "anyOf": [{"pattern": "a"}]},
            "bad_default": {"type": "integer", "minimum": 1, "default": 0},
            "bad_enum": {"type": "integer", "enum": ["1"]},
        },
    }
    found = structural_violations(broken)
    assert [v.split(":")[0] for v in found] == [
        "<root>",
        "untyped",
        "both",
        "junctor",
        "bad_default",
        "bad_enum",
        "metadata",
    ], found


@pytest.mark.parametrize("kind", list(CRDS))
def test_unknown_fields_are_preserved_only_where_intended(kind: str) -> None:
    preserved = {
        path
        for path, node in _walk(root_schema(kind), "")
        if node.get("x-kubernetes-preserve-unknown-fields")
    }
    assert preserved == PRESERVE_UNKNOWN[kind]
    status = root_schema(kind)["properties"]["status"]
    assert not status.get("x-kubernetes-preserve-unknown-fields"), "status must be typed"


@pytest.mark.parametrize("kind", list(CRDS))
def test_every_spec_field_is_described(kind: str) -> None:
    """`kubectl explain` shows these; an undocumented field is a question in a support queue."""
    spec = root_schema(kind)["properties"]["spec"]
    bare = [
        path
        for path, node in _walk(spec, "spec")
        if not path.endswith("[]") and not path.endswith("*") and not node.get("description")
    ]
    assert bare == []


# --- defaults ----------------------------------------------------------------------------------


def test_minimal_queue_gets_the_documented_defaults() -> None:
    spec = crds.queue_defaults(
        {"runner": {"image": "shigoto-runner:0.1.0"}, "database": {"secretRef": {"name": "db"}}}
    )
    assert spec == {
        "concurrency": 10,
        "paused": False,
        "fanout": False,
        "fair": False,
        "weight": 1,
        "database": {
            "secretRef": {"name": "db", "key": "url"},
            "schema": "public",
            "migrate": True,
        },
        "runner": {
            "image": "shigoto-runner:0.1.0",
            "shutdownTimeoutSeconds": 15,
            "healthPort": 8000,
        },
        "autoscaling": {
            "mode": "operator",
            "minReplicas": 0,
            "maxReplicas": 10,
            "targetJobsPerReplica": 100,
            "scaleDownStabilizationSeconds": 300,
            "pollIntervalSeconds": 10,
        },
    }
    assert "queueName" not in spec, "queueName defaults to metadata.name, in the operator"
    assert "globalConcurrency" not in spec


def test_minimal_cron_gets_the_documented_defaults() -> None:
    spec = crds.cron_defaults(
        {"schedule": "@daily", "worker": "w", "database": {"secretRef": {"name": "db"}}}
    )
    assert spec == {
        "schedule": "@daily",
        "timeZone": "UTC",
        "worker": "w",
        "args": {},
        "queue": "default",
        "priority": 0,
        "suspend": False,
        "catchUp": "latest",
        "catchUpLimit": 100,
        "database": {
            "secretRef": {"name": "db", "key": "url"},
            "schema": "public",
            "migrate": True,
        },
    }
    assert "maxAttempts" not in spec


def test_defaults_keep_what_is_given_and_never_share_state() -> None:
    given = {"autoscaling": {"maxReplicas": 3}, "runner": {"image": "x"}}
    spec = crds.queue_defaults(given)
    assert spec["autoscaling"]["maxReplicas"] == 3
    assert spec["autoscaling"]["minReplicas"] == 0
    assert given == {"autoscaling": {"maxReplicas": 3}, "runner": {"image": "x"}}
    spec["autoscaling"]["minReplicas"] = 99
    assert crds.queue_defaults({})["autoscaling"]["minReplicas"] == 0


# --- the examples validate ---------------------------------------------------------------------


def _yaml_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every Shigoto object in deploy/examples/ and in the Kubernetes guide's YAML blocks."""
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc:
                yield f"{path.relative_to(ROOT)}#{i}", doc
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S)
    for n, block in enumerate(blocks):
        for i, doc in enumerate(yaml.safe_load_all(block)):
            if doc:
                yield f"docs/kubernetes.md block {n}#{i}", doc


SHIGOTO_OBJECTS = [
    pytest.param(doc, id=where)
    for where, doc in _yaml_documents()
    if doc.get("apiVersion") == crds.API_VERSION
]


def test_examples_cover_both_kinds() -> None:
    kinds = {param.values[0]["kind"] for param in SHIGOTO_OBJECTS}
    assert kinds == {crds.QUEUE_KIND, crds.CRON_KIND}


@pytest.mark.parametrize("obj", SHIGOTO_OBJECTS)
def test_example_is_accepted(obj: dict[str, Any]) -> None:
    _, rejections = admit(obj)
    assert rejections == []


def test_reference_example_uses_every_queue_field() -> None:
    """queue-all-fields.yaml is the reference: it must not fall behind the schema."""
    doc = yaml.safe_load((EXAMPLES / "queue-all-fields.yaml").read_text())

    def leaves(schema: Mapping[str, Any], value: Any, path: str) -> set[str]:
        found = {path}
        if "properties" in schema and isinstance(value, dict):
            for name, sub in schema["properties"].items():
                if name in value:
                    found |= leaves(sub, value[name], f"{path}.{name}")
        return found

    declared = {p for p, node in _walk(crds.QUEUE_SCHEMA, "spec") if "[]" not in p and "*" not in p}
    assert declared - leaves(crds.QUEUE_SCHEMA, doc["spec"], "spec") == set()


def test_examples_name_workers_that_exist() -> None:
    """The example Queue imports, and the CronSchedule enqueues, what the worker package has.

    Read with `ast`, not imported: importing would register the workers in this process."""
    source = (EXAMPLES / "worker" / "shigoto_example" / "workers.py").read_text()
    functions = {
        node.name
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    queue = yaml.safe_load((EXAMPLES / "queue.yaml").read_text())
    assert queue["spec"]["runner"]["imports"] == ["shigoto_example.workers"]
    cron = yaml.safe_load((EXAMPLES / "cronschedule.yaml").read_text())
    module_name, _, function = cron["spec"]["worker"].rpartition(".")
    assert module_name == "shigoto_example.workers" and function in functions


# --- bad input is rejected, each by the rule meant to catch it ---------------------------------


def _queue(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "database": {"secretRef": {"name": "shigoto-db"}},
        "runner": {"image": "shigoto-runner:0.1.0"},
    }
    base.update(spec)
    return {
        "apiVersion": crds.API_VERSION,
        "kind": "Queue",
        "metadata": {"name": "q", "namespace": "default"},
        "spec": base,
    }


def _cron(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schedule": "*/5 * * * *",
        "worker": "shop.workers.report",
        "database": {"secretRef": {"name": "shigoto-db"}},
    }
    base.update(spec)
    return {
        "apiVersion": crds.API_VERSION,
        "kind": "CronSchedule",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": base,
    }


def _without(obj: dict[str, Any], *path: str) -> dict[str, Any]:
    node = obj
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return obj


AS = {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}
MIN_MAX = (
    "cel: !has(self.minReplicas) || !has(self.maxReplicas) || "
    "self.minReplicas <= self.maxReplicas @ .spec.autoscaling"
)
DB = {"secretRef": {"name": "db"}}
FORWARD_SELF = f"cel: {crds.QUEUE_ROOT_VALIDATIONS[0]['rule']} @ .spec.forward"

#: (id, object, "<rejected by>: <rule> @ <path>"): each row fails one rule, and only that one.
BAD = [
    ("queue-no-runner", _without(_queue(), "spec", "runner"), "schema: required @ spec"),
    ("queue-no-image", _queue(runner={"imports": ["a"]}), "schema: required @ spec.runner"),
    ("queue-empty-image", _queue(runner={"image": ""}), "schema: minLength @ spec.runner.image"),
    ("queue-no-database", _without(_queue(), "spec", "database"), "schema: required @ spec"),
    ("queue-no-secret-name", _queue(database={"secretRef": {"key": "url"}}),
     "schema: required @ spec.database.secretRef"),
    ("queue-concurrency-0", _queue(concurrency=0), "schema: minimum @ spec.concurrency"),
    ("queue-concurrency-big", _queue(concurrency=10001), "schema: maximum @ spec.concurrency"),
    ("queue-concurrency-text", _queue(concurrency="10"), "schema: type @ spec.concurrency"),
    ("queue-global-0", _queue(globalConcurrency=0), "schema: minimum @ spec.globalConcurrency"),
    ("queue-negative-min", _queue(autoscaling={"minReplicas": -1}),
     "schema: minimum @ spec.autoscaling.minReplicas"),
    ("queue-max-0", _queue(autoscaling={"maxReplicas": 0}),
     "schema: minimum @ spec.autoscaling.maxReplicas"),
    ("queue-target-0", _queue(autoscaling={"targetJobsPerReplica": 0}),
     "schema: minimum @ spec.autoscaling.targetJobsPerReplica"),
    ("queue-poll-0", _queue(autoscaling={"pollIntervalSeconds": 0}),
     "schema: minimum @ spec.autoscaling.pollIntervalSeconds"),
    ("queue-name-space", _queue(queueName="two words"), "schema: pattern @ spec.queueName"),
    ("queue-name-comma", _queue(queueName="a,b"), "schema: pattern @ spec.queueName"),
    ("queue-name-equals", _queue(queueName="a=5"), "schema: pattern @ spec.queueName"),
    ("queue-name-long", _queue(queueName="q" * 129), "schema: maxLength @ spec.queueName"),
    ("queue-bad-pull-policy", _queue(runner={"image": "x", "imagePullPolicy": "Sometimes"}),
     "schema: enum @ spec.runner.imagePullPolicy"),
    ("queue-bad-mode", _queue(autoscaling={"mode": "hpa"}), "schema: enum @ spec.autoscaling.mode"),
    ("queue-bad-schema-name", _queue(database={**DB, "schema": "x; drop table"}),
     "schema: pattern @ spec.database.schema"),
    ("queue-bad-import", _queue(runner={"image": "x", "imports": ["a,b"]}),
     "schema: pattern @ spec.runner.imports.0"),
    ("queue-env-without-name", _queue(runner={"image": "x", "env": [{"value": "1"}]}),
     "schema: required @ spec.runner.env.0"),
    ("queue-shutdown-0", _queue(runner={"image": "x", "shutdownTimeoutSeconds": 0}),
     "schema: minimum @ spec.runner.shutdownTimeoutSeconds"),
    ("queue-health-port", _queue(runner={"image": "x", "healthPort": 70000}),
     "schema: maximum @ spec.runner.healthPort"),
    ("queue-typo", _queue(concurency=5), "schema: additionalProperties @ spec"),
    ("queue-object-name-long",
     {**_queue(), "metadata": {"name": "q" * (crds.MAX_QUEUE_OBJECT_NAME + 1)}},
     "schema: maxLength @ metadata.name"),
    ("queue-min-above-max", _queue(**AS), MIN_MAX),
    # maxReplicas left out: its default (10) is what minReplicas is compared with
    ("queue-min-above-default-max", _queue(autoscaling={"minReplicas": 11}), MIN_MAX),
    ("queue-forward-retryable", _queue(forward={"retryable": "done"}),
     "schema: additionalProperties @ spec.forward"),
    ("queue-job-defaults-zero-attempts", _queue(jobDefaults={"maxAttempts": 0}),
     "schema: minimum @ spec.jobDefaults.maxAttempts"),
    ("queue-job-defaults-empty-backoff", _queue(jobDefaults={"backoffSeconds": []}),
     "schema: minItems @ spec.jobDefaults.backoffSeconds"),
    ("queue-forward-bad-name", _queue(forward={"discarded": "two words"}),
     "schema: pattern @ spec.forward.discarded"),
    ("queue-forward-long-name", _queue(forward={"cancelled": "q" * 129}),
     "schema: maxLength @ spec.forward.cancelled"),
    ("queue-forward-list", _queue(forward=["q-dead"]), "schema: type @ spec.forward"),
    ("queue-fanout-text", _queue(fanout="true"), "schema: type @ spec.fanout"),
    ("queue-fanout-number", _queue(fanout=1), "schema: type @ spec.fanout"),
    # metadata.name is q, which is the queue's name while queueName is left out
    ("queue-forward-to-itself-by-default", _queue(forward={"discarded": "q"}), FORWARD_SELF),
    ("queue-forward-to-itself", _queue(queueName="mail", forward={"cancelled": "mail"}),
     FORWARD_SELF),
    ("cron-no-schedule", _without(_cron(), "spec", "schedule"), "schema: required @ spec"),
    ("cron-four-fields", _cron(schedule="* * * *"), "schema: pattern @ spec.schedule"),
    ("cron-six-fields", _cron(schedule="0 0 3 * * *"), "schema: pattern @ spec.schedule"),
    ("cron-unknown-alias", _cron(schedule="@often"), "schema: pattern @ spec.schedule"),
    ("cron-garbage", _cron(schedule="every day"), "schema: pattern @ spec.schedule"),
    ("cron-no-worker", _without(_cron(), "spec", "worker"), "schema: required @ spec"),
    ("cron-empty-worker", _cron(worker=""), "schema: minLength @ spec.worker"),
    ("cron-no-database", _without(_cron(), "spec", "database"), "schema: required @ spec"),
    ("cron-bad-catch-up", _cron(catchUp="some"), "schema: enum @ spec.catchUp"),
    ("cron-attempts-0", _cron(maxAttempts=0), "schema: minimum @ spec.maxAttempts"),
    ("cron-args-list", _cron(args=[1, 2]), "schema: type @ spec.args"),
    ("cron-bad-queue", _cron(queue="bad queue"), "schema: pattern @ spec.queue"),
    ("cron-bad-zone", _cron(timeZone="Europe Oslo"), "schema: pattern @ spec.timeZone"),
    ("cron-suspend-text", _cron(suspend="yes"), "schema: type @ spec.suspend"),
]  # fmt: skip


@pytest.mark.parametrize(("obj", "expected"), [pytest.param(o, e, id=i) for i, o, e in BAD])
def test_bad_object_is_rejected_by_the_intended_rule(obj: dict[str, Any], expected: str) -> None:
    _, rejections = admit(obj)
    assert rejections, "accepted"
    assert [f"{r.by}: {r.rule} @ {r.path}" for r in rejections] == [expected], rejections


def test_cel_message_names_both_fields() -> None:
    _, [rejection] = admit(_queue(**AS))
    assert "minReplicas" in rejection.message and "maxReplicas" in rejection.message


@pytest.mark.parametrize(
    "schedule",
    [
        "*/5 * * * *",
        "0 3 * * *",
        "0 0 1 JAN MON-FRI",
        "0  9\t* * 1-5",
        "@hourly",
        "@daily",
        "@midnight",
        "@weekly",
        "@monthly",
        "@yearly",
        "@annually",
        "15 2 L * ?",
    ],
)
def test_schedule_pattern_accepts_cron_shapes(schedule: str) -> None:
    assert admit(_cron(schedule=schedule))[1] == []


def test_cron_shapes_the_schema_accepts_are_the_runners_shapes() -> None:
    """The CRD checks shape only; the operator calls shigoto.cron.expression for full validity, and
    every shape-valid, range-valid expression here must parse there too."""
    cronspec = pytest.importorskip("shigoto.cron.expression")
    for schedule in ["*/5 * * * *", "0 3 * * *", "0 0 1 JAN MON-FRI", "@hourly", "@annually"]:
        cronspec.parse(schedule, "UTC")


def test_forwarding_to_other_queues_is_fine() -> None:
    """The self-forwarding rule compares with queueName when given, else metadata.name."""
    assert admit(_queue(forward={"discarded": "q-dead", "cancelled": "q-cancelled"}))[1] == []
    assert admit(_queue(queueName="mail", forward={"discarded": "q"}))[1] == []
    assert admit(_queue(forward={}))[1] == []


def test_forward_self_message_says_how_to_fix() -> None:
    _, [rejection] = admit(_queue(forward={"discarded": "q"}))
    assert rejection.path == ".spec.forward" and "-dead" in rejection.message


def test_a_rate_limit_is_checked_by_the_schema_and_its_rules() -> None:
    defaulted, rejections = admit(_queue(rateLimit={"limit": 50, "per": 10}))
    assert rejections == []
    assert defaulted["spec"]["rateLimit"] == {
        "limit": 50, "per": 10, "algorithm": "gcra", "burst": 0, "byPartition": False,
    }  # fmt: skip
    _, [leaky] = admit(_queue(rateLimit={"limit": 5, "algorithm": "leaky_bucket", "burst": 2}))
    assert leaky.path == ".spec.rateLimit.burst" and "leave burst at 0" in leaky.message
    _, [window] = admit(_queue(rateLimit={"limit": 9999, "burst": 5,
                                          "algorithm": "sliding_window"}))  # fmt: skip
    assert window.path == ".spec.rateLimit.limit"
    for bad in ({"per": 1}, {"limit": 1, "per": 0}, {"limit": 1, "algorithm": "fast"}):
        assert admit(_queue(rateLimit=bad))[1], bad


def test_fair_weight_and_partition_concurrency_have_bounds() -> None:
    assert admit(_queue(fair=True, weight=3, partitionConcurrency=2))[1] == []
    assert admit(_queue(weight=0))[1]
    assert admit(_queue(partitionConcurrency=0))[1]
    assert admit(_queue(fair="yes"))[1]


def test_fanout_is_a_boolean_defaulting_to_false() -> None:
    assert admit(_queue(fanout=True))[1] == []
    assert crds.queue_defaults(_queue()["spec"])["fanout"] is False
    assert crds.queue_defaults(_queue(fanout=True)["spec"])["fanout"] is True


def test_equal_min_and_max_is_fine() -> None:
    assert admit(_queue(autoscaling={"minReplicas": 4, "maxReplicas": 4}))[1] == []


# --- the guide documents every field -----------------------------------------------------------


@pytest.mark.parametrize("schema", [crds.QUEUE_SCHEMA, crds.CRON_SCHEMA], ids=["Queue", "Cron"])
def test_guide_lists_every_spec_field(schema: Mapping[str, Any]) -> None:
    text = DOCS.read_text()
    fields = [
        p.removeprefix("spec.")
        for p, _ in _walk(schema, "spec")
        if p != "spec" and "[]" not in p and "*" not in p
    ]
    missing = [f for f in fields if f"`{f}`" not in text]
    assert missing == [], f"docs/kubernetes.md does not document {missing}"
