"""Immutable JSON-like data for what a frozen scenario holds (inline model configs, custom GPUs), and values
derived from it remembered on the object (the model's architecture: resolved once per config object)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from memsim_widget.errors import ScenarioError

T = TypeVar("T")

#: How deep an inline model config may nest (the HF files nest 3 levels: ``text_config.rope_scaling``).
MAX_CONFIG_DEPTH = 32


class FrozenDict(dict):  # type: ignore[type-arg]
    """A read-only, hashable dict for inline HF configs held by a frozen scenario (build it with ``freeze``)."""

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("scenario model config is immutable; use Scenario.replace(model=...)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _readonly  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        """The hash of the canonical JSON text, computed once per object (the engine's caches hash a scenario,
        and with it its model config, on every lookup)."""
        return self.derived("hash", _content_hash)

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuild from a plain dict: ``copy``, ``deepcopy`` and ``pickle`` would otherwise create an
        empty FrozenDict and fill it item by item, which ``__setitem__`` refuses (nested configs such as
        ``rope_scaling`` or a VLM's ``text_config`` are FrozenDicts inside the frozen model)."""
        return (type(self), (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self  # immutable: a copy is the object itself

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self

    def derived(self, name: str, compute: Callable[[FrozenDict], T]) -> T:
        """``compute(self)``, computed once per object and kept on it under ``name`` (the content never
        changes, so the object is the whole key; what ``compute`` reads besides it must never change either)."""
        memo = self.__dict__.setdefault("_derived", {})
        if name not in memo:
            memo[name] = compute(self)
        return memo[name]  # type: ignore[no-any-return]


def _content_hash(value: FrozenDict) -> int:
    """The hash of a frozen config's canonical JSON text (equal configs, equal hashes)."""
    return hash(json.dumps(value, sort_keys=True, default=str))


def freeze(value: Any, where: str = "model", depth: int = 0) -> Any:
    """An immutable copy of JSON-like data; anything JSON cannot hold losslessly is a ScenarioError naming
    the dotted key (non-string keys, NaN/Infinity, other types, nesting deeper than ``MAX_CONFIG_DEPTH``).
    A FrozenDict this function built is returned as it is at the top level (``Scenario.replace`` keeps the
    model object, and with it what was derived from it)."""
    if depth == 0 and isinstance(value, FrozenDict) and value.__dict__.get("_checked"):
        return value
    if depth > MAX_CONFIG_DEPTH:
        raise ScenarioError(where, f"nests deeper than {MAX_CONFIG_DEPTH} levels")
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ScenarioError(where, f"keys must be strings, got {k!r}")
            _check_string(where, k, "key")
            out[k] = freeze(v, f"{where}.{k}", depth + 1)
        frozen = FrozenDict(out)
        frozen.__dict__["_checked"] = True
        return frozen
    if isinstance(value, list | tuple):
        return tuple(freeze(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
    if isinstance(value, float) and not math.isfinite(value):
        raise ScenarioError(where, f"must be a finite number, got {value!r}")
    if isinstance(value, str):
        _check_string(where, value, "value")
    if value is None or isinstance(value, str | int | float):
        return value
    raise ScenarioError(where, f"must be JSON data (object, list, string, number, bool, null), got {value!r}")


def _check_string(where: str, text: str, what: str) -> None:
    """Refuse a key or string value with NUL or a lone surrogate (no file or UTF-8 text can hold it)."""
    if "\x00" in text:
        raise ScenarioError(where, f"a {what} holds a NUL character")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ScenarioError(where, f"a {what} holds a lone surrogate (not UTF-8 text)") from None


def thaw(value: Any) -> Any:
    """Plain JSON data again: FrozenDicts as dicts, tuples as lists (what ``to_dict`` and the controls show)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value
