"""Whether a job's args fit its perform function's signature, and how to say why not.

Shared by enqueue (refuse a job that could only fail) and execution (fail such a job without
retries): both must agree on what "fits" means.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@functools.cache
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


def args_misfit(fn: Callable[..., Any], args: dict[str, Any]) -> str | None:
    """Why `fn(**args)` cannot be called (a missing or unknown argument), or None if it can."""
    try:
        signature = _signature(fn)
    except (TypeError, ValueError):
        return None  # no signature to check against (some builtins and C callables)
    try:
        signature.bind(**args)
    except TypeError as exc:
        return str(exc)
    return None


@dataclass(frozen=True, slots=True)
class Params:
    names: frozenset[str]
    required: tuple[str, ...]
    var_keyword: bool
    text: str


@functools.cache
def params(fn: Any) -> Params:
    """The keyword parameters of `fn`, and its signature as text for error messages."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no introspectable signature: accept any keywords
        return Params(names=frozenset(), required=(), var_keyword=True, text="(...)")
    kinds = inspect.Parameter
    keyword = [p for p in sig.parameters.values()
               if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)]  # fmt: skip
    # Annotations are often strings (`from __future__ import annotations`): leave them out.
    bare = [p.replace(annotation=kinds.empty) for p in sig.parameters.values()]
    return Params(
        names=frozenset(p.name for p in keyword),
        required=tuple(p.name for p in keyword if p.default is kinds.empty),
        var_keyword=any(p.kind is kinds.VAR_KEYWORD for p in sig.parameters.values()),
        text=str(sig.replace(parameters=bare, return_annotation=kinds.empty)),
    )


def misfit_field(
    name: str, fn: Callable[..., Any], args: Mapping[str, Any]
) -> tuple[str, str] | None:
    """The field to blame and the message when `args` cannot be passed to `fn`, else None."""
    misfit = args_misfit(fn, dict(args))
    if misfit is None:
        return None
    p = params(fn)
    for key in args:
        if key not in p.names and not p.var_keyword:
            return f"args.{key}", f"is not an argument of {name}{p.text}"
    missing = [n for n in p.required if n not in args]
    if missing:
        return f"args.{missing[0]}", f"is required by {name}{p.text}"
    return "args", misfit
