"""The one error type for bad input: it names the field and, where it can, the allowed values."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ScenarioError(ValueError):
    """Invalid scenario input; ``field`` is the dotted key that is wrong (e.g. ``parallel.tp``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def choice_error(field: str, value: object, allowed: Iterable[str]) -> ScenarioError:
    """An error for a value outside a fixed set, suggesting close matches first."""
    allowed = list(allowed)
    close = difflib.get_close_matches(str(value), allowed, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    shown = allowed if len(allowed) <= 12 else allowed[:12] + ["..."]
    return ScenarioError(field, f"{value!r} is not allowed{hint}; allowed: {', '.join(shown)}")
