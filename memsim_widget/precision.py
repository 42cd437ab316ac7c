"""Precision recipes: bytes per parameter for weights, gradients, master copy and optimizer state.

Facts and sources: docs/memory-facts.md#bytes-per-parameter (PyTorch AMP, Megatron/DeepSpeed mixed precision,
pure 16-bit).
Add a recipe with ``register_precision(PrecisionRecipe(...))``.
"""

from __future__ import annotations

from memsim_widget.fast_dataclass import dataclass


@dataclass(frozen=True)
class PrecisionRecipe:
    """How one training recipe stores and computes tensors.

    ``state_bytes`` is the element size of 32-bit-class optimizer states (Adam's m and v): PyTorch
    keeps them in the parameter dtype, so pure bf16 stores them in 2 bytes.
    ``act_bytes`` is the element size of activations saved in the compute dtype.
    ``autocast``: PyTorch autocast (fp32 weights, 16-bit compute copies cached through backward).
    ``weight_copy_bytes``: bytes per Linear weight element of autocast's 16-bit compute copies (2); fp8
    recipes' quantised weight copies are ``memsim_widget/fp8.py``'s.
    """

    name: str
    description: str
    weight_bytes: int
    grad_bytes: int
    master_bytes: int
    state_bytes: int
    act_bytes: int
    autocast: bool = False
    weight_copy_bytes: int = 0

    @property
    def fp32_compute(self) -> bool:
        return self.act_bytes == 4


PRECISIONS: dict[str, PrecisionRecipe] = {}


def register_precision(recipe: PrecisionRecipe) -> PrecisionRecipe:
    """Add or replace a precision recipe."""
    PRECISIONS[recipe.name] = recipe
    return recipe


register_precision(PrecisionRecipe("fp32", "full fp32: weights, grads, states fp32", 4, 4, 0, 4, 4))
register_precision(
    PrecisionRecipe("bf16", "pure bf16: weights, grads, states bf16 (torchtune)", 2, 2, 0, 2, 2)
)
register_precision(PrecisionRecipe("fp16", "pure fp16: weights, grads, states fp16", 2, 2, 0, 2, 2))
register_precision(
    PrecisionRecipe(
        "amp-bf16",
        "PyTorch autocast bf16: fp32 weights/grads/states, bf16 compute copies (HF Trainer bf16=True)",
        4,
        4,
        0,
        4,
        2,
        autocast=True,
        weight_copy_bytes=2,
    )
)
register_precision(
    PrecisionRecipe(
        "amp-fp16",
        "PyTorch autocast fp16: fp32 weights/grads/states, fp16 compute copies (HF Trainer fp16=True)",
        4,
        4,
        0,
        4,
        2,
        autocast=True,
        weight_copy_bytes=2,
    )
)
register_precision(
    PrecisionRecipe(
        "mixed-bf16",
        "Megatron/DeepSpeed: bf16 weights, fp32 main grads, fp32 master copy and states",
        2,
        4,
        4,
        4,
        2,
    )
)
register_precision(
    PrecisionRecipe(
        "mixed-fp16",
        "Megatron/DeepSpeed: fp16 weights, fp32 main grads, fp32 master copy and states",
        2,
        4,
        4,
        4,
        2,
    )
)
register_precision(
    PrecisionRecipe(
        "fp8",
        "fp8 compute (TransformerEngine): bf16 weights, fp8 weight + transpose cache, fp32 main grads/master/states",
        2,
        4,
        4,
        4,
        2,
    )
)
