"""The operator's Kubernetes API calls; the only module that imports the Kubernetes client.

Why the official client, and why this way:

- kopf watches Queues and CronSchedules, runs the handlers and posts Events, but offers no
  public API to create, patch or delete *other* objects (its HTTP layer is private). The
  official `kubernetes` client is already installed (the `operator` extra) and kopf's default
  login loads the same in-cluster or kubeconfig credentials.
- Every object goes through `CustomObjectsApi`, Deployments included: its body is an opaque
  dict, sent verbatim. The typed `AppsV1Api` of kubernetes>=35 first converts a body into
  pydantic models, which can drop or reject fields the installed client does not know; here the
  API server (or, in the tests, kmock) sees exactly what `builders` returned, and the answer
  comes back as the plain JSON dict the pure modules work on. The path
  `/apis/apps/v1/namespaces/<ns>/deployments` is the same one AppsV1Api uses.
- Patches are JSON merge patches (RFC 7386): `builders` computes them against the live object,
  so lists are replaced whole and removed fields are nulled; no strategic-merge surprises.
- The client is synchronous; every call runs in a thread of this module's own executor (not
  asyncio's default one, which database work also uses, so a stuck database can never starve
  API calls of threads) with a
  request timeout, so a slow API server never blocks kopf's event loop.

Configuration: in-cluster service account, else kubeconfig (as kopf does), loaded on first use;
`configure()` points it elsewhere (the tests' kmock).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from kubernetes import client, config

from shigoto_operator import crds

MERGE_PATCH = "application/merge-patch+json"
TIMEOUT = (5.0, 30.0)  # connect, read


@dataclass(frozen=True, slots=True)
class Resource:
    group: str
    version: str
    plural: str


DEPLOYMENTS = Resource("apps", "v1", "deployments")
POD_DISRUPTION_BUDGETS = Resource("policy", "v1", "poddisruptionbudgets")
#: kopf's peering objects (cluster-scoped): see `shigoto_operator.peering`.
CLUSTER_PEERINGS = Resource("kopf.dev", "v1", "clusterkopfpeerings")
SCALED_OBJECTS = Resource("keda.sh", "v1alpha1", "scaledobjects")
QUEUES = Resource(crds.GROUP, crds.VERSION, crds.QUEUE_PLURAL)
CRON_SCHEDULES = Resource(crds.GROUP, crds.VERSION, crds.CRON_PLURAL)


class ApiError(Exception):
    """The API server refused or failed a request."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class SecretError(Exception):
    """The database Secret is missing, lacks the key, or does not hold text."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


_lock = threading.Lock()
_api: client.ApiClient | None = None


def configure(host: str | None = None, *, verify_ssl: bool = True) -> None:
    """Use this API server (e.g. the tests' kmock) instead of the in-cluster or kubeconfig
    one; `None` goes back to those."""
    global _api
    with _lock:
        if _api is not None:
            _api.close()
        _api = None
        if host is None:
            return
        cfg = client.Configuration()
        cfg.host = host
        cfg.verify_ssl = verify_ssl
        _api = client.ApiClient(cfg)


def _client() -> client.ApiClient:
    global _api
    with _lock:
        if _api is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            _api = client.ApiClient()
        return _api


def _error(exc: client.ApiException) -> ApiError:
    message = exc.reason or ""
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        message = json.loads(exc.body).get("message") or message
    return ApiError(int(exc.status or 0), message)


def _decode(response: Any) -> dict[str, Any]:
    data = response.data if hasattr(response, "data") else response
    if isinstance(data, (bytes, str)):
        return dict(json.loads(data)) if data else {}
    return dict(data or {})


def _custom() -> client.CustomObjectsApi:
    return client.CustomObjectsApi(_client())


# --- generic object calls, each run in a thread ----------------------------------------------


def _get(r: Resource, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return _decode(
            _custom().get_namespaced_custom_object(
                r.group,
                r.version,
                namespace,
                r.plural,
                name,
                _preload_content=False,
                _request_timeout=TIMEOUT,
            )
        )
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise _error(exc) from None


def _create(r: Resource, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        return _decode(
            _custom().create_namespaced_custom_object(
                r.group,
                r.version,
                namespace,
                r.plural,
                body,
                _preload_content=False,
                _request_timeout=TIMEOUT,
            )
        )
    except client.ApiException as exc:
        raise _error(exc) from None


def _patch(r: Resource, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    try:
        return _decode(
            _custom().patch_namespaced_custom_object(
                r.group,
                r.version,
                namespace,
                r.plural,
                name,
                patch,
                _content_type=MERGE_PATCH,
                _preload_content=False,
                _request_timeout=TIMEOUT,
            )
        )
    except client.ApiException as exc:
        raise _error(exc) from None


def _patch_status(r: Resource, namespace: str, name: str, status: dict[str, Any]) -> None:
    try:
        _custom().patch_namespaced_custom_object_status(
            r.group,
            r.version,
            namespace,
            r.plural,
            name,
            {"status": status},
            _content_type=MERGE_PATCH,
            _preload_content=False,
            _request_timeout=TIMEOUT,
        )
    except client.ApiException as exc:
        if exc.status == 404:
            return  # the object is gone; nothing to report on
        raise _error(exc) from None


def _delete(r: Resource, namespace: str, name: str) -> bool:
    try:
        _custom().delete_namespaced_custom_object(
            r.group,
            r.version,
            namespace,
            r.plural,
            name,
            _preload_content=False,
            _request_timeout=TIMEOUT,
        )
    except client.ApiException as exc:
        if exc.status == 404:
            return False  # already gone, or the kind is not installed (KEDA)
        raise _error(exc) from None
    return True


def _create_cluster(r: Resource, body: dict[str, Any]) -> bool:
    try:
        _custom().create_cluster_custom_object(
            r.group, r.version, r.plural, body, _preload_content=False, _request_timeout=TIMEOUT
        )
    except client.ApiException as exc:
        if exc.status == 409:
            return False  # it exists
        raise _error(exc) from None
    return True


def _list_pods(namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
    core = client.CoreV1Api(_client())
    label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    try:
        answer = _decode(
            core.list_namespaced_pod(
                namespace,
                label_selector=label_selector,
                _preload_content=False,
                _request_timeout=TIMEOUT,
            )
        )
    except client.ApiException as exc:
        raise _error(exc) from None
    return list(answer.get("items") or [])


def _patch_pod(namespace: str, name: str, patch: dict[str, Any]) -> None:
    core = client.CoreV1Api(_client())
    try:
        core.patch_namespaced_pod(
            name,
            namespace,
            patch,
            _content_type=MERGE_PATCH,
            _preload_content=False,
            _request_timeout=TIMEOUT,
        )
    except client.ApiException as exc:
        if exc.status == 404:
            return  # the pod went meanwhile
        raise _error(exc) from None


def _secret_value(namespace: str, name: str, key: str) -> str:
    core = client.CoreV1Api(_client())
    try:
        secret = _decode(
            core.read_namespaced_secret(
                name, namespace, _preload_content=False, _request_timeout=TIMEOUT
            )
        )
    except client.ApiException as exc:
        if exc.status == 404:
            raise SecretError("SecretNotFound", f"Secret {namespace}/{name} not found") from None
        if exc.status == 403:
            raise SecretError(
                "SecretForbidden", f"no permission to read Secret {namespace}/{name}"
            ) from None
        raise _error(exc) from None
    data = secret.get("data") or {}
    if key not in data:
        raise SecretError("SecretKeyMissing", f"Secret {namespace}/{name} has no key {key!r}")
    try:
        value = base64.b64decode(data[key], validate=True).decode("utf-8").strip()
    except (binascii.Error, UnicodeDecodeError):
        raise SecretError(
            "SecretInvalid", f"Secret {namespace}/{name} key {key!r} is not UTF-8 text"
        ) from None
    if not value:
        raise SecretError("SecretKeyEmpty", f"Secret {namespace}/{name} key {key!r} is empty")
    return value


# --- the async surface -------------------------------------------------------------------------

#: Threads for API calls only. Eight: the daemons of many objects may call at once, and the
#: client's connection pool (urllib3) holds about that many connections to the API server.
_executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="shigoto-k8s")

R = TypeVar("R")


async def _in_thread(fn: Callable[..., R], *args: Any) -> R:
    return await asyncio.get_running_loop().run_in_executor(_executor, functools.partial(fn, *args))


async def get(r: Resource, namespace: str, name: str) -> dict[str, Any] | None:
    """The object, or None if it (or its kind) does not exist."""
    return await _in_thread(_get, r, namespace, name)


async def create(r: Resource, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    return await _in_thread(_create, r, namespace, body)


async def patch(r: Resource, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch; returns the patched object."""
    return await _in_thread(_patch, r, namespace, name, body)


async def patch_status(r: Resource, namespace: str, name: str, status: dict[str, Any]) -> None:
    """Merge-patch the status subresource (a vanished object is not an error)."""
    await _in_thread(_patch_status, r, namespace, name, status)


async def delete(r: Resource, namespace: str, name: str) -> bool:
    """Delete; False if there was nothing to delete."""
    return await _in_thread(_delete, r, namespace, name)


async def create_cluster(r: Resource, body: dict[str, Any]) -> bool:
    """Create a cluster-scoped object; False if it exists already."""
    return await _in_thread(_create_cluster, r, body)


async def list_pods(namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
    """The pods of `namespace` whose labels match `selector`."""
    return await _in_thread(_list_pods, namespace, selector)


async def patch_pod(namespace: str, name: str, patch: dict[str, Any]) -> None:
    """A JSON merge patch of a pod (a vanished pod is not an error)."""
    await _in_thread(_patch_pod, namespace, name, patch)


async def secret_value(namespace: str, name: str, key: str) -> str:
    """The text under `key` of a Secret; raises `SecretError` saying what is wrong."""
    return await _in_thread(_secret_value, namespace, name, key)
