"""Which event loop a runner runs on: uvloop when it is installed, asyncio's own otherwise.

A runner's loop thread does the per-job work of every job it runs (claim decode, tasks,
timers, the socket waits of each statement), so the loop's own cost per callback is part of
every job's cost: uvloop's loop cuts the runner's CPU per job by about a sixth and raises
throughput by about an eighth (docs/benchmarks.md, "Event loop"). It stays optional: the
`uvloop` extra (`pip install 'shigoto[uvloop]'`, and the runner image) installs it, nothing
needs it, and `shigoto run --event-loop asyncio` opts out (say, to rule it out when chasing a
problem). Shigoto uses only what both loops provide.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from shigoto.errors import ConfigurationError

T = TypeVar("T")

Choice = Literal["auto", "uvloop", "asyncio"]
CHOICES: tuple[Choice, ...] = ("auto", "uvloop", "asyncio")


def installed() -> bool:
    """Whether uvloop can be imported here (without importing it)."""
    return importlib.util.find_spec("uvloop") is not None


def resolve(choice: Choice = "auto") -> Literal["uvloop", "asyncio"]:
    """The loop `choice` means on this machine; asking for uvloop where it is not installed
    is a configuration error that says how to install it."""
    if choice not in CHOICES:
        raise ConfigurationError(
            f"event loop {choice!r} is not one of {', '.join(CHOICES)}"
        )
    if choice == "asyncio":
        return "asyncio"
    if installed():
        return "uvloop"
    if choice == "uvloop":
        raise ConfigurationError(
            "--event-loop uvloop: uvloop is not installed; pip install 'shigoto[uvloop]', or "
            "use --event-loop auto (uvloop when installed) or asyncio"
        )
    return "asyncio"


def factory(name: Literal["uvloop", "asyncio"]) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop  # type: ignore[no-any-return]
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: Choice = "auto") -> T:
    """`asyncio.run(main)` on the loop `choice` resolves to."""
    with asyncio.Runner(loop_factory=factory(resolve(choice))) as runner:
        return runner.run(main)


def current() -> str:
    """The running loop's kind, for the start-up log line: "uvloop" or "asyncio"."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
