"""PLACEHOLDER: being built (issue 10). Until then its options are refused, never ignored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from shigoto.db.inserts import InsertSpec
from shigoto.errors import ValidationError

S = TypeVar("S", bound=InsertSpec)


def apply(spec: S, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> S:
    for key in ("depends_on", "on_parent_failure",):
        if options.get(key) is not None:
            raise ValidationError(key, "is not supported yet")
    return spec
