"""What every launch-config reader shares: reading a file safely, typed keys whose errors name the file and key,
the list of memory settings a file leaves unread, the model by hub id or folder, and memsim's own note.

A reader turns its framework's keys into scenario keys (``Reading.set``); a setting that changes memory but is
not in the file (the launch command sets the GPU count, the script sets the sequence length...) becomes an
``Unread`` line saying what memsim assumed, so nothing is dropped silently. No reader executes the file.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

from memsim_widget.errors import ScenarioError, short_repr
from memsim_widget.fast_dataclass import dataclass
from memsim_widget.jsonio import MAX_JSON_BYTES, decode_json_bytes, parse_json_object

#: The line every memsim export writes in its provenance note (export/common.py ``header_lines``).
NOTE_PREFIX = "Scenario JSON (memsim estimate reads it back): "
_NOTE = re.compile(re.escape(NOTE_PREFIX) + r"(\{.*\})\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Unread:
    """A memory setting the files did not give: the scenario key, where it would be, and what was assumed."""

    key: str
    where: str
    why: str
    #: kept even when another file sets the key (a reading with an assumption, not a gap)
    keep: bool = False

    def line(self) -> str:
        return f"{self.key} ({self.where}): {self.why}"


@dataclass
class Reading:
    """One reader's result: scenario keys by dotted name, the unread settings, and the files read."""

    fmt: str
    values: dict[str, Any] = field(default_factory=dict)
    unread: list[Unread] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    note: dict[str, Any] | None = None  # the scenario in memsim's provenance note, when a file carries one
    #: values assumed for unread settings (the framework's behaviour); memsim's note and the file's keys win
    assumed: dict[str, Any] = field(default_factory=dict)

    def set(self, key: str, value: Any) -> None:
        """A scenario key read from the file (dotted: ``parallel.zero``)."""
        self.values[key] = value

    def assume(self, key: str, value: Any, where: str, why: str) -> None:
        """An unread setting with the value the framework's own behaviour gives it (listed as unread)."""
        self.assumed[key] = value
        self.miss(key, where, why)

    def miss(self, key: str, where: str, why: str, *, keep: bool = False) -> None:
        """A memory setting the file does not say (``keep``: read, with an assumption): listed, never dropped."""
        if all(u.key != key or u.where != where for u in self.unread):
            self.unread.append(Unread(key, where, why, keep))


def file_error(path: Path | str, key: str, message: str) -> ScenarioError:
    """The one-line error for a bad value: the file and its key (``ds_config.json: zero_optimization.stage``)."""
    return ScenarioError(f"{Path(path).name}: {key}" if key else Path(path).name, message)


def read_text(path: Path) -> str:
    """The file as UTF-8 text (at most 8 MiB; a launch config is kilobytes)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise file_error(path, "", f"cannot read it: {exc.strerror or exc}") from None
    if len(raw) > MAX_JSON_BYTES:
        raise file_error(path, "", f"is larger than {MAX_JSON_BYTES // 2**20} MiB: not a launch config")
    return decode_json_bytes(raw, Path(path).name, "the file")


def load_mapping(path: Path, text: str) -> dict[str, Any]:
    """A JSON, YAML or TOML file as a mapping (YAML by ``yaml.safe_load``: no tags, no code)."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        return parse_json_object(text, path.name, "the file")
    if suffix == ".toml":
        import tomllib

        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise file_error(path, "", f"is not valid TOML: {exc}") from None
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise file_error(path, "", f"is not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise file_error(path, "", f"must hold a mapping of keys, got {type(data).__name__}")
    return data


def memsim_note(text: str) -> dict[str, Any] | None:
    """The scenario of memsim's provenance note in an exported file (None when the file has none)."""
    match = _NOTE.search(text)
    if match is None:
        return None
    try:
        data = json.loads(match.group(1))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


# ----- typed keys -----------------------------------------------------------------------------------------
_MISSING: Any = object()


def dig(data: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """``data['a']['b']`` for ``a.b`` (``default`` when a level is missing or not a mapping)."""
    value: Any = data
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return default
        value = value[part]
    return value


def get_bool(path: Path, data: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """A true/false key (YAML's true/false, or the strings 'true'/'false'); None/default when absent."""
    value = dig(data, key, _MISSING)
    if value is _MISSING or value is None:
        return default
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise file_error(path, key, f"must be true or false, got {short_repr(value)}")
    return value


def get_int(path: Path, data: Mapping[str, Any], key: str, default: Any = None, *, minimum: int = 1) -> Any:
    """An integer key >= ``minimum`` ('auto' and absent give ``default``)."""
    value = dig(data, key, _MISSING)
    if value is _MISSING or value is None or value == "auto":
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise file_error(path, key, f"must be an integer >= {minimum}, got {short_repr(value)}")
    return value


def get_number(path: Path, data: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """A positive finite number key."""
    value = dig(data, key, _MISSING)
    if value is _MISSING or value is None or value == "auto":
        return default
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise file_error(path, key, f"must be a positive number, got {short_repr(value)}")
    return value


def get_str(path: Path, data: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """A string key."""
    value = dig(data, key, _MISSING)
    if value is _MISSING or value is None:
        return default
    if not isinstance(value, str):
        raise file_error(path, key, f"must be a string, got {short_repr(value)}")
    return value


def get_choice(
    path: Path, data: Mapping[str, Any], key: str, table: Mapping[Any, Any], default: Any = None
) -> Any:
    """A key whose value must be one of ``table``'s keys; returns the mapped value."""
    value = dig(data, key, _MISSING)
    if value is _MISSING or value is None:
        return default
    lookup = value.strip() if isinstance(value, str) else value
    if lookup not in table:
        allowed = ", ".join(repr(k) for k in table)
        raise file_error(path, key, f"{short_repr(value)} is not one memsim reads; allowed: {allowed}")
    return table[lookup]


# ----- the model --------------------------------------------------------------------------------------------
#: Suffixes of hub repos that name a variant with the base model's architecture (instruction- or chat-tuned).
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-it", "-base", "-hf")
#: Hub model names read as a preset of the same shapes, and why (the variant is said in the unread list).
ALIASES: dict[str, tuple[str, str]] = {
    "meta-llama-3-8b": ("llama-3.1-8b", "Llama 3 and 3.1 8B have the same shapes (3.1 adds RoPE scaling)"),
    "meta-llama-3-70b": ("llama-3.1-70b", "Llama 3 and 3.1 70B have the same shapes (3.1 adds RoPE scaling)"),
    "mistral-7b-v0.1": (
        "mistral-7b",
        "v0.3's vocabulary is 32,768 against v0.1's 32,000: over-predicts slightly",
    ),
}


def _hub_index() -> dict[str, str]:
    """Lower-cased hub repo (and its name without owner) -> preset id."""
    from memsim_widget.catalog.models import PRESET_INFO

    out: dict[str, str] = {}
    for preset, info in PRESET_INFO.items():
        repo = str(info.get("hf_repo", "")).lower()
        if repo:
            out.setdefault(repo, preset)
            out.setdefault(repo.rsplit("/", 1)[-1], preset)
    return out


def preset_for_hub_id(name: str) -> tuple[str | None, str]:
    """The preset for a hub id (``meta-llama/Llama-3.1-8B`` -> ``llama-3.1-8b``), and how it was matched:
    ``repo`` (the preset's repo, or a mirror of the same name), or a variant sharing its architecture (an
    ``-Instruct`` tune, ``ALIASES``), said in words."""
    from memsim_widget.catalog.models import PRESET_INFO

    if name in PRESET_INFO:
        return name, "repo"
    index, low = _hub_index(), name.strip().lower().rstrip("/")
    base = low.rsplit("/", 1)[-1]
    if low in index or base in index:
        return index.get(low) or index[base], "repo"
    candidates = [base]
    for suffix in _VARIANT_SUFFIXES:
        candidates += [c.removesuffix(suffix) for c in candidates if c.endswith(suffix)]
    for c in candidates:
        if c in index:
            return index[c], f"a tune of {c} (same architecture)"
        if c in ALIASES:
            return ALIASES[c][0], ALIASES[c][1]
        if c.replace("meta-llama-", "llama-") in index:
            return index[c.replace("meta-llama-", "llama-")], "same architecture"
    return None, ""


def resolve_model(reading: Reading, origin: Path, key: str, name: Any) -> None:
    """Set the scenario's model from a name in a launch config: a preset id, a hub id of a preset, or a local
    folder holding config.json (relative to the config file, then to the working directory). No download."""
    if not isinstance(name, str) or not name.strip():
        raise file_error(origin, key, f"must be a model name or path, got {short_repr(name)}")
    for base in (origin.parent, Path.cwd()):
        candidate = (base / name).expanduser()
        for cfg in (candidate / "config.json", candidate):
            if cfg.name == "config.json" and cfg.is_file():
                reading.set("model", str(cfg))
                return
    preset, how = preset_for_hub_id(name)
    if preset is None:
        reading.miss("model", f"{origin.name}: {key}", f"{short_repr(name)} is neither a preset's hub id nor a "
                     "local folder with config.json (no download); memsim assumed its default model: pass --model "
                     "PRESET or a config.json path")  # fmt: skip
        return
    reading.set("model", preset)
    if how != "repo":
        reading.miss("model", f"{origin.name}: {key}", f"{name!r} read as preset {preset!r}: {how}; no config "
                     "downloaded (give its config.json for the exact model)", keep=True)  # fmt: skip
