"""A runner names itself after its pod when the operator says which pod that is."""

from __future__ import annotations

import socket

import pytest

from shigoto.runtime import node


def test_the_pod_name_wins_over_the_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    # A host-network pod's hostname is the machine's: only the pod name tells pods apart.
    monkeypatch.setenv("SHIGOTO_POD_NAME", "shigoto-runner-emails-7d9f-abcde")
    assert node.host_name() == "shigoto-runner-emails-7d9f-abcde"
    assert node.new_node_id().startswith("shigoto-runner-emails-7d9f-abcde-")


def test_without_a_pod_name_the_hostname_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHIGOTO_POD_NAME", raising=False)
    assert node.host_name() == socket.gethostname()
    assert node.host_name({"SHIGOTO_POD_NAME": ""}) == socket.gethostname()
