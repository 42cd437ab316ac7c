"""``framework: "liger"``: Liger Kernel's patches as a formula from its source (engine/activations/liger.py),
labelled untraced: its Triton kernels need a GPU."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memsim_widget.engine.activations import activations
from memsim_widget.engine.activations.liger import flce_chunk
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.trace.traceable import check_traceable

BASE = {"model": "llama-3.2-1b", "micro_batch_size": 2, "seq_len": 1024, "precision": "bf16"}


def test_the_fused_loss_chunk_follows_ligers_formula() -> None:
    """Liger's example (fused_linear_cross_entropy.py): BT = 4096 x 4, V = 32000, H = 4096 -> 2048 tokens; Llama 3.2
    1B at BT 2048: ceil(128256 / 2048) = 63, ceil(2048 / 63) = 33 -> 64 tokens."""
    assert flce_chunk(4096 * 4, 32000, 4096) == 2048
    assert flce_chunk(2048, 128256, 2048) == 64


@given(st.integers(1, 1 << 16), st.integers(2, 1 << 18), st.integers(64, 16384))
def test_one_chunks_logits_stay_within_twice_bt_x_h(T: int, V: int, h: int) -> None:
    """The chunk is a power of two at most BT; its logits are at most about 2 x BT x H elements (the power of two
    rounds up by less than 2x), Liger's stated budget."""
    c = flce_chunk(T, V, h)
    assert 1 <= c <= T
    assert c == T or c & (c - 1) == 0  # a power of two unless one chunk covers BT
    assert c * V <= 2 * T * h + 2 * V


def test_liger_saves_the_hidden_and_head_gradients_instead_of_the_logits() -> None:
    """Full bf16 training: the loss keeps the hidden state's gradient (2 B x T x h) and the head's (2 B x V x h), made
    in forward; one 64-token chunk's logits and a fp32 per-token loss are its forward transients; no logits are
    returned and the loss's backward makes nothing."""
    T, h, V = 2048, 2048, 128256
    out = activations(Context(Scenario.from_dict({**BASE, "framework": "liger"})))
    assert sum(t.bytes for t in out.loss_saved) == 2 * T * h + 2 * V * h
    assert sum(t.bytes for t in out.loss_forward) == 2 * 64 * V + 4 * T
    assert out.loss_backward == [] and out.output_logits == []


def test_ligers_norm_and_swiglu_save_less_than_hfs() -> None:
    """Per layer in bf16: Liger's RMSNorm saves its 2-byte input and a fp32 rstd where HF's saves the fp32 input, the
    rsqrt and the 2-byte normalised product (2 norms x 4 B x T x h less), and Liger's SwiGLU saves gate and up only
    (2 B x T x I less)."""
    T, h, I = 2048, 2048, 8192
    hf = activations(Context(Scenario.from_dict(BASE))).layer_bytes()
    liger = activations(Context(Scenario.from_dict({**BASE, "framework": "liger"}))).layer_bytes()
    assert hf - liger == 2 * 4 * T * h + 2 * T * I


def test_liger_is_labelled_untraced_and_refused_by_the_tracer() -> None:
    sc = Scenario.from_dict({**BASE, "framework": "liger"})
    assert any("untraced" in c for c in estimate(sc).caveats)
    amp = estimate(Scenario.from_dict({**BASE, "framework": "liger", "precision": "amp-bf16"}))
    assert any("fused linear cross-entropy only" in c for c in amp.caveats)
    with pytest.raises(ScenarioError) as err:
        check_traceable(sc)
    assert err.value.field == "framework"
