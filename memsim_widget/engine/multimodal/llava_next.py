"""The vision side of LLaVA-NeXT (families/llava_next.py): LLaVA 1.5's tower and projector run on every crop.

Each image is 1 + tiles crops of the tower's input size; the tower and the projector see b x images x crops
samples, exactly as LLaVA's rules count them (engine/multimodal/tower.py, on a view of the context whose images are the
crops and whose projector rows are (s/p)^2 per crop). Beside them (each held to a fake-tensor trace,
docs/fidelity.md):

- ``get_image_features`` concatenates each image's crops (``pixel_values[i][:crops]``) into a new tensor, which the
  trained tower's patch conv saves instead of the batch's pixel values;
- the packed features (per image: the base crop's rows, the tiles' grid unpadded with one ``image_newline`` per
  row), new tensors of the language model's image tokens x h_t, held by the model output (``image_outputs``)
  until the loop drops it.
"""

from __future__ import annotations

from collections.abc import Callable

from memsim_widget.architecture.facts import LlavaNextVision, LlavaVision
from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import output_lifetime, uses_autocast
from memsim_widget.units import fmt_int


def crop_context(ctx: Context) -> Context:
    """``ctx`` seen as LLaVA 1.5 with one image per crop: b x images x crops tower samples, (s/p)^2 projector rows
    each."""
    v = _vision(ctx)
    sc = ctx.scenario.replace(images_per_sample=ctx.images_per_sample * v.crops_per_image)
    shared = {name: getattr(v, name) for name in _SHARED}
    crop = LlavaVision(kind=v.kind, tokens_per_image=v.tokens_per_crop, **shared)  # a crop: LLaVA 1.5's image
    return ctx.seen_as(ctx.arch.with_facts(vision=crop), sc)


#: What a crop shares with its image: the tower, projector and recipe (LLaVA's own behaviour facts are its class's).
_SHARED = ("tower", "images_default", "freeze_default", "layers_used", "projector", "caveat", "image_note",
           "image_mask_all_layers")  # fmt: skip


def _vision(ctx: Context) -> LlavaNextVision:
    """The model's LLaVA-NeXT vision facts (this module runs for no other kind)."""
    v = ctx.arch.facts.vision
    assert isinstance(v, LlavaNextVision)
    return v


def llava_next_activations(
    ctx: Context, out: ActivationBudget, hf: Callable[[Context], ActivationBudget], llava: Callable
) -> None:
    """Add LLaVA-NeXT's tower and projector (LLaVA's rules on the crops), the crops' concatenated pixels and the
    packed image features to ``out``."""
    v = _vision(ctx)
    llava(crop_context(ctx), out, hf)
    n_img = ctx.images_per_sample
    if not n_img:
        return
    sc, recipe = ctx.scenario, ctx.recipe
    amp = uses_autocast(ctx)
    crops = sc.micro_batch_size * n_img * v.crops_per_image
    C, s = v.patches.num_channels, v.patches.image_size
    px = crops * C * s * s
    if ctx.full_training and not ctx.freeze_vision and not amp:
        pb = recipe.weight_bytes
        out.pre.append(
            Term(
                "crops concatenated by get_image_features (saved by the trained patch conv)",
                pb * px,
                f"{pb} B x {fmt_int(crops)} crops x {C} x {s} x {s}",
                1,
            )
        )
    N = sc.micro_batch_size * n_img * v.tokens_per_image
    ht = ctx.arch.hidden_size
    t = Term(
        "packed image features (base crop, unpadded tiles, image_newline) held by the model output",
        2 * N * ht if amp else recipe.act_bytes * N * ht,
        f"{2 if amp else recipe.act_bytes} B x N x {ht}, N={fmt_int(N)} image tokens",
        sc.micro_batch_size * n_img,
    )
    out.loss_forward.append(t)
    if output_lifetime(sc) != "trainer":
        out.output_logits.append(t)
