"""One GPU's head and embedding gradients as autograd makes them (``engine/states/gradients.one_gpu_backward``).

The bytes are exact: each tensor is a parameter's elements x the gradient's bytes (bf16: 2 B), or T x V x 2 B
for the logits' gradient. The traces these rules were read from are ``fidelity_cases.ONE_GPU_GRAD_CASES``
(tests/trace/test_fidelity_trace.py holds the engine's peak to them within 0.1%)."""

from __future__ import annotations

import pytest
from fidelity_cases import LLAMA_H512_V32K

from memsim_widget import Scenario, estimate

V, H = LLAMA_H512_V32K["vocab_size"], LLAMA_H512_V32K["hidden_size"]
VH = V * H * 2  # one V x h bf16 gradient: 32,768,000 B
TIED = {"model": {**LLAMA_H512_V32K, "tie_word_embeddings": True}, "micro_batch_size": 1, "seq_len": 128,
        "optimizer": "sgd"}  # fmt: skip
UNTIED = {"model": LLAMA_H512_V32K, "micro_batch_size": 1, "seq_len": 64, "optimizer": "sgd"}


def _moment(d: dict, name: str) -> dict[str, int]:
    est = estimate(Scenario.from_dict(d))
    m = next(m for m in est.worst.moments if m.name == name)
    out: dict[str, int] = {}
    for i in m.items:
        out[i.item] = out.get(i.item, 0) + i.bytes
    return out


def _bottom(d: dict) -> int:
    return next(
        m for m in estimate(Scenario.from_dict(d)).worst.moments if m.name == "backward_end"
    ).tensor_bytes


def test_the_tied_embeddings_bottom_holds_both_parts_and_in_a_later_micro_batch_their_sum_too():
    """Tied: the head's part waits in autograd's buffer, the embedding's backward makes the other, the buffer
    sums them out of place; one micro-batch a step, the sum becomes .grad (it is in the gradients), so two
    V x h tensors are extra (``tied_head_grad``); in a later one the sum is a third beside the accumulated
    .grad (``one_gpu_backward``)."""
    two = "the tied embedding's two gradients (the head's and its own) beside their sum"
    third = "tied embeddings' gradient: their sum (out of place), in autograd's input buffer"
    one = _moment(TIED, "backward_end")
    three = _moment({**TIED, "grad_accum_steps": 3}, "backward_end")
    assert one[two] == 2 * VH and third not in one
    assert three[two] == 2 * VH and three[third] == VH
    assert _bottom({**TIED, "grad_accum_steps": 3}) - _bottom(TIED) == VH


@pytest.mark.parametrize("accum", [1, 3])
def test_the_tied_heads_part_is_alive_through_backward(accum: int):
    """From the head's backward to the embedding's the head's part of the tied gradient is alive: beside the
    head's and final norm's gradients (one micro-batch a step), beside every accumulated one (a later one); at
    the top of backward also the top layer's down projection's weight gradient (Llama: no bias), made as its
    matmul's backward ends (tests/engine/test_top_layer_mlp_backward.py)."""
    top = _moment({**TIED, "grad_accum_steps": accum}, "backward_top")
    name = (
        "the tied embedding's gradient made by the head (held by autograd until the embedding's backward)"
        if accum == 1
        else "tied embeddings' gradient: the head's part, in autograd's input buffer"
    )
    assert top[name] == VH
    down = LLAMA_H512_V32K["intermediate_size"] * H * 2
    weights = sum(v for k, v in top.items() if "gradient" in k and not k.startswith("activation"))
    assert weights == VH + (1024 if accum == 1 else 55_976_960) + down


def test_a_later_micro_batch_makes_the_heads_and_the_embeddings_new_gradients():
    """Untied, three micro-batches: lm_head's new weight gradient beside the logits' gradient (T x V x 2 B)
    and every accumulated gradient at the head's backward; the embedding's new gradient at the bottom. One
    micro-batch a step makes neither apart (each becomes .grad)."""
    head = _moment({**UNTIED, "grad_accum_steps": 3}, "head_backward")
    new = "a new gradient before it is added to the accumulated one"
    assert head[new] == VH and head["logits' gradient (head backward)"] == 64 * V * 2
    assert _bottom({**UNTIED, "grad_accum_steps": 3}) - _bottom(UNTIED) == VH
    assert new not in _moment(UNTIED, "head_backward") and new not in _moment(UNTIED, "backward_end")


def test_no_rule_without_full_training_or_on_a_data_parallel_rank():
    """LoRA trains no embedding or head; DDP (dp 2) is untraced here: neither gets the one-GPU items."""
    lora = {**TIED, "method": "lora", "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]}}
    ddp = {**TIED, "parallel": {"dp": 2}}
    for d in (lora, ddp):
        for name in ("backward_top", "backward_end"):
            assert not [k for k in _moment({**d, "grad_accum_steps": 3}, name) if "tied emb" in k]
