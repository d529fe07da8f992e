"""Choosing the runner's event loop: uvloop when installed, asyncio when asked or missing."""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import pytest

from shigoto.errors import ConfigurationError
from shigoto.runtime import event_loop


async def _kind() -> str:
    await asyncio.sleep(0)
    return event_loop.current()


@pytest.fixture
def without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "uvloop" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_uvloop_is_installed_with_the_test_extra() -> None:
    # The test extra pulls in shigoto[uvloop]: every `shigoto run` the suite starts uses it.
    assert event_loop.installed()


def test_auto_runs_on_uvloop_when_installed() -> None:
    assert event_loop.resolve("auto") == "uvloop"
    assert event_loop.run(_kind()) == "uvloop"


def test_asyncio_is_chosen_on_request() -> None:
    assert event_loop.resolve("asyncio") == "asyncio"
    assert event_loop.run(_kind(), "asyncio") == "asyncio"


def test_auto_falls_back_to_asyncio_without_uvloop(without_uvloop: None) -> None:
    assert event_loop.resolve("auto") == "asyncio"
    assert event_loop.run(_kind(), "auto") == "asyncio"


def test_asking_for_uvloop_without_it_says_how_to_install_it(without_uvloop: None) -> None:
    with pytest.raises(ConfigurationError, match=r"shigoto\[uvloop\]"):
        event_loop.resolve("uvloop")


def test_an_unknown_choice_names_the_choices() -> None:
    with pytest.raises(ConfigurationError, match="auto, uvloop, asyncio"):
        event_loop.resolve("trio")  # type: ignore[arg-type]
