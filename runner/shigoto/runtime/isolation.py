"""`isolation="process"`: a sync perform in a child process that can be killed.

A thread cannot be stopped, so a thread-isolated perform that ignores its deadline keeps
running. A worker that must never outlive its timeout (a C extension that hangs, a call with no
timeout of its own) runs in a child process instead: started with the `spawn` method (no
inherited locks or connections), killed at the deadline or on cancel.

The job's timeout counts from the moment the child is ready to perform (it says so), so the
cost of starting an interpreter and importing the worker (easily a second) is not taken from
the perform; the start has a bound of its own (`executor.PROCESS_START_TIMEOUT`).

The child imports the worker's module, resolves the worker by name, and sends back one message:
the result, an outcome (`Snooze`, `Cancel`, `Discard`) or the exception, pickled; progress
reports travel the same pipe first. An exception that does not survive pickling comes back as
an `IsolatedPerformError` with its type, message and the child's traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import pickle
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from shigoto.context import JobContext, set_current
from shigoto.errors import Cancel, Discard, Error, Snooze, error_message, error_traceback
from shigoto.worker import Worker, lookup

_SPAWN = multiprocessing.get_context("spawn")
#: Polls (10 ms apart) for a dead child's exit status once its sentinel has fired.
REAP_TRIES = 500


class IsolatedPerformError(Error):
    """A perform in a child process failed in a way that could not be sent back as is."""


def _fields(ctx: JobContext) -> dict[str, Any]:
    return {
        "id": ctx.id, "attempt": ctx.attempt, "args": ctx.args, "worker": ctx.worker,
        "queue": ctx.queue, "max_attempts": ctx.max_attempts, "tags": ctx.tags,
        "meta": ctx.meta, "parent_results": ctx.parent_results,
        "partition_key": ctx.partition_key,
    }  # fmt: skip


async def perform_in_process(
    worker: Worker,
    ctx: JobContext,
    progress: Callable[[int], None] | None,
    started: Callable[[], None] | None = None,
) -> Any:
    """Run `worker`'s perform for the job of `ctx` in a child process; kill it if cancelled.

    `started` is called when the child has imported the worker and begins the perform.
    """
    receiver, sender = _SPAWN.Pipe(duplex=False)
    child = _SPAWN.Process(
        target=_child_main, args=(worker.__module__, worker.name, _fields(ctx), sender),
        name=f"shigoto-job-{ctx.id}", daemon=True,
    )  # fmt: skip
    try:
        child.start()
        sender.close()  # the child holds the only writer now: its death means end of file
        while True:
            message = await _receive(receiver)
            if message is None:
                await _reap(child)
                raise IsolatedPerformError(
                    f"the process performing job {ctx.id} ({ctx.worker}) exited with code "
                    f"{child.exitcode} before sending a result"
                )
            kind, *payload = message
            if kind == "started":
                if started is not None:
                    started()
                continue
            if kind == "progress":
                if progress is not None:
                    progress(payload[0])
                continue
            return _outcome(kind, payload)
    finally:
        if child.is_alive():
            child.kill()
        with contextlib.suppress(Exception):
            await _reap(child)
        receiver.close()
        sender.close()


def _outcome(kind: str, payload: list[Any]) -> Any:
    if kind == "result":
        return payload[0]
    if kind == "snooze":
        return Snooze(payload[0])
    if kind == "cancel":
        return Cancel(payload[0])
    if kind == "discard":
        return Discard(payload[0])
    error, child_traceback = payload
    error.add_note(f"raised in the child process:\n{child_traceback}")
    raise error


async def _receive(conn: Connection) -> Any:
    """The next message, waiting without a thread; None at end of file (the child died)."""
    while not conn.poll():
        await _readable(conn.fileno())
    try:
        return conn.recv()
    except EOFError:
        return None


async def _reap(child: Any) -> None:
    """Wait for the child to end (its sentinel turns readable) and collect its exit code."""
    if child.pid is None:
        return
    if child.exitcode is None:
        await _readable(child.sentinel)
    # The sentinel fires when the child's end of the pipe closes, which can come a moment
    # before the kernel lets the exit status be collected: without the wait, the exit code
    # reported for a child that died early was sometimes None instead of its real code.
    for _ in range(REAP_TRIES):
        child.join(0)
        if child.exitcode is not None:
            return
        await asyncio.sleep(0.01)


async def _readable(fd: int) -> None:
    """Until `fd` is readable (data, end of file, or a process sentinel that fired)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(fd)


# -- in the child ---------------------------------------------------------------------------


def _child_main(module: str, name: str, fields: dict[str, Any], conn: Connection) -> None:
    """Entry point of the child process: perform once, send one final message, exit."""
    try:
        importlib.import_module(module)
        worker = lookup(name)
        conn.send(("started",))
        ctx = JobContext(**fields, _progress_sink=lambda p: conn.send(("progress", p)))
        set_current(ctx)
        message = _final(worker.call(fields["args"]))
    except BaseException as exc:  # every failure goes back to the parent
        message = _final(exc)
    _send(conn, message)
    conn.close()


def _final(value: Any) -> tuple[Any, ...]:
    if isinstance(value, Snooze):
        return ("snooze", value.seconds)
    if isinstance(value, Cancel):
        return ("cancel", value.reason)
    if isinstance(value, Discard):
        return ("discard", value.reason)
    if isinstance(value, BaseException):
        return ("error", _portable(value), error_traceback(value))
    return ("result", value)


def _portable(error: BaseException) -> BaseException:
    """`error` if it survives a pickle round trip (many custom exceptions do not)."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return IsolatedPerformError(error_message(error))
    return error


def _send(conn: Connection, message: tuple[Any, ...]) -> None:
    try:
        conn.send(message)
    except Exception:
        if message[0] != "result":
            raise
        # An unpicklable result: the job still completes, like a result that is not JSON.
        conn.send(("result", None))


__all__ = ["IsolatedPerformError", "perform_in_process"]
