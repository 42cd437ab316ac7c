"""Reading JSON objects from text, files or stdin, with errors that name the field and the place.

Whatever a file holds (binary data, another encoding, nesting 100,000 deep, a 5,000-digit number, gigabytes)
the answer is the object or one ScenarioError; never a UnicodeDecodeError, RecursionError or MemoryError.
"""

from __future__ import annotations

import codecs
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from memsim_widget.errors import ScenarioError

#: The largest file read: scenarios and HF configs are kilobytes; more is a wrong file.
MAX_JSON_BYTES = 8 * 2**20
#: The deepest nesting accepted (an inline HF config nests 3 or 4 levels; the scenario allows 32 in it).
MAX_JSON_DEPTH = 64
#: Byte-order marks of the encodings JSON files are saved in by mistake (UTF-32 first: it starts like UTF-16).
_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)
_JSON_TYPES = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true/false",
    type(None): "null",
}


def decode_json_bytes(raw: bytes, field: str, where: str) -> str:
    """``raw`` as UTF-8 text (a UTF-8 byte-order mark is dropped); anything else is a ScenarioError."""
    for bom, name in _BOMS:
        if raw.startswith(bom):
            raise ScenarioError(field, f"{where} is {name} text; JSON must be UTF-8 (save it as UTF-8)")
    if b"\x00" in raw:
        raise ScenarioError(field, f"{where} holds NUL bytes: a binary file or UTF-16 text, not UTF-8 JSON")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            field,
            f"{where} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save it as UTF-8",
        ) from None


def _check_depth(data: Any, field: str, where: str) -> None:
    """Refuse nesting deeper than ``MAX_JSON_DEPTH`` (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ScenarioError(field, f"{where} nests deeper than {MAX_JSON_DEPTH} levels")
            stack.extend(
                (child, depth + 1) for child in (value.values() if isinstance(value, dict) else value)
            )


def _unique(pairs: list[tuple[str, Any]], field: str, where: str) -> dict[str, Any]:
    """A JSON object's pairs as a dict; a key given twice is a ScenarioError naming it (``json`` would keep the
    last silently, so the file would not mean what its first reader sees)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        shown = repr(key[:64]) if key.isprintable() else ascii(key[:64])
        raise ScenarioError(
            field, f"{where} has the key {shown} twice; JSON keeps only the last: write it once"
        )
    return out


def _loads(text: str, field: str, where: str) -> Any:
    """``json.loads`` with its every failure as a ScenarioError on ``field``."""
    if not text.strip():
        raise ScenarioError(field, f'{where} is empty; expected a JSON object such as {{"model": "gpt2"}}')
    try:
        return json.loads(text, object_pairs_hook=lambda pairs: _unique(pairs, field, where))
    except json.JSONDecodeError as exc:
        raise ScenarioError(
            field,
            f"malformed JSON in {where} at line {exc.lineno} column {exc.colno}: {exc.msg} (not valid JSON)",
        ) from None
    except RecursionError:
        raise ScenarioError(field, f"{where} nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ScenarioError:  # a key given twice (``_unique``)
        raise
    except ValueError:  # an integer past Python's 4,300-digit conversion limit
        raise ScenarioError(
            field, f"{where} holds a number of more than {sys.get_int_max_str_digits()} digits"
        ) from None


def parse_json_object(text: str, field: str, where: str) -> dict[str, Any]:
    """Parse ``text`` as one JSON object; malformed JSON or another type is a ScenarioError on ``field``."""
    data = _loads(text, field, where)
    if not isinstance(data, dict):
        kind = _JSON_TYPES.get(type(data), type(data).__name__)
        raise ScenarioError(field, f"{where} must hold a JSON object, got {kind}")
    _check_depth(data, field, where)
    return data


def _read_bytes(path: str | Path, field: str) -> bytes:
    """At most ``MAX_JSON_BYTES`` of the file (or stdin for ``-``); more is a ScenarioError."""
    where = "stdin" if str(path) == "-" else repr(str(path))
    try:
        if str(path) == "-":
            stream = getattr(sys.stdin, "buffer", None)
            raw = stream.read(MAX_JSON_BYTES + 1) if stream else sys.stdin.read(MAX_JSON_BYTES + 1).encode()
        else:
            raw = _read_regular(path, field, where)
    except OSError as exc:
        raise ScenarioError(field, f"cannot read {where}: {exc.strerror or exc}") from None
    except ScenarioError:  # not a regular file (``_read_regular``)
        raise
    except UnicodeDecodeError as exc:  # a text stdin without a byte layer
        raise ScenarioError(field, f"{where} is not UTF-8 text ({exc.reason}); save it as UTF-8") from None
    except ValueError:  # a path with NUL or a lone surrogate: no file has such a name
        raise ScenarioError(field, f"{where} is not a file name (it holds NUL or a lone surrogate)") from None
    if len(raw) > MAX_JSON_BYTES:
        raise ScenarioError(field, f"{where} is larger than {MAX_JSON_BYTES // 2**20} MiB: not a scenario")
    return raw


def _kind(mode: int) -> str | None:
    """What a file that is not a regular file is, in words (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip
    return next((word for test, word in kinds if test(mode)), "not a regular file")


def _read_regular(path: str | Path, field: str, where: str) -> bytes:
    """At most ``MAX_JSON_BYTES + 1`` bytes of a regular file. A FIFO, device, socket or folder is refused
    from its ``stat`` before any read (reading a FIFO with no writer, or /dev/zero, never ends); the file is
    opened non-blocking and checked again, in case it was swapped between the two."""
    kind = _kind(os.stat(path).st_mode)
    if kind is None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        kind = _kind(os.fstat(fd).st_mode)
        if kind is None:
            os.set_blocking(fd, True)
            with os.fdopen(fd, "rb") as f:
                return f.read(MAX_JSON_BYTES + 1)
        os.close(fd)
    raise ScenarioError(field, f"cannot read {where}: it is {kind}, not a regular file (give a JSON file)")


def read_json_object(path: str | Path, field: str) -> dict[str, Any]:
    """Read a JSON object from a file, or from stdin when ``path`` is ``-``."""
    where = "stdin" if str(path) == "-" else repr(str(path))
    return parse_json_object(decode_json_bytes(_read_bytes(path, field), field, where), field, where)
