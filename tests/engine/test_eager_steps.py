"""The eager step's op-by-op buffers (``engine/activations/eager_steps.py``): every buffer made is freed once, every
saved tensor and gradient of a layer is named once, and the step lists apply where the ops were read."""

from __future__ import annotations

import pytest
from fidelity_cases import LLAMA

from memsim_widget.engine.activations.compiled_backward import FREE_SAVED, GRADS
from memsim_widget.engine.activations.eager_steps import (
    CUDA_SCRATCH,
    HEAD_DONE,
    SAVED_COUNT,
    eager_layer_backward_transients,
    final_norm_backward_transients,
    layer_norm_backward_transients,
    rotary_transients,
)
from memsim_widget.engine.activations.forward import OUT, SAVED
from memsim_widget.engine.context import Context
from memsim_widget.scenario import Scenario

B, S, H, I, D = 2, 512, 256, 688, 32  # fidelity_cases.LLAMA: 8 heads of 32, 4 kv heads
T = B * S


def _ctx(**keys: object) -> Context:
    return Context(
        Scenario.from_dict({"model": LLAMA, "micro_batch_size": B, "seq_len": S, "precision": "bf16", **keys})
    )


def _balanced(steps) -> tuple[list[str], list[str]]:
    """Walk ``steps``: every buffer freed after it is made, none twice; the special steps' names in order."""
    live: set[str] = set()
    special = []
    for name, size in steps:
        if name.startswith((FREE_SAVED, GRADS)) or name in (HEAD_DONE, SAVED, CUDA_SCRATCH):
            special.append(name)
        elif size > 0:
            assert name not in live
            live.add(name)
        else:
            live.remove(name)
    return sorted(live), special


def test_a_layer_frees_each_saved_tensor_and_makes_each_gradient_once():
    """The 17 saved tensors of the stream's layer (its ``saved`` items' tensors) and its 9 parameters'
    gradients, each once, in autograd's order: the MLP's first, the input norm's last."""
    left, special = _balanced(eager_layer_backward_transients(_ctx()))
    assert left == []
    freed = [int(n[len(FREE_SAVED) :]) for n in special if n.startswith(FREE_SAVED)]
    assert sorted(freed) == list(range(17))
    assert [int(n[len(GRADS) :]) for n in special if n.startswith(GRADS)] == [6, 5, 4, 8, 3, 2, 1, 0, 7]
    assert special.count(CUDA_SCRATCH) == 1  # SDPA's backward kernel: its CUDA scratch made and freed there


def test_the_layer_buffers_are_the_traced_sizes():
    """The largest buffers alive at once: the MLP's (e T I) and the norms' fp32 T x h (4 B), as the trace makes
    them (tests/data/stream_vs_trace.py)."""
    sizes = {size for _n, size in eager_layer_backward_transients(_ctx()) if size > 0}
    assert max(sizes) == 2 * T * I
    assert 4 * T * H in sizes and 2 * T * H in sizes and 2 * T * 8 * D in sizes and 2 * T * 4 * D in sizes


def test_the_final_norm_frees_what_the_norm_and_head_saved():
    left, special = _balanced(final_norm_backward_transients(_ctx()))
    assert left == []
    assert special[0] == HEAD_DONE  # the logits' gradient released once the head's node has run
    assert sorted(int(n[len(FREE_SAVED) :]) for n in special[1:]) == list(range(SAVED_COUNT))


def test_the_rotary_embedding_leaves_its_positions_and_saved_outputs():
    steps = rotary_transients(_ctx())
    left, special = _balanced(steps)
    assert left == [OUT] and special == [SAVED]
    assert dict(steps)[OUT] == 8 * S  # int64 positions of one row


@pytest.mark.parametrize(
    ("keys", "layer", "norms"),
    [
        ({}, True, True),
        ({"activation_checkpointing": "full"}, True, True),  # the saved tensors are the recompute's
        ({"method": "lora", "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]}}, False, True),
        ({"precision": "fp32"}, False, False),  # x.float() is a no-op: other ops
        ({"compile": True}, False, False),  # Inductor's buffers (compiled_backward)
        ({"parallel": {"pp": 2}}, True, True),  # a pipeline stage's layers are one GPU's
        ({"parallel": {"tp": 2}}, False, False),  # TP, DDP: their streams keep their items
        ({"parallel": {"dp": 2}}, False, False),
    ],
)
def test_where_the_steps_apply(keys, layer, norms):
    ctx = _ctx(**keys)
    assert bool(eager_layer_backward_transients(ctx)) is layer
    assert bool(final_norm_backward_transients(ctx)) is norms
    assert bool(layer_norm_backward_transients(ctx)) is norms


def test_lora_leaves_the_norm_weights_product_out():
    """LoRA freezes the norms' weights: no ``grad * x`` for their gradient (2 B x T x h fewer a norm)."""
    full = final_norm_backward_transients(_ctx())
    lora = final_norm_backward_transients(
        _ctx(method="lora", lora={"rank": 8, "targets": ["q_proj", "v_proj"]})
    )
    assert len(full) - len(lora) == 2 and ("gw", 2 * T * H) in full and ("gw", 2 * T * H) not in lora
