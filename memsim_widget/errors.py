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


def short_repr(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, so that an error message stays one readable line
    (a 5,000-digit integer, a 300-character model name, a pasted file)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 180:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4,300-digit str() limit, nested in a list or dict
        return f"a {type(value).__name__} holding a huge integer"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def choice_error(field: str, value: object, allowed: Iterable[str]) -> ScenarioError:
    """An error for a value outside a fixed set, suggesting close matches first."""
    allowed = list(allowed)
    close = difflib.get_close_matches(value[:200], allowed, n=3, cutoff=0.5) if isinstance(value, str) else []
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    shown = allowed if len(allowed) <= 12 else allowed[:12] + ["..."]
    return ScenarioError(field, f"{short_repr(value)} is not allowed{hint}; allowed: {', '.join(shown)}")
