"""A cross-entropy straight on 16-bit logits under autocast (BERT's and RoBERTa's masked-LM loss, T5's) as CUDA
runs it (engine/activations/loss.autocast_ce_terms; trace/cuda_autocast.py has the PyTorch sources): the 16-bit
log-softmax and nll_loss's fp32 copy of it saved, nll_loss's fp32 gradient at backward's start. CPU autocast, which
the trace used to follow, runs the whole loss in fp32: an fp32 log-softmax saved and two fp32 gradients."""

from __future__ import annotations

import pytest

from memsim_widget import Scenario
from memsim_widget.engine.activations import activations
from memsim_widget.engine.activations.loss import NLL_FP32_COPY
from memsim_widget.engine.context import Context
from memsim_widget.engine.counters.alloc_stream import rank_stream, replay_stream
from memsim_widget.engine.frameworks import allocator_conf
from memsim_widget.engine.rl import objectives

#: benchmarks/gpu_measure.py's roberta-base-amp run (H200, data/measured/gpu_h200.csv).
ROBERTA_AMP = {"model": "roberta-base", "gpu": "h200", "precision": "amp-bf16", "micro_batch_size": 32,
               "seq_len": 512}  # fmt: skip
T, V, H = 32 * 512, 50265, 768


def _loss(d: dict) -> dict[str, int]:
    """The loss's groups in bytes."""
    acts = activations(Context(Scenario.from_dict(d)))
    groups = ("loss_forward", "loss_saved", "loss_backward", "logits_grad")
    return {g: sum(t.bytes for t in getattr(acts, g)) for g in groups}


def test_an_mlm_loss_under_autocast_saves_16_bit_log_softmax_and_nll_losss_fp32_copy() -> None:
    """RoBERTa's masked-LM loss under amp-bf16: the bf16 logits (2 T V, dropped before backward; beside them the
    model output's fp32 last hidden state, 4 T h), saved 2 T V + 4 T V, nll_loss's fp32 gradient 4 T V: 10 T V at
    backward's start (CPU autocast's fp32 loss: 12 T V)."""
    assert _loss(ROBERTA_AMP) == {
        "loss_forward": 2 * T * V + 4 * T * H,
        "loss_saved": (2 + 4) * T * V,
        "loss_backward": 4 * T * V,
        "logits_grad": 2 * T * V,
    }
    names = [t.name for t in activations(Context(Scenario.from_dict(ROBERTA_AMP))).loss_saved]
    assert names[-1] == NLL_FP32_COPY  # what the allocation stream frees first in backward


@pytest.mark.parametrize(
    ("d", "saved", "backward"),
    [
        ({**ROBERTA_AMP, "precision": "bf16"}, 2, 2 * 2),  # no autocast: the loss in the logits' dtype
        ({**ROBERTA_AMP, "precision": "fp32"}, 4, 2 * 4),
        ({**ROBERTA_AMP, "model": "llama-3.2-1b"}, 4, 2 * 4),  # ForCausalLMLoss upcasts (.float()) itself
    ],
    ids=["bf16", "fp32", "llama amp"],
)
def test_losses_without_cuda_autocasts_cross_entropy_keep_their_terms(
    d: dict, saved: int, backward: int
) -> None:
    """Only a cross-entropy on 16-bit logits under autocast changes: the same loss without autocast, and a
    loss that upcasts the logits itself, keep one saved log-softmax and two gradient buffers."""
    v = 128256 if d["model"] == "llama-3.2-1b" else V
    got = _loss(d)
    assert (got["loss_saved"], got["loss_backward"]) == (saved * T * v, backward * T * v)


def test_roberta_amp_stream_replays_as_its_trace() -> None:
    """The H200 roberta-base-amp run: its fake-tensor trace, with CUDA autocast's cross-entropy, replays to
    20,671,627,264 B reserved (benchmarks/allocator_replay_h200.json; measured 20,663,238,656 B). With CPU
    autocast's fp32 loss the engine's stream reached 17.63 GiB (-8.4%): one 16-bit T x V more at the loss
    changed which cached segments step 2 reused. In CUDA's order (nll_loss's fp32 gradient, its copy freed, the
    16-bit cast back, log-softmax's 16-bit gradient) within 1%."""
    ctx = Context(objectives.training_scenario(Scenario.from_dict(ROBERTA_AMP)))
    rep = replay_stream(rank_stream(ctx, ctx.stages[0]), allocator_conf(ctx))
    assert abs(rep.peak_reserved / 20_671_627_264 - 1) < 0.01
