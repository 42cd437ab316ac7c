"""SDPA and dropout in a CPU trace as CUDA runs them (trace/cuda_sdpa.py): the backend CUDA picks, and the bytes
each stand-in kernel allocates and saves, from the sizes PyTorch's CUDA sources allocate."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from memsim_widget.scenario import Scenario  # noqa: E402
from memsim_widget.trace.cuda_sdpa import CudaKernels, CudaSdpaDevice, select_backend  # noqa: E402
from memsim_widget.trace.traceable import trace_kwargs  # noqa: E402
from memsim_widget.trace.tracker import MemoryTracker  # noqa: E402

H200 = CudaSdpaDevice((9, 0))  # cuDNN 9.20: cuDNN first (check_prefer_cudnn_attention)
A100 = CudaSdpaDevice((8, 0))  # flash, efficient, math


def _qkv(b=2, h=4, t=256, d=64, dtype=torch.bfloat16, hk=None, tk=None):  # noqa: ANN001, ANN202
    q = torch.empty(b, h, t, d, dtype=dtype)
    k = torch.empty(b, hk or h, tk or t, d, dtype=dtype)
    return q, k, torch.empty_like(k)


@pytest.mark.parametrize(
    ("case", "dev", "expected"),
    [
        ({}, H200, "cudnn"),  # 16-bit, no mask, no dropout
        ({"dropout": 0.1}, H200, "flash"),  # cuDNN's dropout is in steps of 1/16
        ({"dropout": 0.125}, H200, "cudnn"),
        ({"dropout": 0.1, "mask": True}, H200, "efficient"),  # flash takes no mask
        ({"dtype": torch.float32}, H200, "efficient"),  # flash and cuDNN are 16-bit only
        ({}, A100, "flash"),  # no cuDNN preference before sm90
        ({"causal": True, "tk": 128}, A100, "efficient"),  # flash: causal needs square attention
        ({"d": 68}, A100, "flash"),  # flash pads the head dim to a multiple of 8
        ({"d": 68, "dtype": torch.float32}, A100, "efficient"),  # fp32: multiples of 4
        ({"d": 66, "dtype": torch.float32}, A100, "math"),
        ({"hk": 2}, A100, "math"),  # fewer key heads without enable_gqa
        ({"hk": 2, "gqa": True}, A100, "flash"),
        ({"dtype": torch.bfloat16}, CudaSdpaDevice((7, 5)), "math"),  # no bf16 kernel before sm80
    ],
)
def test_select_backend_follows_cudas_filters(case: dict, dev: CudaSdpaDevice, expected: str) -> None:
    q, k, v = _qkv(
        d=case.get("d", 64), dtype=case.get("dtype", torch.bfloat16), hk=case.get("hk"), tk=case.get("tk")
    )
    mask = torch.zeros(1, 1, q.shape[2], k.shape[2], dtype=q.dtype) if case.get("mask") else None
    got = select_backend(
        q, k, v, mask, case.get("dropout", 0.0), case.get("causal", False), case.get("gqa", False), dev
    )
    assert got == expected


@pytest.mark.parametrize("dev", [H200, A100])
def test_a_mask_whose_last_dim_is_not_contiguous_fails_every_fused_kernel(dev: CudaSdpaDevice) -> None:
    """``check_last_dim_stride_equals_1_dense`` (torch 2.13.0 ``ATen/native/transformers/sdp_utils_cpp.h``): on CUDA
    the mask's last dim must have stride 1 too. transformers 5.17's all-visible bidirectional mask under compile is
    an expand of a (1, 1, s, 1) column (stride 0): cuDNN and the efficient kernel refuse it, flash takes no mask, so
    CUDA runs the math path; the same mask made contiguous takes a fused kernel."""
    q, k, v = _qkv()
    column = torch.ones(1, 1, q.shape[2], 1, dtype=torch.bool).expand(q.shape[0], 1, q.shape[2], k.shape[2])
    assert column.stride(-1) == 0
    assert select_backend(q, k, v, column, 0.0, False, False, dev) == "math"
    assert select_backend(q, k, v, column.contiguous(), 0.0, False, False, dev) != "math"


def test_flash_head_dim_limits_on_sm86_training() -> None:
    """sm86-89 and sm120: flash trains head dims up to 192, or above 224 without dropout."""
    q, k, v = (x.requires_grad_() for x in _qkv(d=256))
    assert select_backend(q, k, v, None, 0.1, False, False, CudaSdpaDevice((8, 6))) == "efficient"
    assert select_backend(q, k, v, None, 0.0, False, False, CudaSdpaDevice((8, 6))) == "flash"


def _traced(fn, *shapes_and_dtypes, requires_grad=True):  # noqa: ANN001, ANN002, ANN202
    """Run ``fn`` on fake inputs under the tracker and CUDA's kernels (H200), then backward; the records."""
    with FakeTensorMode():
        xs = [torch.empty(s, dtype=dt, requires_grad=requires_grad) for s, dt in shapes_and_dtypes]
        tracker = MemoryTracker(mark_saved=True)
        with tracker, CudaKernels(H200):
            out = fn(*xs)
            tracker.set_phase("backward")
            out.sum().backward()
    return tracker.records


def test_flash_stand_in_allocates_what_mha_fwd_and_mha_bwd_do() -> None:
    b, h, t, d = 2, 4, 200, 64
    recs = _traced(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True),
        *[((b, h, t, d), torch.bfloat16)] * 3,
    )
    fwd = [r for r in recs if r.phase == "setup" and r.op not in ("<untracked input>",)]
    sizes = [r.nbytes for r in fwd]
    # out (B, T, H, D) bf16, softmax_lse fp32 (B, H, T), rng_state 2 x 8 B, _unused 8 B
    assert sizes[:4] == [b * t * h * d * 2, b * h * t * 4, 16, 8]
    assert {r.nbytes for r in fwd if r.saved} >= {b * t * h * d * 2, b * h * t * 4, 16}
    bwd = [r.nbytes for r in recs if r.phase == "backward" and r.op in ("empty", "empty_like")]
    # dq, dk, dv; softmax_d fp32 (B, H, round128(T)); dq_accum fp32 (B, round128(T), H, round32(D))
    assert bwd == [b * t * h * d * 2] * 3 + [b * h * 256 * 4, b * 256 * h * 64 * 4]


def test_efficient_stand_in_allocates_what_the_cutlass_kernels_do() -> None:
    b, h, t, d = 2, 4, 100, 64

    def attn(q, k, v, mask):  # noqa: ANN001, ANN202
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.detach(), dropout_p=0.1)

    recs = _traced(attn, *[((b, h, t, d), torch.bfloat16)] * 3, ((1, h, t, t), torch.bfloat16))
    fwd = [r.nbytes for r in recs if r.phase == "setup" and r.op == "empty"]
    # the mask padded to a multiple of 8 (stride 100), then res (B, M, H, Kv) bf16, logsumexp fp32 (B, H, ceil(M/32)*32); seed and offset on the host
    assert [r.nbytes for r in recs if r.op == "constant_pad_nd"] == [h * t * 104 * 2]
    assert fwd == [b * t * h * d * 2, b * h * 128 * 4]
    bwd = [r.nbytes for r in recs if r.phase == "backward" and r.op == "empty"]
    # grad_q, grad_k, grad_v; delta fp32 (B, H, M); the fp32 grad_q workspace: ceil(M/64) x ceil(D/64) 64 x 64 tiles
    assert bwd == [b * t * h * d * 2] * 3 + [b * h * t * 4, b * h * 2 * 64 * 64 * 4]


def test_a_mask_that_needs_a_gradient_is_left_to_the_math_path() -> None:
    """The measured exception (module docstring: the H200's t5-base run)."""
    with FakeTensorMode():
        q, k, v = (torch.empty(1, 2, 64, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        mask = torch.zeros(1, 2, 64, 64, dtype=torch.bfloat16, requires_grad=True)
        with CudaKernels(H200) as mode:
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1)
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask.detach(), dropout_p=0.1)
    assert sorted(mode.chosen) == ["efficient", "math (the mask needs a gradient: as measured)"]


def test_math_path_drops_out_with_a_one_byte_mask_on_fp32_probabilities() -> None:
    """fp32 q with d = 66 on an H200 (no fused kernel takes it): the math composite, upcast probabilities, CUDA's
    fused dropout: a 1-byte mask beside the fp32 probabilities, no fp32 noise tensor."""
    b, h, t, d = 1, 2, 64, 66

    def attn(q, k, v):  # noqa: ANN001, ANN202
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)

    recs = _traced(attn, *[((b, h, t, d), torch.float32)] * 3)
    dropped = [(r.dtype, r.nbytes, r.saved) for r in recs if r.op == "native_dropout"]
    assert dropped == [("float32", b * h * t * t * 4, True), ("bool", b * h * t * t, True)]
    assert not [r for r in recs if r.op == "bernoulli"]


def test_math_path_under_autocast_runs_in_fp32_as_autocasts_sdpa_kernel_does() -> None:
    """Autocast's SDPA kernel casts q, k, v and the mask to bf16 and runs the composite without autocast: the
    probabilities stay fp32 (a CPU-autocast matmul inside would make them bf16)."""
    with FakeTensorMode():
        q, k, v = (torch.empty(1, 2, 64, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        mask = torch.zeros(1, 2, 64, 64, requires_grad=True)
        tracker = MemoryTracker(mark_saved=True)
        with tracker, torch.autocast("cpu", dtype=torch.bfloat16), CudaKernels(H200):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1)
    probs = [(r.dtype, r.saved) for r in tracker.records if r.op == "_safe_softmax"]
    assert probs == [("float32", True)]
    assert [r.dtype for r in tracker.records if r.op == "native_dropout"] == ["float32", "bool"]


def test_a_cudnn_call_allocates_what_the_cpu_op_does_under_autocast() -> None:
    """cuDNN saves what the CPU's fused kernel saves: the call runs the CPU's op on autocast's casts, made once
    (fp32 q and k, as after Llama's RoPE under autocast)."""

    def run(kernels: bool) -> list[tuple[str, int]]:
        with FakeTensorMode():
            q, k = (torch.empty(1, 2, 64, 32, requires_grad=True) for _ in range(2))
            v = torch.empty(1, 2, 64, 32, dtype=torch.bfloat16, requires_grad=True)
            tracker = MemoryTracker()
            mode = CudaKernels(H200) if kernels else torch.autocast("cpu", dtype=torch.bfloat16)
            with tracker, torch.autocast("cpu", dtype=torch.bfloat16), mode:
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return [(r.op, r.nbytes) for r in tracker.records]

    assert run(True) == run(False)


def test_dropout_keeps_a_one_byte_mask() -> None:
    n = 4096
    recs = _traced(lambda x: F.dropout(x, 0.1, True), ((n,), torch.float32))
    made = [(r.dtype, r.nbytes, r.saved) for r in recs if r.phase == "setup" and r.op == "native_dropout"]
    assert made == [("float32", 4 * n, False), ("bool", n, True)]


def test_trace_kwargs_names_the_cards_compute_capability() -> None:
    assert trace_kwargs(Scenario(gpu="h200"))["sdpa_device"] == (9, 0)
    assert trace_kwargs(Scenario(gpu="rtx-4090"))["sdpa_device"] == (8, 9)
    assert trace_kwargs(Scenario(gpu="a10"))["sdpa_device"] == (8, 6)
    assert trace_kwargs(Scenario(gpu="mi300x"))["sdpa_device"] is None
