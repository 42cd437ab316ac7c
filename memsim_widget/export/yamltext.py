"""A small YAML writer for launch configs: mappings, lists and scalars, block style, no dependency.

Strings that YAML 1.1 could read as another type (``yes``, ``on``, ``1e5``, ``null``...) are double-quoted
in JSON syntax, which YAML reads as the same string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
_KEYWORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "none", "nan", "inf"}


def scalar(value: Any) -> str:
    """One scalar as YAML: booleans lower-case, None as null, strings plain only when unambiguous."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in _KEYWORDS:
        return text
    return json.dumps(text)


def to_yaml(data: Mapping[str, Any], indent: int = 0) -> str:
    """A mapping as block-style YAML text."""
    pad = " " * indent
    out = []
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            out.append(f"{pad}{key}:\n{to_yaml(value, indent + 2)}")
        elif isinstance(value, list | tuple) and value:
            out.append(f"{pad}{key}:\n{_items(value, indent + 2)}")
        elif isinstance(value, Mapping | list | tuple):
            out.append(f"{pad}{key}: {'{}' if isinstance(value, Mapping) else '[]'}\n")
        else:
            out.append(f"{pad}{key}: {scalar(value)}\n")
    return "".join(out)


def _items(values: list[Any] | tuple[Any, ...], indent: int) -> str:
    """A block list; a mapping item starts on the dash line."""
    pad = " " * indent
    out = []
    for v in values:
        if isinstance(v, Mapping) and v:
            body = to_yaml(v, indent + 2)
            out.append(f"{pad}- {body[indent + 2 :]}")
        else:
            out.append(f"{pad}- {scalar(v)}\n")
    return "".join(out)
