"""Worker definition and lookup: the real import error, and a warning for `__main__` workers."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import shigoto
from shigoto.errors import UnknownWorkerError
from shigoto.worker import lookup


def test_an_import_error_inside_the_worker_module_is_reported_as_such() -> None:
    with pytest.raises(ImportError) as raised:
        lookup("tests.support.engine_broken.never", prefixes=["tests.support"])
    message = str(raised.value)
    assert "tests.support.engine_broken" in message
    assert "No module named 'shigoto_no_such_dependency'" in message
    assert not isinstance(raised.value, UnknownWorkerError)


def test_a_module_that_does_not_exist_is_still_an_unknown_worker() -> None:
    with pytest.raises(UnknownWorkerError, match=r"unknown worker no_such_pkg\.mod\.fn"):
        lookup("no_such_pkg.mod.fn", prefixes=["no_such_pkg"])
    with pytest.raises(UnknownWorkerError):
        lookup("tests.support.no_such_module.fn", prefixes=["tests.support"])


def _in_main(fn: Any) -> Any:
    fn.__module__ = "__main__"
    return fn


def test_a_function_worker_defined_in_main_warns_at_definition() -> None:
    def send_report() -> None: ...

    with pytest.warns(UserWarning, match=r"defined in __main__.*move it into a module.*name="):
        made = shigoto.worker(_in_main(send_report))
    assert made.name.startswith("__main__.")


def test_a_class_worker_defined_in_main_warns_at_definition() -> None:
    with pytest.warns(UserWarning, match="__main__"):
        type("MainWorker", (shigoto.Worker,), {"__module__": "__main__",
                                               "perform": lambda self, args: None})  # fmt: skip


def test_an_explicit_name_silences_the_warning() -> None:
    def named() -> None: ...

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shigoto.worker(name="reports.named")(_in_main(named))
