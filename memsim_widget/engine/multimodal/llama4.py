"""Llama 4's vision adapter and projector (``Llama4VisionModel.vision_adapter``, ``Llama4MultiModalProjector``):
what they save for backward, per micro-batch, held to fake-tensor traces (docs/fidelity.md).

After the tower (engine/multimodal/tower.py runs its layers and ``layernorm_pre`` through the HF encoder rules),
``layernorm_post`` normalises every row (input, mean, rstd saved when the tower trains), the CLS row is dropped (a
view), and ``pixel_shuffle`` copies the patch grid into N = images x (image/patch)^2 x ratio^2 rows of width
h / ratio^2 (two ``.contiguous()`` copies, neither saved). Then ``fc1`` saves its input (the shuffled rows), GELU
its input, ``fc2`` its input (GELU's output), the second GELU its input (``projector_dropout`` 0 saves no mask),
and the projector's ``linear_1`` its input, the adapter's output, which the model output also holds
(``image_outputs``) until the loop drops it (the trace supplies that field as None: transformers 5.24 forgets it,
see trace/hf.py; 2 B x N x 4096, 1.2 MB per image on Scout). A frozen tower saves nothing; ``linear_1`` still trains under
full training (LLaVA's recipe).
"""

from __future__ import annotations

from memsim_widget.architecture.facts import Llama4Vision
from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import uses_autocast
from memsim_widget.units import fmt_int


def llama4_adapter_terms(ctx: Context, out: ActivationBudget, *, trained: bool) -> None:
    """Add the adapter's and projector's saved tensors (``trained``: the tower and adapter train) to ``out``."""
    v = ctx.arch.facts.vision
    assert isinstance(v, Llama4Vision)  # engine/multimodal/tower.py calls this for Llama 4 only
    tower, sizes = v.tower, v.adapter
    assert tower.fixed_seq_len is not None  # a tower's sequence is its patches (architecture/vision.py)
    amp = uses_autocast(ctx)
    ec = 2 if amp else ctx.recipe.act_bytes  # what a Linear or GELU saves (16-bit copies under autocast)
    r = 4 if amp else ctx.recipe.act_bytes
    bi = ctx.scenario.micro_batch_size * ctx.images_per_sample
    N, T, h = bi * v.feature_rows, bi * tower.fixed_seq_len, tower.hidden_size
    sh, inner, o = sizes["shuffled"], sizes["inner"], sizes["out"]
    rows = f"N={fmt_int(N)} image rows"
    if trained:
        out.pre.append(
            Term(
                "vision tower: layernorm_post input, mean and rstd; adapter: fc1 input (the pixel-shuffled rows), "
                "GELU inputs, fc2 input",
                r * T * h + 8 * T + ec * N * (sh + 2 * inner + o),
                f"{r} B x T x h + 8 B x T + {ec} B x N x ({sh} + 2 x {inner} + {o}), T={fmt_int(T)}, {rows}",
                7,
            )
        )
    pj_targets = {ad.base.module for ad in ctx.adapters if ad.base.stack == "projector"}
    if ctx.full_training:
        out.pre.append(
            Term(
                "projector: linear_1 input (the adapter's output)", ec * N * o, f"{ec} B x N x {o}, {rows}", 1
            )
        )
    elif "linear_1" in pj_targets:
        ab, rank = ctx.adapter_bytes, ctx.scenario.lora.rank
        out.pre.append(
            Term(
                "projector: LoRA input copy and A output",
                ec * N * o + ab * N * rank,
                f"{ec} B x N x {o} + {ab} B x N x rank, {rows}",
                2,
            )
        )
    else:  # nothing saves the adapter's output: the model output holds it (image_hidden_states) through the loss
        out.loss_forward.append(
            Term(
                "adapter output held by the model output (image_hidden_states)",
                ctx.recipe.act_bytes * N * o,
                f"{ctx.recipe.act_bytes} B x N x {o}, {rows}",
                1,
            )
        )
