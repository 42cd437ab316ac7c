"""A loop's loss compiled apart from the model (torchtitan: ``torch.compile(cross_entropy_loss)``), traced alone on
fake logits at a real vocabulary (Llama 3's 128,256) through Dynamo, AOTAutograd and the min-cut partitioner
(``trace/compiled.trace_compiled_loss``), against the engine's terms (``activations/loss.compiled_apart_terms``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from fidelity_cases import LLAMA  # noqa: E402

from memsim_widget.engine.activations import activations  # noqa: E402
from memsim_widget.engine.context import Context  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402
from memsim_widget.trace.compiled import trace_compiled_loss  # noqa: E402

B, S, V = 2, 64, 128_256
T = B * S


def _terms(**keys: object) -> tuple[int, int, int, int]:
    """The engine's loss terms of a one-GPU torchtitan bf16 step at B x S over V: (forward, saved, backward,
    logits' gradient) bytes."""
    sc = Scenario.from_dict(
        {"model": {**LLAMA, "vocab_size": V}, "micro_batch_size": B, "seq_len": S, "precision": "bf16",
         "framework": "torchtitan", "compile": True, **keys}
    )  # fmt: skip
    acts = activations(Context(sc))
    return tuple(  # type: ignore[return-value]
        sum(t.bytes for t in group)
        for group in (acts.loss_forward, acts.loss_saved, acts.loss_backward, acts.logits_grad)
    )


@pytest.fixture(scope="module")
def traced() -> dict[str, int]:
    return trace_compiled_loss(B, S, V)


def test_the_compiled_loss_saves_its_logits_and_three_per_row_tensors(traced: dict[str, int]) -> None:
    """The forward makes no T x V buffer (upcast, log-softmax and gather fused); it saves the bf16 logits and each
    row's fp32 max and log-sum-exp and int64 label index: 2 B x T x V + 16 B x T, and one 4 B scalar the engine
    leaves out."""
    forward, saved, _, _ = _terms()
    assert forward == 0
    assert saved == 2 * T * V + 16 * T
    assert traced["saved"] - saved == 4


def test_its_backward_holds_one_fp32_buffer_and_returns_the_logits_gradient(traced: dict[str, int]) -> None:
    """The default trace's backward peak: the saved tensors and nll_loss's fp32 T x V gradient (zeros scattered at
    the labels), as the engine's loss-backward moment counts them (within the backward's per-row scalars, 8 B x T);
    the gradient it returns is the logits' dtype, the engine's ``logits_grad``."""
    _, saved, backward, grad = _terms()
    assert backward == 4 * T * V
    assert 0 <= traced["backward_peak"] - (saved + backward) <= 8 * T + 16
    assert grad == traced["gradient"] == 2 * T * V


def test_inductors_joint_graph_pass_leaves_only_the_saved_logits_and_the_gradient() -> None:
    """With Inductor's passes (``scatter_upon_const_tensor`` turns the scatter into a fused ``where``) the backward
    holds the saved tensors and the gradient only: what the allocation stream writes
    (``alloc_stream._loss_backward``)."""
    _, saved, _, grad = _terms()
    got = trace_compiled_loss(B, S, V, inductor=True)
    assert 0 <= got["backward_peak"] - (saved + grad) <= 8 * T + 16


def test_the_eager_loss_holds_twice_the_compiled_ones_bytes_at_its_backward() -> None:
    """``compile_loss`` false (torchtitan of December 2024) is the eager loss, as without compile: its saved fp32
    log-softmax and two fp32 buffers in backward, 12 B x T x V, where the compiled loss holds 6 B x T x V and its
    per-row tensors."""
    eager = _terms(compile_loss=False)
    assert eager == _terms(compile=False)
    assert eager[1] + eager[2] == 12 * T * V
    assert sum(_terms()[1:3]) == 6 * T * V + 16 * T


@pytest.mark.slow
def test_a_torchtitan_compiled_step_traces_its_blocks_and_loss_apart() -> None:
    """``memsim trace`` (Verify) of a torchtitan compiled step runs what torchtitan runs: each decoder layer
    compiled apart (``apply_compile``), the rest eager, the loss computed on the logits by the loop and compiled
    apart. The compiled loss lowers the peak by exactly what the engine's terms say (the small Llama at a 32k
    vocabulary, 2 x 512: 196,608,000 B both); the compiled blocks save less than eager's terms, which the engine
    keeps for torchtitan (+3.26% over the trace with the loss eager, +4.46% compiled: never under)."""
    pytest.importorskip("transformers")
    from fidelity_cases import LLAMA_H512_V32K

    from memsim_widget.engine.core import estimate
    from memsim_widget.trace.api import trace_scenario

    def both(**keys: object) -> tuple[int, int]:
        sc = Scenario.from_dict(
            {"model": LLAMA_H512_V32K, "micro_batch_size": 2, "seq_len": 512, "precision": "bf16",
             "framework": "torchtitan", "compile": True, **keys}
        )  # fmt: skip
        r = trace_scenario(sc)
        assert any("each decoder layer apart" in n for n in r.notes)
        return r.peak_bytes, estimate(sc).peak_tensor_bytes

    (t_on, e_on), (t_off, e_off) = both(), both(compile_loss=False)
    assert t_off - t_on == e_off - e_on
    assert 0 <= e_on / t_on - 1 < 0.05 and 0 <= e_off / t_off - 1 < 0.05
