"""The engine's peak live tensor bytes stay within 3% of a fake-tensor trace of the same training step.

A fast subset of ``fidelity_cases.CASES (tests/data)`` (HF Llama, Mistral, Qwen2, Mixtral, GPT-2; bf16, fp32,
autocast; SDPA and eager; LoRA; optimizers); the benchmark runs all of them.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from fidelity_cases import CASES, ONE_GPU_GRAD_CASES, compare  # noqa: E402

#: Every test here runs a real trace on fake tensors: behind the slow marker (scripts/dev test runs it).
pytestmark = pytest.mark.slow

FAST = [
    "llama bf16 sdpa b2 s512",
    "llama bf16 sdpa b1 s64",
    "llama fp32 sdpa b2 s512",
    "llama amp-bf16 sdpa b2 s512",
    "llama bf16 eager b2 s256",
    "llama bf16 lora qv fp32 b2 s512",
    "llama amp-bf16 lora qv b2 s512",
    "mistral bf16 sdpa b2 s512",
    "qwen2 bf16 sdpa b2 s512",
    "mixtral bf16 sdpa b2 s512",
    "mixtral bf16 lora qv b2 s512",
    "gpt2 bf16 sdpa b2 s512",
    "gpt2 amp-bf16 sdpa b2 s512",
    "t5 bf16 sdpa b2 s512 (no dropout)",
    "t5 bf16 lora q/v b2 s512 (no dropout)",
]
TOLERANCE = 0.03
#: Where one GPU's head and embedding gradients make the peak (each within 0.05% of its trace when added)
ONE_GPU_GRADS = {
    "llama h512 V32k tied sgd b1 s128": "backward_end",
    "llama h512 V32k tied b1 s128 accum 3": "backward_end",
    "llama h512 V32k sgd b1 s64 accum 3": "head_backward",
    "llama h512 V32k sgd ckpt b1 s64 accum 3": "head_backward",
}


@pytest.mark.parametrize("name", FAST)
def test_engine_peak_within_three_percent_of_trace(name):
    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < TOLERANCE, r


@pytest.mark.parametrize("name", list(ONE_GPU_GRADS))
def test_one_gpus_head_and_embedding_gradients_meet_the_trace(name):
    """The tied embeddings' two parts and their out-of-place sum at the bottom of backward (beside the
    accumulated .grad in a later micro-batch), lm_head's new gradient beside the logits' gradient at the top
    (engine/states/gradients.one_gpu_backward): the engine's peak is the trace's within 0.1%, at the moment
    the trace's peak op runs in (the bottom: embedding_dense_backward's add; the top: lm_head's mm)."""
    assert dict(ONE_GPU_GRAD_CASES)[name]
    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.001, r
    assert r["engine_moment"] == ONE_GPU_GRADS[name]
    assert r["trace_op"] == ("add" if ONE_GPU_GRADS[name] == "backward_end" else "mm")


def test_trace_autocast_runs_pow_in_fp32_as_cuda_does():
    """CUDA autocast's fp32 list has pow, CPU's has not: the trace follows CUDA (gelu_new's saved chain)."""
    import torch

    from memsim_widget.trace.cuda_autocast import cuda_like_autocast

    x = torch.ones(4, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.pow(x, 3.0).dtype == torch.bfloat16  # what plain CPU autocast does
    with cuda_like_autocast(torch.bfloat16):
        assert torch.pow(x, 3.0).dtype == torch.float32
        assert (x**3).dtype == torch.float32 and x.pow(3).dtype == torch.float32
        assert (x * 2).dtype == torch.bfloat16  # ops outside the list are untouched
    assert torch.pow(x, 3.0).dtype == torch.bfloat16  # and nothing is left behind
    with cuda_like_autocast(None):
        assert torch.pow(x, 3.0).dtype == torch.bfloat16


def test_trace_autocast_runs_softplus_in_fp32_also_when_a_checkpoint_recomputes():
    """softplus is on CUDA autocast's fp32 list (the Mamba scans' dt); a checkpointed layer recomputes inside
    backward, outside the forward's mode, so recompute_context puts it back: without it checkpoint raises on the
    recomputed dtype (what the Mamba amp + checkpointing trace hit)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from memsim_widget.trace.cuda_autocast import cuda_like_autocast, recompute_context

    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    seen = []

    def layer(t):
        y = torch.nn.functional.softplus(lin(t))
        seen.append(y.dtype)
        return y.sum()

    with cuda_like_autocast(torch.bfloat16):
        loss = checkpoint(layer, x, use_reentrant=False, context_fn=recompute_context)
    loss.backward()  # the recomputation (stopped early once softplus's output is back) matches the forward
    assert seen == [torch.float32] and x.grad is not None
    x.grad = None
    with cuda_like_autocast(torch.bfloat16):
        loss = checkpoint(layer, x, use_reentrant=False)
    with pytest.raises(torch.utils.checkpoint.CheckpointError):
        loss.backward()
