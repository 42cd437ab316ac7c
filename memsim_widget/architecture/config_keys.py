"""Readers of HF config keys: each one validates its key and names it (``model.<key>``) in the error.

Structural keys (hidden size, layer and head counts, vocab, MLP width: ``REQUIRED_KEYS``) are required: HF's
config classes would silently default them to a 7B-class model, which is never what a user meant. Every other key
falls back to the default of the transformers config class, written out in each family module's ``*_DEFAULTS``
dict (the package never imports transformers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from memsim_widget.errors import ScenarioError, short_repr

#: The structural keys of an HF decoder or encoder config; no family defaults them.
REQUIRED_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)

_MISSING: Any = object()
#: The largest integer a config key may hold (hidden size, layers, heads, vocabulary, experts...): 2**40, a
#: trillion, is past every published model by six orders of magnitude, and keeps every byte count the engine
#: derives from a product of a few such keys an exact integer that formats and converts to float
#: (10**154 squared does not: OverflowError).
MAX_DIMENSION = 2**40


def _present(cfg: Mapping[str, Any], key: str) -> bool:
    """True if ``key`` is in the config with a non-null value (HF treats null as 'use the default')."""
    return cfg.get(key) is not None


def read_int(
    cfg: Mapping[str, Any],
    key: str,
    default: Any = _MISSING,
    *,
    minimum: int = 1,
    aliases: tuple[str, ...] = (),
) -> int:
    """Read an integer config key (or one of its aliases), raising ScenarioError naming ``model.<key>``."""
    used = next((k for k in (key, *aliases) if _present(cfg, k)), None)
    if used is None:
        if default is _MISSING:
            raise ScenarioError(f"model.{key}", "is required")
        return int(default)
    value = cfg[used]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"model.{used}", f"must be an integer, got {short_repr(value)}")
    if value < minimum:
        raise ScenarioError(f"model.{used}", f"must be >= {minimum}, got {short_repr(value)}")
    if value >= MAX_DIMENSION:
        raise ScenarioError(f"model.{used}", f"must be < 2**40 (a trillion), got {short_repr(value)}")
    return value


def read_probability(cfg: Mapping[str, Any], key: str, default: float) -> float:
    """Read a probability-like float config key in [0, 1), e.g. a dropout rate."""
    if not _present(cfg, key):
        return float(default)
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ScenarioError(f"model.{key}", f"must be a number in [0, 1), got {value!r}")
    return float(value)


def read_bool(cfg: Mapping[str, Any], key: str, default: bool) -> bool:
    """Read a boolean config key."""
    if not _present(cfg, key):
        return default
    value = cfg[key]
    if not isinstance(value, bool):
        raise ScenarioError(f"model.{key}", f"must be true or false, got {value!r}")
    return value


def read_str(cfg: Mapping[str, Any], key: str, default: str) -> str:
    """Read a string config key."""
    if not _present(cfg, key):
        return default
    value = cfg[key]
    if not isinstance(value, str):
        raise ScenarioError(f"model.{key}", f"must be a string, got {value!r}")
    return value


def read_head_dim(cfg: Mapping[str, Any], hidden: int, heads: int, default: int | None = None) -> int:
    """Per-head width: the explicit ``head_dim`` key, else ``default``, else hidden_size / heads."""
    if _present(cfg, "head_dim"):
        return read_int(cfg, "head_dim")
    if default is not None:
        return default
    if hidden % heads:
        raise ScenarioError(
            "model.num_attention_heads",
            f"hidden_size {hidden} is not divisible by {heads} heads (set head_dim explicitly)",
        )
    return hidden // heads


def read_kv_heads(cfg: Mapping[str, Any], heads: int, default: int | None) -> int:
    """Key/value head count (GQA), defaulting like the config class; must divide the query heads."""
    kv = read_int(cfg, "num_key_value_heads", heads if default is None else default)
    if heads % kv:
        raise ScenarioError("model.num_key_value_heads", f"{kv} does not divide num_attention_heads {heads}")
    return kv


def read_positive(cfg: Mapping[str, Any], key: str, default: float, where: str | None = None) -> float:
    """Read a positive finite number config key (``rope_theta``, ``rms_norm_eps``); null means the default."""
    if not _present(cfg, key):
        return float(default)
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ScenarioError(f"model.{where or key}", f"must be a positive finite number, got {value!r:.60}")
    return float(value)


def layer_kinds(
    cfg: Mapping[str, Any],
    layers: int,
    allowed: tuple[str, ...],
    default: Callable[[int], str],
    *,
    longer_ok: bool = False,
) -> list[str]:
    """Each layer's attention kind: the config's ``layer_types`` (one of ``allowed`` per layer; ``longer_ok``:
    a longer list is cut to ``layers``, as GPT-OSS and Llama 4 read it), else ``default(layer index)``."""
    given = cfg.get("layer_types")
    if given is None:
        return [default(i) for i in range(layers)]
    if (
        not isinstance(given, list | tuple)
        or any(t not in allowed for t in given)
        or len(given) < layers
        or (len(given) > layers and not longer_ok)
    ):
        count = f"at least {layers}" if longer_ok else str(layers)
        raise ScenarioError(
            "model.layer_types", f"must list {count} entries, each {' or '.join(map(repr, allowed))}"
        )
    return list(given[:layers])


def read_rope_theta(cfg: Mapping[str, Any], default: float) -> float:
    """RoPE base, from ``rope_theta`` (transformers 4 configs) or ``rope_parameters`` (transformers 5)."""
    if _present(cfg, "rope_theta"):
        return read_positive(cfg, "rope_theta", default)
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and params.get("rope_theta") is not None:
        return read_positive(params, "rope_theta", default, "rope_parameters.rope_theta")
    return default


def read_num_labels(cfg: Mapping[str, Any]) -> int:
    """Classifier width like PretrainedConfig: ``num_labels``, else len(``id2label``), else 2."""
    if _present(cfg, "num_labels"):
        return read_int(cfg, "num_labels", minimum=0)
    id2label = cfg.get("id2label")
    if isinstance(id2label, Mapping):
        return len(id2label)
    return 2


def read_square(cfg: Mapping[str, Any], key: str, default: int) -> int:
    """An image/patch size given as an int or a square [h, w] pair."""
    value = cfg.get(key)
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        return read_int({key: value[0]}, key)
    return read_int(cfg, key, default)


def read_partial_rope(
    cfg: Mapping[str, Any],
    default_pct: float,
    default_base: float,
    pct_key: str = "rotary_pct",
    base_key: str = "rotary_emb_base",
) -> tuple[float, float]:
    """(partial rotary factor, rope base) as the config classes resolve them: ``rope_parameters`` (or
    ``rope_scaling``) keys first, then the top-level ``pct_key`` / ``base_key`` (GPT-NeoX's legacy
    ``rotary_pct`` / ``rotary_emb_base``; Phi's ``partial_rotary_factor`` / ``rope_theta``)."""
    params = cfg.get("rope_parameters")
    if not isinstance(params, Mapping):
        params = cfg.get("rope_scaling")
    params = params if isinstance(params, Mapping) else {}
    if params.get("partial_rotary_factor") is not None:
        pct, where = params["partial_rotary_factor"], "rope_parameters.partial_rotary_factor"
    elif cfg.get(pct_key) is not None:
        pct, where = cfg[pct_key], pct_key
    else:
        pct, where = default_pct, pct_key
    if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0.0 < pct <= 1.0:
        raise ScenarioError(f"model.{where}", f"must be a number in (0, 1], got {pct!r:.60}")
    if params.get("rope_theta") is not None:
        base = read_positive(params, "rope_theta", default_base, "rope_parameters.rope_theta")
    else:
        base = read_positive(cfg, base_key, default_base)
    return float(pct), base
