"""What a fully checkpointed step holds at the bottom of its backward (layer 0 recomputed, its MLP's backward),
beside what the engine counted before (docs/fidelity.md, the ``ckpt`` rows):

- the bottom layer's MLP output projection's gradient, made before the activation's backward
  (``states/gradients.bottom_made_first``);
- GPT-NeoX's whole query_key_value output, kept by the v view once no KV cache copies v (``attention.py``);
- a pre-norm LayerNorm saves the checkpointed layer input itself: counted once (``checkpointing.py``).

Expected bytes are written from the models' dimensions (bf16: 2 B an element), not read from the engine.
"""

from __future__ import annotations

import fidelity_cases

from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario

LLAMA = fidelity_cases.LLAMA  # h=256, I=688, 8 heads, 4 kv heads, 4 layers, V=1000, untied
NEOX = fidelity_cases.GPT_NEOX  # h=256, I=1024, 8 heads, 4 layers, V=1000, parallel residual, biases
B, S = 2, 512
T = B * S
GRADS = "gradients (all but the bottom layer's and the embeddings', still to come)"


def _items(data: dict, moment: str) -> dict[str, int]:
    est = estimate(Scenario.from_dict({"micro_batch_size": B, "seq_len": S, **data}))
    m = next(m for m in est.worst.moments if m.name == moment)
    out: dict[str, int] = {}
    for i in m.items:
        out[i.item] = out.get(i.item, 0) + i.bytes
    return out


def _llama_params() -> tuple[int, int, int]:
    """(every parameter, one layer's, the embedding's) of the small Llama."""
    h, i, kv, L, V = 256, 688, 128, 4, 1000
    layer = h * h + 2 * kv * h + h * h + 3 * h * i + 2 * h
    return V * h + L * layer + h + V * h, layer, V * h


def test_the_bottom_layers_down_projection_gradient_is_made_before_its_mlp_backward():
    """Llama: everything but layer 0's and the embeddings' gradients, plus layer 0's down_proj (h x I)."""
    total, layer, emb = _llama_params()
    for ckpt in ("full", "none"):
        got = _items({"model": LLAMA, "activation_checkpointing": ckpt}, "backward_end")[GRADS]
        assert got == 2 * (total - layer - emb + 256 * 688)


def test_a_biased_output_projection_brings_its_bias_gradient():
    """GPT-NeoX's dense_4h_to_h: its weight (h x 4h) and bias (h), made by one AddmmBackward0."""
    h, i, L, V = 256, 1024, 4, 1000
    layer = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (i * h + i) + (h * i + h)
    total = V * h + L * layer + 2 * h + V * h
    got = _items({"model": NEOX, "activation_checkpointing": "full"}, "backward_end")[GRADS]
    assert got == 2 * (total - layer - V * h + h * i + h)


def test_no_gradient_is_made_early_without_full_training_or_on_several_gpus():
    """LoRA makes no base gradient; a data-parallel rank's gradients are not the one-GPU backward traced."""
    lora = _items(
        {
            "model": LLAMA,
            "activation_checkpointing": "full",
            "method": "lora",
            "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
        },
        "backward_end",
    )
    assert GRADS not in lora
    total, layer, emb = _llama_params()
    ddp = _items({"model": LLAMA, "parallel": {"dp": 2}}, "backward_end")
    assert ddp[GRADS] == 2 * (total - layer - emb)


def test_gpt_neox_keeps_the_whole_fused_qkv_output_when_no_kv_cache_copies_v():
    """Under checkpointing (no cache) SDPA's v is a chunk of query_key_value's (T, 3h) output: its q and k
    thirds stay too; with the training cache v is a torch.cat copy and the output is freed."""
    kept = "fused Wqkv output kept alive by the v view (its q and k parts)"
    ckpt = _items({"model": NEOX, "activation_checkpointing": "full"}, "backward_end")
    assert ckpt[kept] == 2 * T * (256 + 256)
    assert kept not in _items({"model": NEOX}, "forward_end")


def test_a_pre_norm_layernorm_saves_the_checkpointed_input_itself():
    """At layer 0's backward the recomputed LayerNorm's input is the checkpointed input: one tensor, counted
    once (GPT-NeoX); Llama's RMSNorm saves an fp32 copy, so the bf16 input is a tensor of its own."""
    neox = _items({"model": NEOX, "activation_checkpointing": "full"}, "backward_end")
    assert "checkpointed layer inputs" not in neox
    assert neox["LayerNorm inputs, mean and rstd"] == 2 * T * 256 + 2 * 8 * T  # the input once, mean and rstd
    llama = _items({"model": LLAMA, "activation_checkpointing": "full"}, "backward_end")
    assert llama["checkpointed layer inputs"] == 2 * T * 256


def test_the_optimizer_step_holds_the_batch_the_loop_still_references():
    """The loop's last micro-batch lives through the optimizer step (transformers 5.24 ``trainer.py``:
    ``batch_samples`` is referenced until after ``optimizer.step()``; traced: the "input" role there): input ids
    and labels, 2 x 8 B x b x s; with an image per sample, Qwen2-VL's pixel values (T_v = b x 16 x 16 patches of
    3 x 2 x 14 x 14 = 1176 values, bf16) and their (T_v, 2) int64 patch positions, and the (3, b, s) M-RoPE ids,
    s counting the image's tokens."""
    step = _items({"model": LLAMA}, "optimizer_step")
    assert step["input ids and labels"] == 2 * 8 * B * S
    vl = _items({"model": fidelity_cases.QWEN2_VL, "seq_len": 256}, "optimizer_step")
    tv = B * 16 * 16
    assert vl["pixel values, patch positions"] == 2 * tv * 1176 + 16 * tv
    assert vl["M-RoPE position ids"] == 8 * 3 * B * (256 + 64)  # the text and the image's 64 merged tokens
