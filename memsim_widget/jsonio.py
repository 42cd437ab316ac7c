"""Reading JSON objects from text, files or stdin, with errors that name the field and the place."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from memsim_widget.errors import ScenarioError


def parse_json_object(text: str, field: str, where: str) -> dict[str, Any]:
    """Parse ``text`` as one JSON object; malformed JSON or another type is a ScenarioError on ``field``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(
            field,
            f"malformed JSON in {where} at line {exc.lineno} column {exc.colno}: {exc.msg} (not valid JSON)",
        ) from None
    if not isinstance(data, dict):
        raise ScenarioError(field, f"{where} must hold a JSON object, got {type(data).__name__}")
    return data


def read_json_object(path: str | Path, field: str) -> dict[str, Any]:
    """Read a JSON object from a file, or from stdin when ``path`` is ``-``."""
    try:
        text = sys.stdin.read() if str(path) == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(field, f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    return parse_json_object(text, field, "stdin" if str(path) == "-" else repr(str(path)))
