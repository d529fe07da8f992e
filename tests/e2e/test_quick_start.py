"""docs/quick-start.md, followed word for word on a real cluster.

The page's shell blocks marked `# quick-start: <step>` run here in order, through `bash`, at
the repository root, with `KUBECONFIG` set to the cluster under test: build, load, install,
example, enqueue, watch, upgrade, uninstall. Only what must differ on a test cluster is
substituted, each line said below:

- `make images ...`: `PYTHON_IMAGE=$SHIGOTO_E2E_PYTHON_IMAGE DOCKER_BUILD_FLAGS='--network
  host'` appended when that variable is set (the default base image cannot be pulled).
- `kind load docker-image IMG...`: `SHIGOTO_E2E_LOAD_IMAGE` run for each IMG.
- `kubectl apply|delete -k deploy/examples`: the same, through an overlay of deploy/examples
  that drops the throwaway PostgreSQL (its image cannot be pulled here) and points the Secret
  `shigoto-db` at a fresh database on `SHIGOTO_E2E_DATABASE_URL`'s server, by IP: a test
  cluster without cluster DNS cannot resolve the example's Service name
  (postgres.shigoto-demo.svc.cluster.local) from pods.
- `kubectl -n shigoto-demo rollout status deploy/postgres ...`: dropped with it.

It installs the release the page builds into shigoto-system, as the rest of the suite's
`installed` fixture does, so it runs after every other e2e test (tests/e2e/conftest.py);
whatever happens, it ends by running the page's uninstall block, leaving the cluster without
Shigoto.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import ROOT, Kube, missing_for_pods

PAGE = ROOT / "docs" / "quick-start.md"
STEPS = ["build", "load", "install", "example", "enqueue", "watch", "upgrade", "uninstall"]
BLOCK = re.compile(r"^```sh\n# quick-start: (?P<step>[\w-]+)\n(?P<body>.*?)^```$", re.M | re.S)


def page_blocks() -> dict[str, str]:
    """The marked blocks of the page, by step, in page order."""
    return {m["step"]: m["body"] for m in BLOCK.finditer(PAGE.read_text())}


def test_the_page_has_every_step_in_order() -> None:
    assert list(page_blocks()) == STEPS


def commands(body: str) -> list[str]:
    """One shell command per entry, backslash-continued lines joined."""
    return [c.strip() for c in body.replace("\\\n", " ").splitlines() if c.strip()]


def substitute(command: str, overlay: Path) -> list[str]:
    """What runs here for one command of the page (the module docstring says why)."""
    argv = shlex.split(command)
    if argv[:2] == ["make", "images"] and os.environ.get("SHIGOTO_E2E_PYTHON_IMAGE"):
        base = os.environ["SHIGOTO_E2E_PYTHON_IMAGE"]
        return [f"{command} PYTHON_IMAGE={base} DOCKER_BUILD_FLAGS='--network host'"]
    if argv[:3] == ["kind", "load", "docker-image"]:
        load = os.environ["SHIGOTO_E2E_LOAD_IMAGE"]
        return [load.replace("{image}", image) for image in argv[3:]]
    if "-k deploy/examples" in command:
        return [command.replace("-k deploy/examples", f"-k {overlay}")]
    if "rollout status deploy/postgres" in command:
        return []
    return [command]


def example_overlay(directory: Path, database_url: str) -> Path:
    base = os.path.relpath(ROOT / "deploy" / "examples", directory)
    delete = [
        {"$patch": "delete", "apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "postgres", "namespace": "shigoto-demo"}},
        {"$patch": "delete", "apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "postgres", "namespace": "shigoto-demo"}},
        {"$patch": "delete", "apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": "postgres", "namespace": "shigoto-demo"}},
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": "shigoto-db", "namespace": "shigoto-demo"},
         "stringData": {"url": database_url}},
    ]  # fmt: skip
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [base],
        "patches": [{"patch": yaml.safe_dump(p)} for p in delete],
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


def run_step(step: str, body: str, overlay: Path, env: dict[str, str], log: list[str]) -> None:
    for command in commands(body):
        for actual in substitute(command, overlay):
            result = subprocess.run(
                ["bash", "-o", "pipefail", "-c", actual],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            log.append(f"[{step}] $ {actual}\n{result.stdout}{result.stderr}")
            assert result.returncode == 0, "\n".join(log[-3:])


@pytest.mark.timeout(2400)  # two image builds and loads, a scale-up, 60 s before scale-down
def test_quick_start_word_for_word(kube: Kube, fresh_db: str, tmp_path: Path) -> None:
    reason = missing_for_pods(kube)
    if reason:
        pytest.skip(f"in-cluster test: {reason}")
    overlay = example_overlay(tmp_path / "example", fresh_db)
    env = {**os.environ, "KUBECONFIG": kube.kubeconfig}
    blocks = page_blocks()
    log: list[str] = []
    try:
        for step in STEPS[:-1]:
            run_step(step, blocks[step], overlay, env, log)
        queue = kube.get("-n", "shigoto-demo", "queue/example")
        assert queue is not None
        assert queue["status"]["jobs"]["completed"] >= 1, queue["status"]
        runner = kube.get("-n", "shigoto-demo", "deploy/shigoto-runner-example")
        assert runner is not None and runner["spec"]["replicas"] == 0
    except AssertionError:
        # What the page's user would look at next, before the uninstall removes it.
        for argv in (("get", "queues,deployments,pods,events", "-A", "-o", "wide"),
                     ("get", "queues", "-A", "-o", "yaml"),
                     ("-n", "shigoto-system", "logs", "deploy/shigoto-operator", "--tail=80")):
            shown = subprocess.run(["kubectl", *argv], env=env, capture_output=True, text=True)
            log.append(f"$ kubectl {' '.join(argv)}\n{shown.stdout}{shown.stderr}")
        raise
    finally:
        # the uninstall names the newest release's file: write it if the run stopped earlier
        subprocess.run(["make", "-s", "release", "VERSION=0.2.0"], cwd=ROOT, capture_output=True)
        run_step("uninstall", blocks["uninstall"], overlay, env, log)
        print("\n".join(log))
    for crd in ("queues.shigoto.dev", "cronschedules.shigoto.dev", "clusterkopfpeerings.kopf.dev"):
        assert kube.get(f"crd/{crd}") is None
    assert kube.get("namespace/shigoto-system") is None
    assert kube.get("namespace/shigoto-demo") is None
