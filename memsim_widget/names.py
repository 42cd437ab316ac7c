"""``Name``: the base of the package's closed sets of names (categories, counter levels, verdicts, phases).

A ``Name`` is a ``StrEnum``: its members compare, hash, format and serialise (JSON, pandas frames) exactly as
their string values, so every output is byte-for-byte what plain strings gave; ``repr`` shows the value too,
so a printed dict of categories reads as before (``{'parameters': ...}``, not ``<Category.PARAMETERS: ...>``).
"""

from __future__ import annotations

from enum import StrEnum


class Name(StrEnum):
    """A closed set of names whose members are their string values everywhere, ``repr`` included."""

    def __repr__(self) -> str:
        return repr(self.value)
