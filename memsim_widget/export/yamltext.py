r"""A small YAML writer for launch configs: mappings, lists and scalars, block style, no dependency.

Strings that YAML 1.1 could read as another type (``yes``, ``on``, ``1e5``, ``null``...) or that hold anything
but letters, digits and ``_./-`` are double-quoted, every character outside printable ASCII escaped as YAML's
``\xXX`` / ``\uXXXX`` / ``\UXXXXXXXX`` (YAML 1.1 spec, 5.7 "Escape Sequences"): a line break, U+2028 or NEL
in a model folder's name stays inside the string, and a character beyond U+FFFF reads back as itself (JSON's
surrogate pairs would read back as two lone surrogates).
"""

from __future__ import annotations

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
    if _PLAIN.fullmatch(text) and text.lower() not in _KEYWORDS:  # fullmatch: "$" also matches before "\n"
        return text
    return quoted(text)


def quoted(text: str) -> str:
    """``text`` as a YAML double-quoted scalar in printable ASCII (see the module docstring)."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


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
