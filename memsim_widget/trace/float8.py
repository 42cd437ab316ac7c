"""torchao's float8 training on the traced model (``fp8_recipe`` tensorwise or rowwise), and torchao's quiet import.

``apply_float8`` swaps every Linear but the output layer for torchao's ``Float8Linear``
(``torchao.float8.convert_to_float8_training`` with the recipe's ``Float8LinearConfig``; torchtitan's converter
leaves the output layer in bf16 the same way), on the meta-device model the tracer then fills with fake tensors.
torchao 0.18.0 runs its casts and ``torch._scaled_mm`` on CPU fake tensors (docs/fidelity.md, "fp8").
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import sys

import torch

#: The loggers that print while torchao imports on a CPU-only torch: its CUDA-only extension libraries fail to load
#: (harmless here) and torch's pytree warns about the Enum constants torchao registers.
_IMPORT_LOGGERS = ("torchao", "torch.utils._pytree")
#: torchao's modules that register those constants, as transformers' torchao quantizer and the float8 trace import
#: them (torchao 0.18.0).
_QUIET_MODULES = ("torchao", "torchao.float8", "torchao.prototype.mx_formats")


def import_torchao_quietly() -> bool:
    """Import torchao (when installed) with its import-time warnings silenced; whether it is importable.

    peft imports torchao whenever it is installed and LoRA is applied; without this, its warnings would reach
    stderr (and the notebooks' saved outputs) on every LoRA trace."""
    if "torchao" in sys.modules:
        return True
    if importlib.util.find_spec("torchao") is None:
        return False
    loggers = [logging.getLogger(name) for name in _IMPORT_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        for name in _QUIET_MODULES:
            with contextlib.suppress(ImportError):  # a later torchao without that module: nothing to quiet
                importlib.import_module(name)
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
    return True


def apply_float8(model: torch.nn.Module, recipe: str, notes: list[str]) -> torch.nn.Module:
    """Convert ``model``'s Linear layers (not the output layer) to torchao ``Float8Linear`` with ``recipe``'s
    scaling ("tensorwise" or "rowwise"); raises RuntimeError when torchao is not installed."""
    if not import_torchao_quietly():
        raise RuntimeError("fp8_recipe: torchao is not installed (pip install --no-deps torchao==0.18.0)")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    convert_to_float8_training(
        model,
        config=Float8LinearConfig.from_recipe_name(recipe),
        module_filter_fn=lambda _mod, fqn: "lm_head" not in fqn,
    )
    swapped = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    notes.append(f"torchao float8 ({recipe}): {swapped} Linear layers swapped for Float8Linear, lm_head kept")
    return model
