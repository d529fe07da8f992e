"""The worker decorator, the Worker base class and the registry (pure; no database)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import shigoto
from shigoto import registry
from shigoto.backoff import default_backoff
from shigoto.worker import DEFAULT_MAX_ATTEMPTS, DEFAULT_TIMEOUT, lookup, registered
from tests.support import workers


def test_function_worker_is_registered_under_module_and_qualname() -> None:
    assert workers.echo.name == "tests.support.workers.echo"
    assert lookup("tests.support.workers.echo") is workers.echo
    assert registered()["tests.support.workers.echo"] is workers.echo


def test_name_option_overrides_the_default_name() -> None:
    assert workers.renamed_function.name == "custom.function"
    assert lookup("custom.function") is workers.renamed_function


def test_class_worker_registers_an_instance_under_its_name() -> None:
    found = lookup("tests.support.workers.Flaky")
    assert isinstance(found, workers.Flaky)
    assert found.max_attempts == 5


def test_class_name_attribute_overrides_the_default_name() -> None:
    assert isinstance(lookup("custom.renamed"), workers.Renamed)
    assert "tests.support.workers.Renamed" not in registered()


def test_subclass_of_a_named_worker_gets_its_own_name() -> None:
    class Child(workers.Renamed):
        pass

    assert Child.name == f"{__name__}.{Child.__qualname__}"
    assert Child.name != "custom.renamed"
    assert isinstance(lookup(Child.name), Child)
    assert isinstance(lookup("custom.renamed"), workers.Renamed)
    assert not isinstance(lookup("custom.renamed"), Child)


def test_decorated_function_stays_callable_and_keeps_metadata() -> None:
    @shigoto.worker
    def add(a: int, b: int) -> int:
        return a + b

    assert add(1, b=2) == 3
    assert workers.echo.__name__ == "echo"
    assert workers.echo.__doc__ and "returns the args" in workers.echo.__doc__


def test_bare_decorator_and_decorator_with_options() -> None:
    @shigoto.worker
    def plain(x: int) -> int:
        return x * 2

    @shigoto.worker(queue="q", priority=2, max_attempts=4, timeout=9, tags=["t"])
    def configured(x: int) -> int:
        return x * 3

    assert plain.call({"x": 2}) == 4
    assert configured.call({"x": 2}) == 6
    assert plain.defaults() == {
        "queue": None, "priority": None, "max_attempts": None, "timeout": None, "tags": None,
    }  # fmt: skip
    assert configured.defaults() == {
        "queue": "q", "priority": 2, "max_attempts": 4, "timeout": 9, "tags": ["t"],
    }  # fmt: skip


def test_function_worker_is_called_with_args_as_keywords_and_class_with_a_dict() -> None:
    seen: list[Any] = []

    @shigoto.worker
    def kw(to: str, subject: str) -> None:
        seen.append((to, subject))

    class AsDict(shigoto.Worker):
        def perform(self, args: dict[str, Any]) -> None:
            seen.append(args)

    kw.call({"to": "a@example.com", "subject": "Hi"})
    lookup(AsDict.name).call({"to": "b"})
    assert seen == [("a@example.com", "Hi"), {"to": "b"}]


def test_async_detection() -> None:
    assert workers.async_echo.is_async
    assert not workers.echo.is_async

    class AsyncClass(shigoto.Worker):
        async def perform(self, args: dict[str, Any]) -> None: ...

        async def on_discard(self, args: dict[str, Any], errors: list) -> None: ...

    instance = lookup(AsyncClass.name)
    assert instance.is_async
    assert instance.on_discard_is_async
    assert not lookup("tests.support.workers.Flaky").on_discard_is_async


def test_resolved_settings_fall_back_to_library_defaults() -> None:
    assert workers.echo.resolved_max_attempts() == DEFAULT_MAX_ATTEMPTS
    assert workers.echo.resolved_timeout() == DEFAULT_TIMEOUT
    assert workers.with_defaults.resolved_max_attempts() == 7
    assert workers.with_defaults.resolved_timeout() == 42


def test_default_backoff_and_custom_backoff() -> None:
    error = RuntimeError("x")
    assert 1.0 <= workers.echo.backoff(1, error) <= 31.0
    assert workers.fail_custom_backoff.backoff(2, error) == 200.0
    assert 16.0 <= lookup("tests.support.workers.ClassWithDefaults").backoff(2, error) <= 46.0
    assert default_backoff(2, rand=lambda: 0) == 16.0


def test_on_discard_callback_of_the_decorator_is_used() -> None:
    workers.reset()
    workers.fail_always.on_discard({"a": 1}, [{"attempt": 1}])
    assert workers.probe.discarded == [({"a": 1}, [{"attempt": 1}])]
    assert workers.echo.on_discard({}, []) is None


@pytest.mark.parametrize(
    ("options", "field"),
    [({"max_attempts": 0}, "max_attempts"), ({"timeout": 0}, "timeout"),
     ({"timeout": -1.5}, "timeout"), ({"max_attempts": "3"}, "max_attempts")],
)  # fmt: skip
def test_bad_worker_defaults_fail_at_definition(options: dict, field: str) -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:

        @shigoto.worker(**options)
        def bad() -> None: ...

    assert excinfo.value.field == field


def test_bad_class_defaults_fail_at_definition() -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:

        class Bad(shigoto.Worker):
            max_attempts = 0

            def perform(self, args: dict[str, Any]) -> None: ...

    assert excinfo.value.field == "max_attempts"


def test_class_without_perform_is_not_registered() -> None:
    class Base(shigoto.Worker):
        queue = "shared"

    assert Base.name not in registered()


def test_unknown_worker_error_names_the_worker_and_the_fix() -> None:
    with pytest.raises(shigoto.UnknownWorkerError) as excinfo:
        lookup("tests.support.workers.does_not_exist")
    message = str(excinfo.value)
    assert message.startswith("unknown worker tests.support.workers.does_not_exist")
    assert "SHIGOTO_IMPORT" in message
    assert isinstance(excinfo.value, shigoto.Error)


def test_unknown_worker_in_an_unimportable_module() -> None:
    with pytest.raises(shigoto.UnknownWorkerError, match=r"unknown worker no_such_pkg\.mod\.fn"):
        lookup("no_such_pkg.mod.fn")


def test_lookup_imports_only_under_an_allowed_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "lazy_pkg_for_lookup"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(
        textwrap.dedent("""
        import shigoto

        @shigoto.worker
        def job(n: int) -> int:
            return n + 1
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "lazy_pkg_for_lookup.jobs" not in sys.modules
    try:
        with pytest.raises(shigoto.UnknownWorkerError):
            lookup("lazy_pkg_for_lookup.jobs.job")  # a name alone never imports
        assert "lazy_pkg_for_lookup.jobs" not in sys.modules
        found = lookup("lazy_pkg_for_lookup.jobs.job", prefixes=["lazy_pkg_for_lookup"])
        assert found.call({"n": 1}) == 2
        assert "lazy_pkg_for_lookup.jobs" in sys.modules
    finally:
        for name in ("lazy_pkg_for_lookup.jobs", "lazy_pkg_for_lookup"):
            sys.modules.pop(name, None)
        registry.forget("lazy_pkg_for_lookup.jobs.job")


def test_redefinition_replaces_the_registered_worker() -> None:
    @shigoto.worker(name="tests.unit.redefined")
    def first() -> int:
        return 1

    @shigoto.worker(name="tests.unit.redefined")
    def second() -> int:
        return 2

    assert lookup("tests.unit.redefined") is second


def test_new_builds_a_validated_spec_with_the_workers_defaults_and_writes_nothing() -> None:
    @shigoto.worker(queue="mail", priority=2, max_attempts=4, timeout=9, tags=["t"])
    def send(to: str) -> None: ...

    spec = send.new({"to": "a@example.com"}, priority=7)
    assert (spec.worker, spec.args_json) == (send.name, '{"to":"a@example.com"}')
    assert (spec.queue, spec.priority, spec.max_attempts, spec.timeout, spec.tags) == (
        "mail", 7, 4, 9.0, ["t"],
    )  # fmt: skip
    with pytest.raises(shigoto.ValidationError) as excinfo:
        send.new({"too": "typo"})
    assert excinfo.value.field.startswith("args")
    flaky = workers.Flaky.new({"n": 1})
    assert (flaky.worker, flaky.max_attempts) == (workers.Flaky.name, 5)
    registry.forget(send.name)
