"""Model presets: published HF ``config.json`` values per preset id, and how a ``model`` input resolves.

A scenario's ``model`` is a preset id (``"llama-3.1-8b"``), a path to a local HF ``config.json`` (or a
folder holding one), or an inline HF config dict with a ``model_type``. The presets are data: one file per HF
``model_type`` in ``catalog/presets/<model_type>.json``, each mapping a preset id to ``{"info": {description,
params_label, hf_repo}, "config": {...}}``, read once by ``load_presets`` in ``PRESET_FILES`` order (the catalog
order, grouped by family, small to large). ``catalog/presets/README.md`` says where each file's configs come
from and which keys they leave out.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..architecture import Architecture, build_architecture
from ..errors import ScenarioError, choice_error, short_repr
from ..frozen import FrozenDict
from ..jsonio import read_json_object

#: The preset files of ``catalog/presets/``, one per HF ``model_type``, in catalog order.
PRESET_FILES: tuple[str, ...] = (
    "gpt2",
    "gpt_neox",
    "phi",
    "bert",
    "roberta",
    "xlm-roberta",
    "modernbert",
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "gemma2",
    "gemma3_text",
    "phi3",
    "t5",
    "vit",
    "qwen3",
    "qwen3_moe",
    "olmo2",
    "deepseek_v3",
    "deepseek_v2",
    "glm4",
    "cohere",
    "starcoder2",
    "llama4_text",
    "llama4",
    "gpt_oss",
    "falcon",
    "mamba",
    "mamba2",
    "jamba",
    "clip",
    "llava",
    "gemma3",
    "qwen2_vl",
    "qwen2_5_vl",
    "llava_next",
)


def load_presets() -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, str]]]:
    """Read every preset file (shipped as package data) into the two tables: id -> config, id -> info."""
    # beside this module, as catalog/gpus.py reads gpus.json (importlib.resources would import zipfile, tempfile
    # and random: ~4 ms of every CLI start)
    folder = Path(__file__).with_name("presets")
    configs: dict[str, dict[str, Any]] = {}
    infos: dict[str, dict[str, str]] = {}
    for name in PRESET_FILES:
        entries = json.loads(folder.joinpath(f"{name}.json").read_text(encoding="utf-8"))
        for pid, entry in entries.items():
            if pid in configs:
                raise ValueError(f"preset {pid!r} is in catalog/presets/{name}.json and in another file")
            configs[pid] = entry["config"]
            infos[pid] = entry["info"]
    return configs, infos


#: Preset id -> full HF config dict (the published config.json values that shape the model), and preset id ->
#: {"description", "params_label" (the published size), "hf_repo" (where the config is from)}.
PRESETS, PRESET_INFO = load_presets()


def preset_ids() -> list[str]:
    """All preset ids, in catalog order (grouped by family, small to large)."""
    return list(PRESETS)


def _read_config_file(path: Path) -> dict[str, Any]:
    """Read an HF config.json (or a folder's config.json) as plain JSON; never executes code."""
    try:
        file = path / "config.json" if path.is_dir() else path
    except (OSError, ValueError) as exc:  # a name too long for the file system, or with a NUL byte
        raise ScenarioError("model", f"cannot read {short_repr(str(path))}: {exc}") from None
    data = read_json_object(file, "model")
    if not isinstance(data.get("model_type"), str):
        raise ScenarioError("model", f"{str(file)!r} has no 'model_type'; is it an HF config.json?")
    return data


def _looks_like_path(model: str) -> bool:
    """True if a model string names a file or folder rather than a preset id."""
    if model.endswith(".json") or "/" in model or "\\" in model:
        return True
    try:
        return Path(model).exists()
    except (OSError, ValueError):  # a name too long for the file system, or with a NUL byte: no such file
        return False


def _plain(value: Any) -> Any:
    """A mutable deep copy of JSON-like data: mappings as dicts, sequences as lists (the scenario holds
    inline configs frozen; the builders and transformers' config classes read plain HF data)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def resolve_model_config(model: str | Mapping[str, Any]) -> dict[str, Any]:
    """Turn a preset id, a config.json path or an inline HF config dict into a fresh HF config dict."""
    if isinstance(model, Mapping):
        if not isinstance(model.get("model_type"), str):
            raise ScenarioError(
                "model.model_type", "an inline model config needs a 'model_type' (e.g. 'llama')"
            )
        return _plain(model)
    if not isinstance(model, str):
        raise ScenarioError(
            "model", f"must be a preset id, a config.json path or a config dict, got {type(model).__name__}"
        )
    if model in PRESETS:
        return copy.deepcopy(PRESETS[model])
    if _looks_like_path(model):
        return _read_config_file(Path(model).expanduser())
    raise choice_error("model", model, preset_ids())


@functools.lru_cache(maxsize=128)
def _preset_architecture(preset: str) -> Architecture:
    """Architecture of a preset, built once (presets never change)."""
    return build_architecture(PRESETS[preset])


@functools.lru_cache(maxsize=256)
def _json_architecture(canonical: str) -> Architecture:
    """Architecture of an inline config, cached by its canonical JSON text."""
    return build_architecture(json.loads(canonical))


def architecture_for(model: str | Mapping[str, Any]) -> Architecture:
    """The Architecture of a preset id, config.json path or inline config (presets and dicts cached). A
    scenario's frozen config is resolved once per object (``FrozenDict.derived``): the scaling stops and the
    objective's training scenario share their scenario's model object, and with it its resolution."""
    if isinstance(model, str) and model in PRESETS:
        return _preset_architecture(model)
    if isinstance(model, FrozenDict):
        return model.derived("architecture", resolve_architecture)
    return resolve_architecture(model)


def resolve_architecture(model: str | Mapping[str, Any]) -> Architecture:
    """Resolve a model input to its Architecture (``architecture_for`` without its per-object memo): a file is
    read each time (it may have changed), an inline config is looked up by its canonical JSON text."""
    if isinstance(model, str) and model in PRESETS:
        return _preset_architecture(model)
    config = resolve_model_config(model)
    if isinstance(model, str):  # a file: read each time, it may have changed
        return build_architecture(config)
    try:
        canonical = json.dumps(config, sort_keys=True)
    except (TypeError, ValueError):
        return build_architecture(config)
    return _json_architecture(canonical)
