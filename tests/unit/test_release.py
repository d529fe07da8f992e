"""`make release VERSION=... [REGISTRY=...]`: one versioned manifest, dist/shigoto-<version>.yaml,
holding exactly what `kubectl kustomize deploy/` renders, with the operator image set
(docs/quick-start.md installs and upgrades with it)."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None or shutil.which("make") is None,
    reason="kubectl (its embedded kustomize) or make is not on PATH",
)


def _objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


@pytest.fixture
def version() -> Iterator[str]:
    """A version of this test's own, so parallel runs never share dist/ files."""
    v = f"0.0.0-test{uuid.uuid4().hex[:8]}"
    yield v
    (ROOT / "dist" / f"shigoto-{v}.yaml").unlink(missing_ok=True)


def _release(version: str, *extra: str) -> str:
    result = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "release", f"VERSION={version}", *extra],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(f"dist/shigoto-{version}.yaml")
    assert not (ROOT / "dist" / f".release-{version}").exists()
    return (ROOT / "dist" / f"shigoto-{version}.yaml").read_text()


def _base() -> list[dict[str, Any]]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "deploy")],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return _objects(out.stdout)


def _with_operator_image(objects: list[dict[str, Any]], image: str) -> list[dict[str, Any]]:
    for obj in objects:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "shigoto-operator":
            containers = obj["spec"]["template"]["spec"]["containers"]
            assert [c["image"] for c in containers] == ["shigoto-operator:0.1.0"]
            containers[0]["image"] = image
    return objects


@pytest.mark.parametrize(
    ("registry", "image"),
    [
        ((), "shigoto-operator:{v}"),
        (("REGISTRY=registry.example.com",), "registry.example.com/shigoto-operator:{v}"),
        (("REGISTRY=registry.example.com/",), "registry.example.com/shigoto-operator:{v}"),
    ],
)
def test_release_is_the_kustomize_base_with_the_operator_image_set(
    version: str, registry: tuple[str, ...], image: str
) -> None:
    text = _release(version, *registry)
    expected = _with_operator_image(_base(), image.format(v=version))
    released = _objects(text)
    assert sorted(map(_key, released)) == sorted(map(_key, expected))
    assert sorted(released, key=_key) == sorted(expected, key=_key)
    header = text.split("\n", 3)[:3]
    assert all(line.startswith("# ") for line in header)
    assert f"Shigoto {version}" in header[0]


def test_release_without_a_version_says_so() -> None:
    result = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "release"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "VERSION" in result.stderr
