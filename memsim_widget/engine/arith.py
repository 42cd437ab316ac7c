"""Arithmetic that works alike on Python numbers and on numpy arrays, for the rules both the engine (one rank,
plain numbers) and the planner (``plan/vector``: thousands of candidates, numpy columns) evaluate.

A rule written with operators and these helpers exists once: the engine calls it with ints, floats and bools
and gets Python's own results (``min``, ``max``, a conditional expression), byte for byte what it computed
before; the planner calls it with arrays and gets numpy's elementwise ones. The array side is reached through
the arrays' own ``__array_namespace__`` (the array API standard, numpy >= 2), so the engine never imports numpy.
"""

from __future__ import annotations

from typing import Any

#: Python's number types: arguments of these take Python's own operations, without looking for a namespace.
_NUMBERS = frozenset((int, float, bool))


def _namespace(*xs: Any) -> Any:
    """The array namespace (numpy) of the first argument that is an array or array scalar, else None."""
    for x in xs:
        ns = getattr(x, "__array_namespace__", None)
        if ns is not None:
            return ns()
    return None


#: What the engine's rules pick between: numbers, and lists (groups of one rank's items, engine/step/timeline).
_PLAIN = _NUMBERS | {list}


def where(cond: Any, a: Any, b: Any) -> Any:
    """``a`` where ``cond`` holds, else ``b`` (elementwise for arrays)."""
    if cond.__class__ is bool and a.__class__ in _PLAIN and b.__class__ in _PLAIN:  # the engine's hot path
        return a if cond else b
    xp = _namespace(cond, a, b)
    if xp is None:
        return a if cond else b
    return xp.where(cond, a, b)


def minimum(a: Any, b: Any) -> Any:
    """The smaller of ``a`` and ``b`` (``min``: the first of equals; elementwise for arrays)."""
    if a.__class__ in _NUMBERS and b.__class__ in _NUMBERS:  # the engine's hot path
        return min(a, b)
    xp = _namespace(a, b)
    return min(a, b) if xp is None else xp.minimum(a, b)


def maximum(a: Any, b: Any) -> Any:
    """The larger of ``a`` and ``b`` (``max``: the first of equals; elementwise for arrays)."""
    if a.__class__ in _NUMBERS and b.__class__ in _NUMBERS:  # the engine's hot path
        return max(a, b)
    xp = _namespace(a, b)
    return max(a, b) if xp is None else xp.maximum(a, b)


def negate(x: Any) -> Any:
    """Logical not of a bool or a boolean array (``~`` on a Python bool would give -1 or -2)."""
    return (not x) if _namespace(x) is None else ~x


def to_int(x: Any) -> Any:
    """``int(x)``: truncated toward zero (elementwise for arrays, as int64; the planner's byte figures stay below
    ``plan/vector.SATURATION_BYTES``, so no value leaves int64)."""
    if x.__class__ in _NUMBERS:  # the engine's hot path
        return int(x)
    xp = _namespace(x)
    return int(x) if xp is None else xp.astype(x, xp.int64)
