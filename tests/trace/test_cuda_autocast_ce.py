"""The trace's cross-entropy under autocast as CUDA runs it (trace/cuda_autocast.py): on 16-bit logits a 16-bit
log-softmax saved, then nll_loss's fp32 copy of it saved; CPU autocast casts the logits to fp32 first and saves an
fp32 log-softmax. Read off the autograd graph of small real tensors (what backward keeps)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from memsim_widget.trace.cuda_autocast import cuda_like_autocast  # noqa: E402


def _logits(dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(6, 11).to(dtype).requires_grad_()
    return x, torch.randint(0, 11, (6,))


def _chain(loss: torch.Tensor) -> list[tuple[str, torch.dtype | None]]:
    """The loss's graph down to the logits: each node's name and the dtype of the big tensor it saved."""
    out, fn = [], loss.grad_fn
    while fn is not None and fn.name() != "torch::autograd::AccumulateGrad":
        saved = (
            getattr(fn, "_saved_result", None)
            if "LogSoftmax" in fn.name()
            else getattr(fn, "_saved_self", None)
        )
        out.append((fn.name(), saved.dtype if isinstance(saved, torch.Tensor) else None))
        fn = fn.next_functions[0][0]
    return out


def test_cuda_autocast_saves_a_16_bit_log_softmax_and_nll_losss_fp32_copy() -> None:
    x, y = _logits()
    with cuda_like_autocast(torch.bfloat16):
        loss = F.cross_entropy(x, y)
    assert _chain(loss) == [
        ("NllLossBackward0", torch.float32),  # nll_loss (CUDA's fp32 list) saves its fp32 copy
        ("ToCopyBackward0", None),  # the copy's cast: its gradient cast back to bf16
        ("LogSoftmaxBackward0", torch.bfloat16),  # log_softmax(x, dtype=x.dtype): the given dtype kept
    ]
    with torch.autocast("cpu", dtype=torch.bfloat16):  # CPU autocast: cross_entropy_loss on its fp32 list
        cpu = F.cross_entropy(x, y)
    assert _chain(cpu) == [
        ("NllLossBackward0", torch.float32),
        ("LogSoftmaxBackward0", torch.float32),
        ("ToCopyBackward0", None),  # the logits cast to fp32 first
    ]
    assert loss.dtype == cpu.dtype == torch.float32
    assert torch.allclose(loss, F.cross_entropy(x.float(), y), rtol=2e-2)  # the same loss, to bf16 rounding
    loss.backward()
    assert x.grad is not None and x.grad.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "case",
    [
        {"label_smoothing": 0.1},  # the label-smoothing composite: left to CPU's policy
        {"dtype": torch.float32},  # fp32 logits (a loss that upcasts them): the same on both devices
        {"autocast": False},  # no autocast: nothing changes
    ],
    ids=["label smoothing", "fp32 logits", "no autocast"],
)
def test_other_cross_entropies_run_as_before(case: dict) -> None:
    x, y = _logits(case.get("dtype", torch.bfloat16))
    kw = {k: v for k, v in case.items() if k == "label_smoothing"}
    amp = torch.bfloat16 if case.get("autocast", True) else None
    with cuda_like_autocast(amp):
        got = F.cross_entropy(x, y, **kw)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp is not None):
        want = F.cross_entropy(x, y, **kw)
    assert _chain(got) == _chain(want)
    assert torch.equal(got, want)
