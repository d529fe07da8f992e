"""The client's sync and async twins: the same arguments, with the same defaults, and the same
code once `await` and `async` are taken away.

The logic lives once (in jobspec, in the pure steps of `db.inserts` and the SQL); the twins
repeat only their I/O, as psycopg's do. psycopg generates its sync code from the async code
and checks the result in CI; this test is that check for ours: each async twin, with `await`
and `async` removed and its async names mapped to the sync ones, must be the sync twin,
statement for statement. A parameter added to one and not the other, a different default, or
a change of logic made on one side only fails here.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import pytest

import shigoto
from shigoto.client import enqueuing
from shigoto.db import inserts

#: (sync, async) pairs of the public API: every coroutine function `aX` that `shigoto`
#: exports, and the sync `X` it is the twin of (enqueue, retry_by, status, migrate...).
TWINS = sorted(
    (name[1:], name)
    for name in shigoto.__all__
    if inspect.iscoroutinefunction(getattr(shigoto, name))
)

#: Every sync/async pair whose bodies must match, the private ones included.
BODIES: list[tuple[Any, Any]] = [
    (enqueuing.enqueue, enqueuing.aenqueue),
    (enqueuing.enqueue_many, enqueuing.aenqueue_many),
    (enqueuing._write, enqueuing._awrite),
    (enqueuing.through, enqueuing.athrough),
    (enqueuing.enqueue_kwargs, enqueuing.aenqueue_kwargs),
    (enqueuing.EnqueueOptions.enqueue, enqueuing.EnqueueOptions.aenqueue),
    (inserts.insert, inserts.ainsert),
    (inserts._write_many, inserts._awrite_many),
]

#: Async names and their sync twins (functions, methods, psycopg classes).
ASYNC_TO_SYNC = {
    "aenqueue": "enqueue", "aenqueue_many": "enqueue_many", "_awrite": "_write",
    "aenqueue_kwargs": "enqueue_kwargs", "ainsert": "insert", "_awrite_many": "_write_many",
    "arecord": "record", "async_pool": "sync_pool", "AsyncConnection": "Connection",
    "AsyncCursor": "Cursor", "athrough": "through", "_awriter": "_writer",
    "async_enqueue_chain": "sync_enqueue_chain", "AsyncWrite": "Write",
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
    assert {"aenqueue", "aretry_by", "astatus", "amigrate"} <= {a for _, a in TWINS}
    missing = [sync for sync, _ in TWINS if sync not in shigoto.__all__]
    assert missing == [], f"async calls without an exported sync twin: {missing}"


class _ToSync(ast.NodeTransformer):
    """An async function as its sync twin would be written."""

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        self.generic_visit(node)
        return ast.FunctionDef(**{f: getattr(node, f) for f in node._fields})

    def visit_AsyncWith(self, node: ast.AsyncWith) -> ast.AST:
        self.generic_visit(node)
        return ast.With(**{f: getattr(node, f) for f in node._fields})

    def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.AST:
        self.generic_visit(node)
        return ast.For(**{f: getattr(node, f) for f in node._fields})

    def visit_Await(self, node: ast.Await) -> ast.AST:
        return self.visit(node.value)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = ASYNC_TO_SYNC.get(node.id, node.id)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        node.attr = ASYNC_TO_SYNC.get(node.attr, node.attr)
        return node


def _body(fn: Any, *, from_async: bool) -> str:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    func = tree.body[0]
    assert isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef)
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # docstrings may differ
    func.body = body
    func.name = ASYNC_TO_SYNC.get(func.name, func.name)
    func.returns = None  # Job vs Awaitable is implied; parameters are compared in full
    if from_async:
        tree = _ToSync().visit(tree)
    return ast.dump(tree.body[0], include_attributes=False)


@pytest.mark.parametrize(("sync", "async_"), BODIES, ids=lambda f: f.__qualname__)
def test_the_async_twin_is_the_sync_one_with_await(sync: Any, async_: Any) -> None:
    assert inspect.iscoroutinefunction(async_) and not inspect.iscoroutinefunction(sync)
    assert _body(async_, from_async=True) == _body(sync, from_async=False), (
        f"{async_.__qualname__} and {sync.__qualname__} differ beyond async/await: change both"
    )


def test_every_async_function_of_the_client_and_insert_path_is_checked() -> None:
    checked = {a for _, a in BODIES}
    for module in (enqueuing, inserts):
        for _, fn in inspect.getmembers(module, inspect.iscoroutinefunction):
            if fn.__module__ == module.__name__:
                assert fn in checked, f"add ({fn.__name__}'s sync twin, {fn.__name__}) to BODIES"
