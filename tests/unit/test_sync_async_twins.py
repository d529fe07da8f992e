"""The client's sync and async twins: the same arguments, with the same defaults, and, where the
twins are still both written by hand, the same code once `await` and `async` are taken away.

The insert path and the job API are written once, async, and their sync modules are generated
(tools/async_to_sync.py; tests/unit/test_generated_sync.py checks them). What the generator
does not cover is checked here: every public pair exported by `shigoto` takes the same
arguments (operations, queue settings and migrations have their own twins), and enqueueing's
hand-written twins are each other with `await`, by the generator's own transformation.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import pytest

import shigoto
from shigoto.client import enqueuing
from tests.support.dev_tools import async_to_sync as generator

#: (sync, async) pairs of the public API: every coroutine function `aX` that `shigoto`
#: exports, and the sync `X` it is the twin of (enqueue, retry_by, status, migrate...).
TWINS = sorted(
    (name[1:], name)
    for name in shigoto.__all__
    if inspect.iscoroutinefunction(getattr(shigoto, name))
)

#: Enqueueing's sync/async pairs whose bodies must match, the private ones included. They stay
#: hand-written: `testing` swaps `enqueuing.interceptor` at run time, which generated modules
#: could only read back through an import cycle.
BODIES: list[tuple[Any, Any]] = [
    (enqueuing.enqueue, enqueuing.aenqueue),
    (enqueuing.enqueue_many, enqueuing.aenqueue_many),
    (enqueuing._write, enqueuing._awrite),
    (enqueuing.through, enqueuing.athrough),
    (enqueuing.enqueue_kwargs, enqueuing.aenqueue_kwargs),
    (enqueuing.EnqueueOptions.enqueue, enqueuing.EnqueueOptions.aenqueue),
]

#: Enqueueing's async names and their sync twins, on top of the generator's.
NAMES = {
    **generator.NAMES,
    "aenqueue": "enqueue", "aenqueue_many": "enqueue_many", "_awrite": "_write",
    "aenqueue_kwargs": "enqueue_kwargs", "arecord": "record", "athrough": "through",
    "_awriter": "_writer", "async_enqueue_chain": "sync_enqueue_chain", "AsyncWrite": "Write",
}  # fmt: skip


def shape(fn: object) -> list[tuple[str, object, object]]:
    """Names, kinds and defaults; annotations differ on purpose (Connection vs
    AsyncConnection)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize(("sync", "async_"), TWINS)
def test_twins_take_the_same_arguments(sync: str, async_: str) -> None:
    assert inspect.iscoroutinefunction(getattr(shigoto, async_))
    assert not inspect.iscoroutinefunction(getattr(shigoto, sync))
    assert shape(getattr(shigoto, sync)) == shape(getattr(shigoto, async_))


def test_every_public_async_call_has_an_exported_sync_twin() -> None:
    assert {"aenqueue", "aretry_by", "astatus", "amigrate", "alist_jobs", "await_for"} <= {
        a for _, a in TWINS
    }
    missing = [sync for sync, _ in TWINS if sync not in shigoto.__all__]
    assert missing == [], f"async calls without an exported sync twin: {missing}"


def _body(fn: Any, *, from_async: bool) -> str:
    source = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(generator.to_sync(source, NAMES) if from_async else source)
    func = tree.body[0]
    assert isinstance(func, ast.FunctionDef)
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # docstrings may differ
    func.body = body
    func.returns = None  # Job vs Awaitable is implied; parameters are compared in full
    return ast.dump(func, include_attributes=False)


@pytest.mark.parametrize(("sync", "async_"), BODIES, ids=lambda f: f.__qualname__)
def test_the_async_twin_is_the_sync_one_with_await(sync: Any, async_: Any) -> None:
    assert inspect.iscoroutinefunction(async_) and not inspect.iscoroutinefunction(sync)
    assert _body(async_, from_async=True) == _body(sync, from_async=False), (
        f"{async_.__qualname__} and {sync.__qualname__} differ beyond async/await: change both"
    )


def test_every_async_function_of_enqueueing_is_checked() -> None:
    checked = {a for _, a in BODIES}
    for _, fn in inspect.getmembers(enqueuing, inspect.iscoroutinefunction):
        if fn.__module__ == enqueuing.__name__:
            assert fn in checked, f"add ({fn.__name__}'s sync twin, {fn.__name__}) to BODIES"
