"""Scenario dicts as the controls edit them: dotted keys, what changed, merging, defaults."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from memsim_widget.errors import ScenarioError
from memsim_widget.frozen import freeze, thaw
from memsim_widget.scenario import OPTIONAL_KEYS, RLConfig, Scenario

_NESTED = ("parallel", "lora", "rl")


def flatten(data: Mapping[str, Any]) -> dict[str, Any]:
    """Scenario dict to dotted keys (``parallel.tp``); ``model`` and ``gpu`` stay whole values."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _NESTED and isinstance(value, Mapping):
            for sub, v in value.items():
                out[f"{key}.{sub}"] = v
        else:
            out[key] = value
    return out


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> set[str]:
    """Dotted keys whose value differs between two scenario dicts (keys missing from ``new`` are unchanged)."""
    before, after = flatten(old), flatten(new)
    return {k for k, v in after.items() if k not in before or before[k] != v}


def merge(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``changes``; ``parallel`` and ``lora`` merge key by key, other keys replace."""
    out = {k: (dict(v) if isinstance(v, Mapping) and k in _NESTED else v) for k, v in base.items()}
    for key, value in changes.items():
        if key in _NESTED and isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def with_frozen_model(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with its inline model config frozen as the scenario will hold it (``frozen.freeze``): the edit's
    control rules, the scenario, its scaling stops and the panels then share one model object, which resolves its
    architecture once (``catalog.models.architecture_for``). A config that cannot be frozen is left as typed, for
    the scenario check to name."""
    out = dict(data)
    if isinstance(out.get("model"), Mapping):
        with contextlib.suppress(ScenarioError):
            out["model"] = freeze(out["model"])
    return out


def keep_known(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` without unknown keys (top level, ``parallel``, ``lora``): no control can show or remove them. An
    inline model config is plain JSON data again (``with_frozen_model`` froze it)."""
    out = _known(data)
    if "model" in out:
        out["model"] = thaw(out["model"])
    return out


def _known(data: Mapping[str, Any]) -> dict[str, Any]:
    """``keep_known`` without thawing the model config (for which keys are known)."""
    # optional keys too: a rejected checkpoint_every must stay visible, or the error could not be cleared
    out = {k: v for k, v in data.items() if k in _default_dict() or k in OPTIONAL_KEYS}
    for section in _NESTED:
        if isinstance(out.get(section), Mapping):
            allowed = [f.name for f in fields(RLConfig)] if section == "rl" else _default_dict()[section]
            out[section] = {k: v for k, v in out[section].items() if k in allowed}
    return out


def as_typed(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` as typed, unknown keys included, its inline model config plain JSON data again: a rejected edit
    shows what was typed, so the key the error names stays visible (the scenario JSON shows it) and setting any
    other scenario, the last valid one included, is a change that clears the error."""
    out = dict(data)
    if "model" in out:
        out["model"] = thaw(out["model"])
    return out


def drop_carried_unknown(
    data: Mapping[str, Any], shown: Mapping[str, Any], explicit: frozenset[str]
) -> dict[str, Any]:
    """``data`` without the unknown keys it carries over unchanged from the rejected input on show (``as_typed``):
    an edit of another control builds on what is shown, and should not fail again on a key it did not type.
    A key typed again (in ``explicit``, or with another value) stays, for the scenario check to name."""
    known = _known(data)
    out = dict(data)
    for key, value in data.items():
        if key not in known and key not in explicit and key in shown and shown[key] == value:
            del out[key]
        elif key in _NESTED and isinstance(value, Mapping) and isinstance(known.get(key), Mapping):
            prior = shown.get(key)
            before = prior if isinstance(prior, Mapping) else {}
            out[key] = {
                k: v
                for k, v in value.items()
                if k in known[key] or f"{key}.{k}" in explicit or k not in before or before[k] != v
            }
    return out


@functools.cache
def _default_dict() -> dict[str, Any]:
    """The default scenario as a dict, ``num_gpus`` left to the layout."""
    return {**Scenario().to_dict(), "num_gpus": None}


def defaults() -> dict[str, Any]:
    """A fresh copy of the default scenario dict (nested sections copied)."""
    return merge(_default_dict(), {})


#: Bounds of an edit's raw data, checked before any control rule or the scenario sees it: a scenario dict has a
#: few dozen values and an inline HF config a few hundred, so 20,000 values, 64 levels, strings of 64 KiB and
#: integers below 2**63 (the planner's int64 columns) leave every real edit through and stop a pasted monster
#: before a rule allocates for it or converts it to a float.
EDIT_MAX_VALUES = 20_000
EDIT_MAX_DEPTH = 64
EDIT_MAX_CHARS = 2**16
EDIT_MAX_INT = 2**63


def check_edit(data: Any) -> ScenarioError | None:
    """The error of an edit whose raw data is out of bounds (``EDIT_MAX_*``: size, depth, string length, integer
    size, NaN/infinity, non-string keys, NUL or lone surrogates), naming its dotted key; None when it is in bounds.
    Walked without recursion, stopping at the first problem: costs microseconds for a real scenario."""
    if not isinstance(data, Mapping):
        return ScenarioError("scenario", f"must be a JSON object, got {type(data).__name__}")
    stack: list[tuple[str, Any, int]] = [(str(k), v, 1) for k, v in data.items() if isinstance(k, str)]
    if len(stack) != len(data):
        return ScenarioError("scenario", "keys must be strings")
    seen = 0
    while stack:
        where, value, depth = stack.pop()
        seen += 1
        if seen > EDIT_MAX_VALUES or depth > EDIT_MAX_DEPTH:
            return ScenarioError(where.split(".")[0], f"is larger than an edit can be ({EDIT_MAX_VALUES:,} values, "
                                 f"{EDIT_MAX_DEPTH} levels)")  # fmt: skip
        problem = _edit_value_problem(value)
        if problem is not None:
            return ScenarioError(where, problem)
        if isinstance(value, Mapping):
            for k, v in value.items():
                if not isinstance(k, str) or _edit_value_problem(k) is not None:
                    return ScenarioError(where, "keys must be printable strings")
                stack.append((f"{where}.{k}", v, depth + 1))
        elif isinstance(value, list | tuple):
            stack.extend((f"{where}[{i}]", v, depth + 1) for i, v in enumerate(value))
    return None


def _edit_value_problem(value: Any) -> str | None:
    """What is out of bounds about one raw value, or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if -EDIT_MAX_INT < value < EDIT_MAX_INT else "must be an integer below 2**63"
    if isinstance(value, float):
        return None if value == value and abs(value) != float("inf") else "must be a finite number"
    if isinstance(value, str):
        if len(value) > EDIT_MAX_CHARS:
            return f"is a string of {len(value):,} characters; at most {EDIT_MAX_CHARS:,}"
        if "\x00" in value or not (value.isascii() or _utf8(value)):
            return "holds NUL or a lone surrogate (not UTF-8 text)"
        return None
    if isinstance(value, Mapping | list | tuple):
        return None
    return f"must be JSON data, got {type(value).__name__}"


def _utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
