"""The one error type for bad input: it names the field and, where it can, the allowed values."""

from __future__ import annotations

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
    import difflib  # on an error only: every process imports this module (the CLI at start)

    allowed = list(allowed)
    close = difflib.get_close_matches(value[:200], allowed, n=3, cutoff=0.5) if isinstance(value, str) else []
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    shown = allowed if len(allowed) <= 12 else allowed[:12] + ["..."]
    return ScenarioError(field, f"{short_repr(value)} is not allowed{hint}; allowed: {', '.join(shown)}")


#: The longest name accepted for a GPU, a LoRA target module or a preset-like id; a model path may be
#: ``MAX_PATH_CHARS`` long (Linux's PATH_MAX is 4,096 bytes).
MAX_NAME_CHARS = 128
MAX_PATH_CHARS = 4096


def bad_char(text: str) -> str | None:
    """Why ``text`` cannot stand in a file name, a label or a line of an exported file, or None when it can.

    Refused: NUL (no file name holds one), lone surrogates (not encodable as UTF-8), and every character that
    is not printable (``str.isprintable``): control characters (line feed, carriage return, tab, ESC...), the
    Unicode line and paragraph separators U+2028/U+2029 and NEL U+0085 (YAML and several editors end a line
    there), and format characters such as the bidirectional overrides U+202A-U+202E (they reorder displayed
    text). A plain space is printable and allowed.
    """
    for i, ch in enumerate(text):
        if ch == "\x00":
            return f"holds a NUL character at position {i}"
        if "\ud800" <= ch <= "\udfff":
            return f"holds a lone surrogate {ascii(ch)} at position {i} (not UTF-8 text)"
        if not ch.isprintable():
            return f"holds the non-printable character {ascii(ch)} at position {i}"
    return None


def check_text(field: str, value: str, max_chars: int = MAX_NAME_CHARS) -> str:
    """``value`` when it is a printable one-line string of at most ``max_chars`` characters (``bad_char``);
    otherwise a ScenarioError on ``field`` saying which character or how long."""
    if len(value) > max_chars:
        raise ScenarioError(field, f"is {len(value):,} characters long; at most {max_chars:,} are allowed")
    if value.isprintable():  # NUL, surrogates and separators are not: the common case stops here
        return value
    why = bad_char(value)
    raise ScenarioError(field, f"{why}; only printable characters on one line are allowed")


def one_line(text: str) -> str:
    """``text`` with every non-printable character written as its Python escape (``\\n``, ``\\u2028``...),
    so it can never end a comment line or start a new one in any file format (what ``bad_char`` refuses at
    the boundary; this is the exporters' second guard)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
