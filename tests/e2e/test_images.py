"""The images, built and run with a real Docker engine: what a user and the operator rely on.

For each builder, BuildKit (`DOCKER_BUILDKIT=1`) and the legacy one (`DOCKER_BUILDKIT=0`):
build the runner, the operator and the example image FROM the runner; check that they run as
10001:10001 with a read-only root filesystem and a tmpfs on /tmp; migrate a database and drain
a queue with the example image on the host network, then stop it with SIGTERM and expect exit
0; start the operator image without a cluster and see kopf run shigoto_operator's handlers.

Needs Docker (a reachable engine, not just the CLI) and the base image (here, or pullable);
skips with the reason where either is missing.
The BuildKit half skips, with the reason, where the docker CLI has no BuildKit client (a CLI
from Docker 23 on without its buildx component). Environment knobs:
  SHIGOTO_E2E_PYTHON_IMAGE  base image passed as --build-arg PYTHON_IMAGE (default: the
                            Dockerfiles' own, python:3.11-slim)
  SHIGOTO_E2E_KEEP=1        keep the images built here
Builds use `--network host`, so they work on an engine without bridge networking too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import shigoto
from tests.support.waiting import wait_until

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]


def _unavailable() -> str | None:
    """Why this machine cannot run the test, or None when it can."""
    if shutil.which("docker") is None:
        return "`docker` is not on PATH"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`docker info` failed: {error}"
    if info.returncode != 0:
        detail = (info.stderr.strip().splitlines() or ["no output"])[-1]
        return f"`docker info` failed, no Docker engine reachable ({detail})"
    return None


_REASON = _unavailable()
if _REASON:
    pytest.skip(f"image tests need a Docker engine: {_REASON}", allow_module_level=True)

# Six image builds (three per builder) take minutes, far past the suite's default.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

PYTHON_IMAGE = os.environ.get("SHIGOTO_E2E_PYTHON_IMAGE")
DEFAULT_PYTHON_IMAGE = "python:3.11-slim"  # the Dockerfiles' ARG PYTHON_IMAGE
UID = "10001:10001"
OPERATOR_CMD = ["kopf", "run", "--all-namespaces", "-m", "shigoto_operator",
                "--liveness=http://0.0.0.0:8080/healthz"]  # fmt: skip
# What every container here gets: the settings a Kubernetes pod of ours has.
READ_ONLY = ("--read-only", "--tmpfs", "/tmp")
QUEUE = "example"  # shigoto_example.workers.hello's queue
JOBS = 40
BUILDKIT_MISSING = "buildx component is missing"


def docker(*argv: str, timeout: float = 120, env: dict[str, str] | None = None,
           check: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run a docker command; on failure raise with its output, which is what a CI log needs."""
    result = subprocess.run(("docker", *argv), capture_output=True, text=True, timeout=timeout,
                            env=env)  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(
            f"docker {' '.join(argv)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result


# --- the images ----------------------------------------------------------------------------------


class Images:
    def __init__(self, builder: str) -> None:
        tag = f"images-{builder}"
        self.builder = builder
        self.runner = f"shigoto-runner:{tag}"
        self.operator = f"shigoto-operator:{tag}"
        self.example = f"shigoto-example:{tag}"

    def all(self) -> tuple[str, str, str]:
        return (self.runner, self.operator, self.example)


def _build(builder: str, *argv: str) -> None:
    env = {**os.environ, "DOCKER_BUILDKIT": "1" if builder == "buildkit" else "0"}
    result = docker("build", "--network", "host", *argv, timeout=1500, env=env, check=False)
    if result.returncode != 0 and builder == "buildkit" and BUILDKIT_MISSING in result.stderr:
        pytest.skip("this docker CLI has no BuildKit client: it needs its buildx component "
                    "(or put a docker CLI before 23.0 first on PATH)")  # fmt: skip
    if result.returncode != 0:
        raise AssertionError(
            f"{builder} build {' '.join(argv)} exited {result.returncode}\n"
            f"{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
        )


@pytest.fixture(scope="module")
def base_image() -> str:
    """The Python base both Dockerfiles build on: here already, or pulled now."""
    image = PYTHON_IMAGE or DEFAULT_PYTHON_IMAGE
    if docker("image", "inspect", image, check=False).returncode == 0:
        return image
    pulled = docker("pull", image, timeout=900, check=False)
    if pulled.returncode != 0:
        detail = (pulled.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"base image {image} is neither here nor pullable ({detail}); "
                    "name one this engine has in SHIGOTO_E2E_PYTHON_IMAGE")  # fmt: skip
    return image


@pytest.fixture(scope="module", params=["buildkit", "legacy"])
def images(request: pytest.FixtureRequest, base_image: str) -> Iterator[Images]:
    """The three images a user builds: ours, and theirs FROM ours with the example workers."""
    built = Images(request.param)
    base = ("--build-arg", f"PYTHON_IMAGE={PYTHON_IMAGE}") if PYTHON_IMAGE else ()
    try:
        _build(built.builder, *base, "-f", str(ROOT / "Dockerfile.runner"), "-t", built.runner,
               str(ROOT))  # fmt: skip
        _build(built.builder, *base, "-f", str(ROOT / "Dockerfile.operator"), "-t",
               built.operator, str(ROOT))  # fmt: skip
        _build(built.builder, "--build-arg", f"SHIGOTO_RUNNER_IMAGE={built.runner}", "-t",
               built.example, str(ROOT / "deploy" / "examples"))  # fmt: skip
        yield built
    finally:
        if os.environ.get("SHIGOTO_E2E_KEEP") != "1":
            docker("image", "rm", *built.all(), check=False)


# --- a database the container reaches ------------------------------------------------------------


class _Relay:
    """Loopback TCP in front of PostgreSQL's unix socket.

    A container on the host network shares the host's loopback, but not its files: the embedded
    server listens only on a socket in its data directory, which only its own user may enter.
    Each accepted connection is piped, both ways, to that socket (where the server trusts it).
    """

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.socket_path)
            except OSError:
                client.close()
                upstream.close()
                continue
            with self.lock:
                self.open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept loop
        self.listener.close()
        with self.lock:
            for sock in self.open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@pytest.fixture
def container_db(empty_db_url: str) -> Iterator[tuple[str, str]]:
    """(URL for this process, URL for a container on the host network) of one empty database."""
    params = conninfo_to_dict(empty_db_url)
    host = str(params.get("host") or "")
    if host and not host.startswith("/"):
        yield empty_db_url, empty_db_url  # TCP: the host network reaches it as it is
        return
    directory = host or "/var/run/postgresql"
    relay = _Relay(f"{directory}/.s.PGSQL.{params.get('port') or 5432}")
    try:
        params.update(host="127.0.0.1", port=str(relay.port))
        yield empty_db_url, make_conninfo(**params)
    finally:
        relay.close()


def count(url: str, where: str = "true") -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(f"SELECT count(*) FROM shigoto_jobs WHERE {where}").fetchone()
    assert found is not None
    return int(found[0])


def config(image: str) -> dict[str, Any]:
    """The image's configuration: User, Entrypoint, Cmd, Env, ..."""
    return json.loads(docker("image", "inspect", "-f", "{{json .Config}}", image).stdout)


# --- the tests -----------------------------------------------------------------------------------


def test_images_run_as_10001_with_the_contract_commands(images: Images) -> None:
    for image in images.all():
        user = config(image).get("User")
        assert user == UID, f"{image} runs as {user!r}"
    for image in (images.runner, images.example):
        found = config(image)
        assert (found.get("Entrypoint"), found.get("Cmd")) == (["shigoto"], ["run"]), (image, found)
    found = config(images.operator)
    assert found.get("Cmd") == OPERATOR_CMD and not found.get("Entrypoint"), found


def test_runner_starts_read_only_and_cannot_rewrite_its_code(images: Images) -> None:
    for image in (images.runner, images.example):
        out = docker("run", "--rm", *READ_ONLY, "--network", "none", image, "--help").stdout
        assert "usage: shigoto" in out and "run" in out, out
    # The virtualenv is root's: the unprivileged process can read its code, not change it.
    probe = ("import os, shigoto, shigoto_example; "
             "print(os.getuid(), os.access(shigoto.__file__, os.W_OK), "
             "os.access(os.path.dirname(shigoto_example.__file__), os.W_OK))")  # fmt: skip
    out = docker("run", "--rm", *READ_ONLY, "--network", "none", "--entrypoint", "python3",
                 images.example, "-c", probe).stdout  # fmt: skip
    assert out.split() == ["10001", "False", "False"], out


def test_example_image_drains_a_queue_and_exits_0_on_sigterm(
    images: Images, container_db: tuple[str, str]
) -> None:
    url, inside = container_db
    run = ("run", *READ_ONLY, "--network", "host", "-e", f"SHIGOTO_DATABASE_URL={inside}")

    # The migrations ship inside the wheel: the image finds them and creates the tables.
    docker(*run, "--rm", images.example, "migrate")
    assert count(url) == 0

    shigoto.enqueue_many(
        [{"worker": "shigoto_example.workers.hello", "args": {"name": str(i), "seconds": 0.05},
          "queue": QUEUE} for i in range(JOBS)],
        database_url=url,
    )  # fmt: skip
    name = f"shigoto-images-{uuid.uuid4().hex[:8]}"
    docker(*run, "-d", "--name", name, images.example, "run", "--queue", f"{QUEUE}=5",
           "--import", "shigoto_example.workers", "--no-migrate")  # fmt: skip
    try:
        try:
            wait_until(lambda: count(url, "state = 'completed'") == JOBS, timeout=180,
                       message=f"{JOBS} jobs completed by {images.example}")  # fmt: skip
        except AssertionError as error:
            logs = docker("logs", name, check=False)
            raise AssertionError(f"{error}\n{logs.stdout}\n{logs.stderr}") from error
        # `docker stop` sends SIGTERM and, only after 30 s, SIGKILL (which would be exit 137).
        docker("stop", "--time", "30", name, timeout=60)
        code = docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
        logs = docker("logs", name, check=False)
        assert code == "0", f"exit code {code}\n{logs.stdout}\n{logs.stderr}"
        assert "Traceback" not in logs.stdout + logs.stderr, logs.stdout + logs.stderr
        # The runner image installs the uvloop extra, and `shigoto run` picks it up.
        assert "started on the uvloop event loop" in logs.stdout + logs.stderr, logs.stderr
    finally:
        docker("rm", "-f", name, check=False)
    assert count(url, "state <> 'completed'") == 0
    assert count(url, "result = '\"hello, 7\"'::jsonb") == 1


def test_operator_image_starts_kopf_with_shigoto_operator(images: Images) -> None:
    probe = "import kopf, shigoto_operator.handlers; print('imported')"
    out = docker("run", "--rm", *READ_ONLY, "--network", "none", images.operator, "python3",
                 "-c", probe).stdout  # fmt: skip
    assert out.strip() == "imported", out
    # The image's own command, with no cluster to talk to: kopf imports shigoto_operator, runs
    # its startup handler, then stops at the login (no in-cluster account, no kubeconfig).
    result = docker("run", "--rm", *READ_ONLY, "--network", "none", images.operator,
                    check=False, timeout=300)  # fmt: skip
    log = result.stdout + result.stderr
    assert result.returncode != 0, log
    assert "Activity 'startup' succeeded" in log, log
    assert "Ran out of valid credentials" in log, log
    assert "ModuleNotFoundError" not in log and "ImportError" not in log, log
