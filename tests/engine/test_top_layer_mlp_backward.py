"""The top of backward as the top layer's MLP down projection runs its backward, and CLIP's vision-side head.

torch 2.13.0 runs a layer's backward in reverse of its forward (torch/csrc/autograd/engine.cpp), so the down
projection's ``addmm`` backward is the layer's first: its input gradient (T x I), its weight and bias gradients
(``mm``, ``sum``) beside the residual gradient and, under autocast, that gradient's 16-bit copy. Shapes: ViT and
CLIP at h 256, I 1024, 8 heads (the fidelity suite's), b 8.
"""

from __future__ import annotations

from fidelity_cases import CLIP, VIT  # the traced cases' shapes (tests/data)

from memsim_widget.engine.activations import activations
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.states import model_states
from memsim_widget.scenario import Scenario

b, h, I = 8, 256, 1024
T_VIT = b * 197  # 196 patches and the CLS token per image
DOWN = I * h + h  # fc2's weight and bias


def _vit(**kw) -> Scenario:
    return Scenario.from_dict({"model": VIT, "micro_batch_size": b, "seq_len": 197, **kw})


def _clip(**kw) -> Scenario:
    return Scenario.from_dict({"model": CLIP, "micro_batch_size": b, "seq_len": 77, **kw})


def _terms(sc: Scenario, group: str) -> dict[str, float]:
    return {t.name: t.bytes for t in getattr(activations(Context(sc)), group)}


def _one(terms: dict[str, float], prefix: str) -> float:
    (found,) = [v for k, v in terms.items() if k.startswith(prefix)]
    return found


def _states(sc: Scenario):  # noqa: ANN202
    ctx = Context(sc)
    return model_states(ctx, ctx.stages[0])


def _top_items(sc: Scenario) -> set[str]:
    m = next(m for m in estimate(sc).worst.moments if m.name == "backward_top")
    return {i.item for i in m.items}


def test_down_projection_backward_under_autocast_holds_the_residual_gradient_and_its_16_bit_copy():
    T = T_VIT
    down = _one(_terms(_vit(precision="amp-bf16"), "mlp_out_backward"), "activation gradients at the down")
    # fc2's input gradient (bf16 T x I), the fp32 residual gradient and the bf16 copy fc2's output receives
    assert down == 2 * T * I + 4 * T * h + 2 * T * h
    assert (
        _one(_terms(_vit(), "mlp_out_backward"), "activation gradients at the down") == 2 * T * I + 2 * T * h
    )


def test_after_the_down_projection_autocast_has_released_its_16_bit_weight_copy():
    T = T_VIT
    amp = _one(_terms(_vit(precision="amp-bf16"), "layer_backward"), "activation gradients of the layer")
    bf16 = _one(_terms(_vit(), "layer_backward"), "activation gradients of the layer")
    # GELU: one T x I gradient beside the residual gradient; under autocast fc2's bf16 weight copy is gone
    assert bf16 == 2 * T * I + 2 * T * h
    assert amp == 2 * T * I + 4 * T * h - 2 * I * h


def test_the_down_projection_gradient_is_made_in_the_compute_dtype_then_kept_as_the_gradient():
    amp = _states(_vit(precision="amp-bf16"))
    assert sum(i.bytes for i in amp.top_down_new) == 2 * DOWN  # the bf16 mm and sum
    assert sum(i.bytes for i in amp.top_down_made) == 4 * DOWN  # the fp32 .grad
    bf16 = _states(_vit())
    assert sum(i.bytes for i in bf16.top_down_new) == sum(i.bytes for i in bf16.top_down_made) == 2 * DOWN


def test_the_down_projection_gradient_is_counted_on_one_gpu_with_the_model_trained_only():
    assert not _states(_vit(parallel={"dp": 2})).top_down_made
    lora = _states(_vit(method="lora", lora={"rank": 8, "targets": ["q_proj", "v_proj"]}))
    assert not lora.top_down_new and not lora.top_down_made


def test_top_of_backward_meets_the_down_gradient_as_the_grad_or_as_the_new_matmul_output_when_carried():
    made = "the top layer's MLP down projection's weight and bias gradients, made"
    new = "the top layer's MLP down projection's weight and bias gradients, as its matmul makes them"
    assert made in _top_items(_vit())
    # a later micro-batch adds the new gradient in place into the carried one: only the matmul's output is new
    carried = _top_items(_vit(precision="amp-bf16", grad_accum_steps=2))
    assert made not in carried and new in carried


def test_autocast_saves_the_trained_patch_convs_16_bit_weight_copy():
    conv = 2 * h * 3 * 16 * 16
    px = b * 3 * 224 * 224
    vit_amp = _one(_terms(_vit(precision="amp-bf16"), "inputs"), "pixel values and labels")
    assert vit_amp == 4 * px + 2 * px + 8 * b + conv  # fp32 pixels, their bf16 copy, the labels, the weight
    assert _one(_terms(_vit(), "inputs"), "pixel values and labels") == 2 * px + 8 * b
    clip_amp = _one(_terms(_clip(precision="amp-bf16"), "inputs"), "pixel values")
    assert clip_amp == 4 * px + 2 * px + conv


def test_clip_vision_head_keeps_the_whole_last_hidden_state_until_the_vision_tower_runs_its_backward():
    proj, T = 64, b * 197
    pre = _terms(_clip(), "pre")
    # post_layernorm saves the view last_hidden_state[:, 0, :] (the whole (b, 197, h) storage), its fp32 mean and
    # rstd of the b pooled rows, and visual_projection its (b, h) input
    assert _one(pre, "contrastive head, vision side") == 2 * T * h + 8 * b + 2 * b * h
    amp = _one(_terms(_clip(precision="amp-bf16"), "pre"), "contrastive head, vision side")
    assert amp == 4 * T * h + 8 * b + 2 * b * h + 2 * proj * h  # the fp32 residual stream, the weight's copy
    frozen = _one(_terms(_clip(freeze_vision=True), "pre"), "contrastive head, vision side")
    assert frozen == 2 * b * h  # a frozen tower's post_layernorm saves nothing; the projection still trains
    post = _terms(_clip(), "post")
    assert _one(post, "contrastive head, text side") == 2 * b * h + 3 * 2 * b * proj + 3 * 4 * b * b
    # the text tower's top layer runs its backward with the vision side still saved, the text side freed
    top = _top_items(_clip())
    assert any(i.startswith("contrastive head, vision side") for i in top)
    assert not any(i.startswith("contrastive head, text side") for i in top)
