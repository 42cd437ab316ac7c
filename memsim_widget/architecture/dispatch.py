"""Dispatch on an HF config's ``model_type``, and the one error for a type no family registers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.types import FAMILIES, Architecture
from memsim_widget.errors import ScenarioError, short_repr


def build_architecture(config: Mapping[str, Any]) -> Architecture:
    """Build the Architecture of an HF config mapping, dispatching on its ``model_type``."""
    if not isinstance(config, Mapping):
        raise ScenarioError("model", f"an HF config must be a mapping, got {type(config).__name__}")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ScenarioError("model.model_type", "is required (e.g. 'llama', 'gpt2', 't5')")
    builder = FAMILIES.get(model_type)
    if builder is None:
        # any other type transformers knows: counted on the meta device, activations fitted from traces
        from memsim_widget.calibrate import calibrated_builder

        builder = calibrated_builder(model_type)
    if builder is None:
        raise unknown_model_type(model_type)
    return builder(config)


def _spelling_key(name: str) -> str:
    """A model type with case and separators dropped ('GPT-NeoX' and 'gpt_neox' alike)."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _one_slip(typed: str, known: str) -> bool:
    """True if ``typed`` is ``known`` with one letter of a doubled pair dropped or added ('lama' / 'llama') or
    two adjacent letters swapped ('mitsral'), digits untouched. Other one-letter edits change the name into
    another model's ('llava' / 'llama', 'bart' / 'bert', 'opt' / 'gpt'), so they are no slip."""
    if len(typed) == len(known):
        diff = [i for i, (a, b) in enumerate(zip(typed, known, strict=True)) if a != b]
        return (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and typed[diff[0]] == known[diff[1]]
            and typed[diff[1]] == known[diff[0]]
            and not typed[diff[0]].isdigit()
            and not typed[diff[1]].isdigit()
        )
    short, long_ = sorted((typed, known), key=len)
    if len(long_) - len(short) != 1:
        return False
    i = next((i for i, (a, b) in enumerate(zip(short, long_, strict=False)) if a != b), len(short))
    extra = long_[i]
    doubled = (i > 0 and long_[i - 1] == extra) or (i + 1 < len(long_) and long_[i + 1] == extra)
    return long_[:i] + long_[i + 1 :] == short and doubled and not extra.isdigit()


def unknown_model_type(model_type: str) -> ScenarioError:
    """The one error for an unsupported ``model_type``: every supported type, and a hint only for a spelling
    slip of one of them (case, separators, a doubled or swapped letter), never for a neighbour name of another
    structure (jamba -> llama, modernbert -> bert, qwen2_vl -> qwen2: following such a hint gives a wrong count)."""
    key = _spelling_key(model_type[:200])
    slips = [mt for mt in sorted(FAMILIES) if key == _spelling_key(mt) or _one_slip(key, _spelling_key(mt))]
    hint = f" (did you mean {', '.join(repr(mt) for mt in slips)}?)" if slips else ""
    return ScenarioError(
        "model.model_type",
        f"{short_repr(model_type)} is not a supported model type{hint}; supported: {', '.join(sorted(FAMILIES))} "
        "(no other architecture stands in for one: its parameters and activations differ; with transformers "
        "installed, any model type it knows is calibrated from a trace)",
    )
