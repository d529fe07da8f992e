"""The real operator, in-process, against kmock's Kubernetes emulator (see the recipe in
../shared/examples/kopf_against_kmock.py).

kmock serves only what it is told about, keeps no resourceVersions, assigns no uid or
generation, validates nothing and collects no garbage, so this harness plays the API server's
part where the operator relies on it: objects are created with a uid and generation 1, and a
spec patch bumps the generation. Everything else goes through kmock's HTTP API, as kubectl
would, so kopf sees real watch events.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import threading
import uuid
import warnings
from collections.abc import AsyncIterator
from typing import Any

import kopf

import shigoto_operator  # registers the handlers on kopf's default registry
from shigoto_operator import crds, k8s
from tests.support.waiting import until

NAMESPACE = "shop"
DEADLINE = 30.0

#: The API server the login handler below answers with; set while an operator runs. The login
#: handler is registered once, on the default registry, which only these tests run.
_SERVER: dict[str, str] = {}


@kopf.on.login(registry=kopf.get_default_registry())
def _login_to_kmock(**_: Any) -> kopf.ConnectionInfo:
    return kopf.ConnectionInfo(server=_SERVER["url"], insecure=True)


def declare(kmock: Any) -> None:
    """The built-in kinds plus ours, with the verbs kopf needs to watch them."""
    with warnings.catch_warnings():  # kmock 0.8 reads its bundle with a deprecated call
        warnings.simplefilter("ignore", DeprecationWarning)
        kmock.resources.load_bundled()
    for plural, kind in ((crds.QUEUE_PLURAL, crds.QUEUE_KIND), (crds.CRON_PLURAL, crds.CRON_KIND)):
        kmock.resources[f"{crds.GROUP}/{crds.VERSION}/{plural}"] = {
            "kind": kind,
            "singular": kind.lower(),
            "namespaced": True,
            "verbs": ["list", "watch", "get", "patch", "create", "update", "delete"],
        }


#: Waits on the emulated cluster: the shared poll, with this harness's deadline, less often.
eventually = functools.partial(until, timeout=DEADLINE, step=0.1)


class Cluster:
    """The emulated cluster, spoken to through its API like kubectl would."""

    def __init__(self, kmock: Any) -> None:
        self.kmock = kmock
        self.namespace = NAMESPACE

    def add_secret(self, name: str, data: dict[str, str]) -> None:
        """Secrets are only ever read by the operator (GET), so they are stored directly."""
        self.kmock.objects["v1/secrets", self.namespace, name] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": self.namespace},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }

    def secret(self, name: str) -> dict[str, str]:
        raw = self.kmock.objects["v1/secrets", self.namespace, name]
        return {k: base64.b64decode(v).decode() for k, v in dict(raw["data"]).items()}

    async def create(
        self, resource: k8s.Resource, kind: str, name: str, spec: dict[str, Any]
    ) -> None:
        await k8s.create(
            resource,
            self.namespace,
            {
                "apiVersion": f"{crds.GROUP}/{crds.VERSION}",
                "kind": kind,
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "uid": str(uuid.uuid4()),
                    "generation": 1,
                    # kopf guards some patches with a JSON-patch test on it; kmock never bumps it
                    "resourceVersion": "1",
                },
                "spec": spec,
            },
        )

    async def patch_spec(self, resource: k8s.Resource, name: str, spec: dict[str, Any]) -> None:
        """A spec change, with the generation bump the API server would make."""
        current = await k8s.get(resource, self.namespace, name)
        assert current is not None
        generation = int(current["metadata"].get("generation") or 1) + 1
        await k8s.patch(
            resource, self.namespace, name, {"metadata": {"generation": generation}, "spec": spec}
        )

    async def get(self, resource: k8s.Resource, name: str) -> dict[str, Any] | None:
        return await k8s.get(resource, self.namespace, name)

    async def delete(self, resource: k8s.Resource, name: str) -> None:
        await k8s.delete(resource, self.namespace, name)

    async def deployment(self, queue: str) -> dict[str, Any] | None:
        return await k8s.get(k8s.DEPLOYMENTS, self.namespace, f"shigoto-runner-{queue}")

    async def status(self, resource: k8s.Resource, name: str) -> dict[str, Any]:
        obj = await self.get(resource, name)
        return dict((obj or {}).get("status") or {})

    async def condition(self, resource: k8s.Resource, name: str, type_: str) -> dict[str, Any]:
        for c in (await self.status(resource, name)).get("conditions") or []:
            if c.get("type") == type_:
                return dict(c)
        return {}

    def event_reasons(self) -> list[str]:
        """Reasons of the Events posted so far, oldest first. Read from kmock's request log:
        kopf names Events with `generateName`, which kmock does not expand, so it stores
        only the first one."""
        reasons = []
        for request in list(self.kmock):
            if request.method == "POST" and request.url.path.endswith("/events"):
                reasons.append(str((request.data or {}).get("reason")))
        return reasons


@contextlib.asynccontextmanager
async def running_operator(kmock: Any) -> AsyncIterator[Cluster]:
    """Start the operator (all namespaces, standalone) against `kmock`; stop it on exit.

    The operator runs in its own thread and event loop, as it would in its own process: kopf
    waits for every task of its loop to end when it stops, and kmock's server-side watch
    streams, in the test's loop, never do.
    """
    assert shigoto_operator.handlers is not None
    declare(kmock)
    url = str(kmock.url).rstrip("/")
    _SERVER["url"] = url
    k8s.configure(url, verify_ssl=False)
    stop = threading.Event()
    ready = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(
                kopf.operator(
                    registry=kopf.get_default_registry(),
                    clusterwide=True,
                    standalone=True,
                    stop_flag=stop,
                    ready_flag=ready,
                )
            )
        except BaseException as exc:  # reported by the test, not lost in the thread
            failure.append(exc)
            ready.set()

    thread = threading.Thread(target=run, name="shigoto-operator", daemon=True)
    thread.start()
    try:
        assert await asyncio.to_thread(ready.wait, DEADLINE), "the operator did not start"
        assert not failure, f"the operator failed to start: {failure}"
        yield Cluster(kmock)
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 60)
        k8s.configure(None)
        _SERVER.clear()
    assert not thread.is_alive(), "the operator did not stop within 60 s"
    assert not failure, f"the operator failed: {failure}"
