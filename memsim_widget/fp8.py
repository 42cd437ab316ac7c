"""fp8 (and fp4) training recipes: which matmuls run in the narrow dtype, and which quantised copies they keep.

The scenario's ``fp8_recipe`` names one (``Scenario.fp8_recipe``; ``precision: fp8`` alone means ``te-delayed``,
the engine's rule before the key existed). Two families, each fact with its source:

- **torchao float8 training** (``tensorwise``, ``rowwise``): ``torchao.float8.convert_to_float8_training`` swaps
  the Linear layers for ``Float8Linear`` (torchtitan leaves the output layer in bf16). Its autograd function
  (torchao 0.18.0, ``torchao/float8/float8_linear.py``, ``matmul_with_hp_or_float8_args.forward``; pytorch/ao
  commit 7ca1bfbe) saves the *high-precision* input and weight (``ctx.save_for_backward(input_hp, weight_hp_t)``)
  and casts again in backward with dynamic scales computed from each tensor's amax: no persistent fp8 copy, no
  amax history, nothing saved in fp8. Traced on CPU fake tensors (tests/trace/test_trace_fp8.py): the step keeps
  the bf16 step's tensors to the byte; the casts add forward transients only (docs/fidelity.md, "fp8").
- **TransformerEngine** (Megatron-LM / NeMo; CUDA only, untraced): ``te-delayed`` (``DelayedScaling``: scales from
  an amax history), ``te-current`` (``Float8CurrentScaling``), ``mxfp8`` (``MXFP8BlockScaling``: E8M0 scale per 32
  elements, Blackwell) and ``nvfp4`` (``NVFP4BlockScaling``: 4-bit E2M1 with an E4M3 scale per 16 elements and an
  fp32 tensor scale, Blackwell). TE keeps each Linear weight quantised between micro-batches (Megatron passes
  ``is_first_microbatch``), in both orientations, since the backward's matmuls read the weight transposed and the
  block scales run along the reduction dimension (TransformerEngine docs, "Using FP8 and FP4 with Transformer
  Engine", https://docs.nvidia.com/deeplearning/transformer-engine/user-guide/examples/fp8_primer.html; the OCP
  Microscaling Formats spec v1.0 for MXFP8's 32-element blocks; NVIDIA, "Introducing NVFP4", 2025, for NVFP4's
  16-element blocks). Labelled formulas: the caches below are counted, everything else is the bf16 recipe's.
  What ``te.Linear`` saves for backward (NVIDIA/TransformerEngine ``transformer_engine/pytorch/module/linear.py``,
  ``_Linear.forward``, commit 3ec87875): ``ctx.save_for_backward(saved_inputmat, saved_inputmat_t, weight,
  main_grad, weight_t_fp8, scale_inv)`` -- under fp8 the input *quantised* (one orientation: the fp8 input, or its
  fp8 transpose where the cast made one), the high-precision weight itself (no copy), the cached fp8 transpose of
  the weight (counted above) and the inverse scales (a few floats). So each Linear input is saved at 1 B
  (``saved_input_bytes``; MXFP8/NVFP4 with their block scales): counted by Megatron's activation rule
  (``engine/activations/megatron.py``); other frameworks count it at 2 B, a labelled over-estimate. Delayed scaling also keeps per GEMM an fp32 amax history of ``amax_history_len``
  rows for its 3 forward and 2 backward tensors (``base.py``, ``set_meta_tensor``), counted as
  ``scaling_rows``.

Speed: only the Linear layers' matmuls run in the narrow dtype; attention (SDPA / FlashAttention), the output
layer and every elementwise op stay in bf16 (torchtitan's converter filter, TE's ``te.Linear`` scope), so the step
time runs the Linears at the card's fp8 (fp4) peak and the rest as before (``engine/speed/step_time.py``).
"""

from __future__ import annotations

from memsim_widget.fast_dataclass import dataclass

#: ``DelayedScaling.amax_history_len``'s default (TransformerEngine ``common/recipe/__init__.py``, 1024 since 1.x).
TE_AMAX_HISTORY_LEN = 1024
#: Quantised tensors per GEMM with scaling state: input, weight and output forward, output and input gradients
#: backward (TransformerEngine ``pytorch/module/base.py``, ``set_meta_tensor``: ``num_gemms * 3`` forward,
#: ``num_gemms * 2`` backward).
SCALED_TENSORS_PER_GEMM = 5


@dataclass(frozen=True)
class Fp8Recipe:
    """One fp8/fp4 training recipe.

    ``matmul_dtype``: the peak FLOP/s key (catalog/gpus.json) the Linear matmuls run at; ``weight_cache_bytes``:
    bytes per Linear weight element of quantised copies kept across the step (0: recast every use);
    ``traced``: held to a fake-tensor trace of the real framework; ``scaling_rows``: fp32 values kept per quantised
    tensor of each GEMM (``SCALED_TENSORS_PER_GEMM``) across steps: delayed scaling's amax history plus its scale
    and inverse scale (``TE_AMAX_HISTORY_LEN`` + 2), current scaling's scale and amax (2), none for block scales
    (kept beside the data) or torchao's dynamic scales; ``saved_input_bytes``: bytes per element of a Linear input
    as TransformerEngine saves it for the weight gradient (0: the compute dtype's, as torchao saves it)."""

    name: str
    framework: str
    description: str
    matmul_dtype: str
    weight_cache_bytes: float
    weight_cache_formula: str
    traced: bool
    scaling_rows: int = 0
    saved_input_bytes: float = 0.0


FP8_RECIPES: dict[str, Fp8Recipe] = {
    r.name: r
    for r in (
        Fp8Recipe(
            "tensorwise",
            "torchao",
            "torchao float8, dynamic tensorwise scales: bf16 input and weight saved, recast in backward",
            "fp8",
            0.0,
            "",
            True,
        ),
        Fp8Recipe(
            "rowwise",
            "torchao",
            "torchao float8, dynamic rowwise scales: bf16 input and weight saved, recast in backward",
            "fp8",
            0.0,
            "",
            True,
        ),
        Fp8Recipe(
            "te-delayed",
            "transformer-engine",
            "TransformerEngine delayed scaling: fp8 weight + transpose cached across micro-batches",
            "fp8",
            2.0,
            "x (1 B fp8 + 1 B fp8 transpose)",
            False,
            TE_AMAX_HISTORY_LEN + 2,
            1.0,
        ),
        Fp8Recipe(
            "te-current",
            "transformer-engine",
            "TransformerEngine current scaling: fp8 weight + transpose cached across micro-batches",
            "fp8",
            2.0,
            "x (1 B fp8 + 1 B fp8 transpose)",
            False,
            2,
            1.0,
        ),
        Fp8Recipe(
            "mxfp8",
            "transformer-engine",
            "TransformerEngine MXFP8 (Blackwell): rowwise and columnwise fp8 copies, one E8M0 scale per 32",
            "fp8",
            2.0 * (1.0 + 1.0 / 32.0),
            "x 2 orientations x (1 B + 1 B / 32 scale)",
            False,
            0,
            1.0 + 1.0 / 32.0,
        ),
        Fp8Recipe(
            "nvfp4",
            "transformer-engine",
            "TransformerEngine NVFP4 (Blackwell): rowwise and columnwise fp4 copies, one E4M3 scale per 16",
            "fp4",
            2.0 * (0.5 + 1.0 / 16.0),
            "x 2 orientations x (0.5 B + 1 B / 16 scale)",
            False,
            0,
            0.5 + 1.0 / 16.0,
        ),
    )
}
#: The TransformerEngine recipes whose weights Megatron FSDP can hold as fp8 parameters and all-gather in fp8
#: (``fp8_param_gather``; the scenario's ``fp8_all_gather`` under ``framework: megatron``). With fp8 parameters
#: there is no bf16 model weight to quantise, so no whole-model fp8 weight cache: each FSDP unit is gathered in fp8
#: and, before its backward, given its transpose, which is discarded when the unit's buffer is released
#: (``keep_fp8_transpose_cache`` False, Megatron FSDP's default). Source: NVIDIA/Megatron-LM
#: ``megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py`` (``fp8_create_transpose_cache`` on the
#: backward all-gather, ``release_params_fp8_transpose_cache`` on release) and its README, commit d98e8a64ddf3;
#: Megatron-Bridge ``bf16_with_fp8_current_scaling_mixed`` sets ``fp8_param_gather = True``
#: (``src/megatron/bridge/training/mixed_precision.py``, commit 00b7660be025). Untraced (CUDA only).
MEGATRON_FP8_PARAM_RECIPES = ("te-current", "te-delayed")
#: ``precision: fp8`` without ``fp8_recipe``: TransformerEngine's delayed scaling (the engine's rule before the key).
DEFAULT_FOR_FP8_PRECISION = "te-delayed"
#: The precisions an fp8 recipe runs on: bf16 compute with bf16 weights (pure or with fp32 master weights).
FP8_BASE_PRECISIONS = ("bf16", "amp-bf16", "mixed-bf16", "fp8")


def fp8_recipe_name(precision: str, fp8_recipe: str | None) -> str | None:
    """The recipe a scenario runs: its ``fp8_recipe``, else ``te-delayed`` under ``precision: fp8``, else none."""
    if fp8_recipe is not None:
        return fp8_recipe
    return DEFAULT_FOR_FP8_PRECISION if precision == "fp8" else None


def fp8_recipe_for(precision: str, fp8_recipe: str | None) -> Fp8Recipe | None:
    """The ``Fp8Recipe`` a scenario runs (None: every matmul in the precision's own dtype)."""
    name = fp8_recipe_name(precision, fp8_recipe)
    return None if name is None else FP8_RECIPES[name]
