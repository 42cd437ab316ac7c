"""SDPA and dropout in a trace on the CPU as CUDA runs them: SDPA's backend choice and the chosen kernel's
tensors, and dropout's fused kernel.

A trace runs on CPU fake tensors, where ``F.scaled_dot_product_attention`` picks among the CPU's backends: its
fused (flash) kernel has no dropout (``check_for_dropout``), so a training step with attention dropout runs the
math composite, which saves the attention probabilities and the dropout mask per layer (O(T^2)). CUDA picks
among cuDNN, flash and memory-efficient kernels that apply dropout inside the kernel and save O(T) tensors.
When the scenario's card is an NVIDIA GPU this mode replaces each SDPA call whose CUDA backend is flash or
memory-efficient by a stand-in that allocates, in the kernel's order, what that kernel allocates: its outputs,
what autograd saves for backward, and its backward's gradients and scratch. Math calls run the math
composite with CUDA's dropout (``_math``). cuDNN calls run the CPU's own op: cuDNN saves what the CPU's fused
kernel saves (the output and an fp32 log-sum-exp per row); its backward workspace is not modelled.

Sources (pytorch/pytorch, read at the 2.13 line; the measured H200 runs used 2.11):

- ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` (``select_sdp_backend``, ``priority_order``,
  ``check_prefer_cudnn_attention``, ``can_use_{cudnn,flash,mem_efficient}_attention`` and their ``check_*``
  filters) and ``sdp_utils_cpp.h`` (``check_for_attn_mask``, ``check_attn_mask_shape``,
  ``check_batch_size_and_num_heads_dense``, ``check_last_dim_stride_equals_1_dense``): ``select_backend``.
- ``cuda/flash_attn/flash_api.cpp`` (``mha_fwd``: ``out = empty_like(q)`` in (B, T, H, D), ``softmax_lse``
  fp32 (B, H, T), the 16-byte ``rng_state`` and an 8-byte ``_unused`` on the device; ``mha_bwd``:
  ``dq, dk, dv = empty_like``, ``softmax_d`` fp32 (B, H, round128(T)), ``dq_accum`` fp32
  (B, round128(T), H, round32(D)) (``loop = true``, not deterministic), with GQA ``dk_expanded``/
  ``dv_expanded`` (B, Tk, H, D) summed into dk/dv) and ``cuda/attention_backward.cu``
  (``_flash_attention_backward``: ``grad_out.contiguous()``).
- ``cuda/attention.cu`` (``_efficient_attention_forward``: ``res`` (B, M, H, Kv), ``logsumexp`` fp32
  (B, H, ceil(M/32)*32) when inputs require grad, an fp32 ``output_accum`` (B, M, H, Kv) freed after the
  kernel when the 16-bit kernel cannot keep the output in registers (Kv > 128: the ``_32x128_gmem`` kernels);
  seed and offset are host scalars outside CUDA graph capture) and ``cuda/attention_backward.cu``
  (``_efficient_attention_backward``: ``grad_out.contiguous()``, ``grad_q/k/v = empty`` (separate: the SDPA
  path passes no shared storage), ``grad_bias`` (the bias shape, last dim padded to 16) when the bias
  requires grad, ``delta`` fp32 (B, H, M), and the fp32 ``workspace`` of ``kernel_backward.h``'s
  ``workspace_size`` for 16-bit inputs (grad_q accumulated per (b, h): ceil(M/BI) x ceil(D/BJ) tiles of
  BI x BJ floats, BI = BJ = 64 for D <= 64, 128 above); ``attention.cpp``: a boolean mask becomes an additive
  one in q's dtype, ``preprocess_mask`` pads an unaligned mask's last dim to 8 and expands it to (B, H, M, N).
- ``tools/autograd/derivatives.yaml``: flash saves q, k, v, output, logsumexp, the rng state; efficient saves
  q, k, v, attn_bias, output, logsumexp (seed and offset on the host).

One measured exception to the source: an SDPA whose additive mask needs a gradient (T5's relative position bias
while it trains) is left to the math composite, not the memory-efficient kernel the filters above pick. The
H200's t5-base run (torch 2.11, transformers 5.17, b8 s512, dropout 0.1: 11.87 GiB ``max_memory_allocated``,
data/measured/gpu_h200.csv) is matched by the math path on those layers (the engine's T5 rule: 11.86 GiB) and
is 41% above a trace that runs them on the memory-efficient kernel (7.0 GiB). Why the GPU took the math path is
not found in the source; a device run with ``torch.cuda.memory._record_memory_history`` would show it.

Dropout (``aten/src/ATen/native/Dropout.cpp``, ``dropout``): on CUDA a training dropout with 0 < p < 1 runs the
fused ``native_dropout`` (``is_fused_kernel_acceptable``: CUDA, XPU, lazy or privateuse1 tensors), whose
backward keeps a 1-byte boolean mask; on the CPU ``_dropout_impl`` multiplies by a noise tensor in the input's
dtype (2 or 4 bytes per element) that the product saves. Out-of-place ``F.dropout`` calls run
``native_dropout`` here; in-place ones keep the CPU's path (CUDA's ``dropout_`` is not fused either).

Not modelled: nested tensors, head dims that flash pads to a multiple of 8 (the CPU op runs), GQA on the
efficient kernel (the CPU op runs), ROCm (no emulation for AMD cards).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class CudaSdpaDevice:
    """The CUDA device SDPA chooses its kernel for: compute capability and the cuDNN runtime version
    (cuDNN's integer form, 9.20.0 = 92000)."""

    sm: tuple[int, int]
    cudnn: int = 92000  # torch 2.13.0+cu132's wheel pins nvidia-cudnn-cu13 9.20.0.48


# ---------------------------------------------------------------------------------------- backend choice
def _prefer_cudnn(dev: CudaSdpaDevice) -> bool:
    """``check_prefer_cudnn_attention`` (CUDA 13 builds): cuDNN first on sm9x/sm10x with cuDNN > 9.15.0."""
    return dev.cudnn > 91500 and dev.sm[0] in (9, 10)


def _in(sm: tuple[int, int], lo: tuple[int, int], hi: tuple[int, int]) -> bool:
    return lo <= sm <= hi


def _heads_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> bool:
    """``check_batch_size_and_num_heads_dense``: one batch size; equal heads, or GQA with ``enable_gqa``."""
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        return False
    if q.shape[1] == k.shape[1] == v.shape[1]:
        return True
    return gqa and k.shape[1] == v.shape[1] and q.shape[1] % k.shape[1] == 0


def _dense_ok(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, ignore_singleton: bool
) -> bool:
    """4-D inputs, nonzero sequence lengths, last dims contiguous, the mask's too
    (``check_last_dim_stride_equals_1_dense``: on CUDA a mask whose last dim has stride != 1, e.g. an expanded
    (b, 1, s, 1) column, fails every fused kernel; the CPU's check skips the mask)."""
    if not (q.dim() == k.dim() == v.dim() == 4) or q.shape[2] == 0 or k.shape[2] == 0:
        return False
    if mask is not None and mask.stride(-1) != 1:
        return False
    last = all(t.stride(-1) == 1 for t in (q, k, v))
    return last or (ignore_singleton and q.shape[-1] == 1)


def _mask_shape_ok(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """``check_attn_mask_shape`` (cuDNN): no grad, 2-D or broadcastable 4-D."""
    if mask is None:
        return True
    if mask.requires_grad or mask.shape[-2] not in (q.shape[2], 1) or mask.shape[-1] not in (k.shape[2], 1):
        return False
    return mask.dim() == 2 or (
        mask.dim() == 4 and mask.shape[0] in (1, q.shape[0]) and mask.shape[1] in (1, q.shape[1])
    )


def _cudnn_ok(q, k, v, mask, dropout: float, gqa: bool, grad: bool, dev: CudaSdpaDevice) -> bool:  # noqa: ANN001
    """``can_use_cudnn_attention`` (dense inputs)."""
    if dropout > 0 and 91100 < dev.cudnn < 91400:
        return False
    if q.dtype not in _HALF or not (k.dtype == v.dtype == q.dtype) or not _in(dev.sm, (8, 0), (12, 1)):
        return False
    if dropout * 16 != math.floor(dropout * 16) or not _mask_shape_ok(q, k, mask):
        return False
    if not _dense_ok(q, k, v, mask, True) or not _heads_ok(q, k, v, True):
        return False
    b, h, s_q, d_qk = q.shape
    s_k, d_v = k.shape[2], v.shape[3]
    if b > 65535 or h > 65535 or d_qk % 8 or d_v % 8 or s_k == 1 or (dropout and s_q == 1):
        return False
    big = (dev.sm == (9, 0) or dev.sm[0] == 10) and dev.cudnn > 92200  # the D256 frontend assumed
    if max(d_qk, d_v) > (256 if big else 128):
        return False
    if grad and big:  # check_cudnn_d256_bprop_head_dim
        return (d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256))
    return True


def _flash_ok(
    q, k, v, mask, dropout: float, causal: bool, gqa: bool, grad: bool, dev: CudaSdpaDevice
) -> bool:  # noqa: ANN001
    """``can_use_flash_attention`` (dense inputs)."""
    d = q.shape[-1]
    if (
        mask is not None
        or not (d == k.shape[-1] == v.shape[-1])
        or d > 256
        or not _in(dev.sm, (8, 0), (12, 1))
    ):
        return False
    consumer = _in(dev.sm, (8, 6), (8, 9)) or _in(dev.sm, (12, 0), (12, 1))
    if grad and consumer and not (d <= 192 or (not dropout and d > 224)):
        return False  # the sm86/89/120 backward's head-dim limits
    if causal and q.shape[2] != k.shape[2]:
        return False
    if q.dtype not in _HALF or not (k.dtype == v.dtype == q.dtype):
        return False
    return _heads_ok(q, k, v, gqa) and _dense_ok(q, k, v, mask, True)


def _efficient_ok(q, k, v, mask, gqa: bool, dev: CudaSdpaDevice) -> bool:  # noqa: ANN001
    """``can_use_mem_efficient_attention`` (dense inputs; the caching allocator's bases are 256-byte aligned)."""
    if not _in(dev.sm, (5, 0), (12, 1)) or not (q.dim() == k.dim() == v.dim() == 4):
        return False
    half = q.dtype in _HALF
    mn = 4 if dev.sm[0] >= 8 else 1  # minimum_gemm_alignment: tensor cores from sm80, sm70 in 16 bits
    align = max(mn, 8 if half else 4) if dev.sm[0] >= 8 or (dev.sm[0] >= 7 and half) else mn
    dq, dv = q.shape[-1], v.shape[-1]
    if dq != k.shape[-1] or dq % align or dv % align or dq == 0 or dv == 0:
        return False
    if dev.sm[0] >= 8 and any(t.storage_offset() % align for t in (q, k, v)):
        return False
    if not _dense_ok(q, k, v, mask, False) or not _heads_ok(q, k, v, gqa):
        return False
    allowed = (
        (torch.float16, torch.float32, torch.bfloat16) if dev.sm[0] >= 8 else (torch.float16, torch.float32)
    )
    return q.dtype in allowed and k.dtype == v.dtype == q.dtype


def select_backend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout: float,
    causal: bool,
    gqa: bool,
    dev: CudaSdpaDevice,
) -> str:
    """CUDA's SDPA backend for these inputs: "cudnn", "flash", "efficient" or "math" (``select_sdp_backend``:
    the first backend of the priority order whose filters all pass)."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    order = ("cudnn", "flash", "efficient", "math") if _prefer_cudnn(dev) else ("flash", "efficient", "math")
    for name in order:
        if name == "cudnn" and _cudnn_ok(q, k, v, mask, dropout, gqa, grad, dev):
            return name
        if name == "flash" and _flash_ok(q, k, v, mask, dropout, causal, gqa, grad, dev):
            return name
        if name == "efficient" and _efficient_ok(q, k, v, mask, gqa, dev):
            return name
        if name == "math":
            return name
    return "math"  # pragma: no cover - math ends both orders


# ---------------------------------------------------------------------------------------- the kernels
def _round(x: int, m: int) -> int:
    return -(-x // m) * m


class _Flash(torch.autograd.Function):
    """``_scaled_dot_product_flash_attention`` on CUDA: its allocations and saved tensors (module docstring)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:  # noqa: D102
        q_t = q.transpose(1, 2)  # (B, T, H, D) views, as the kernel takes them
        b, t, h, _ = q_t.shape
        out = torch.empty_like(q_t)
        lse = torch.empty((b, h, t), dtype=torch.float32, device=q.device)
        rng = torch.empty((2,), dtype=torch.int64, device=q.device)  # uint64 on CUDA: 16 B
        _unused = torch.empty((), dtype=torch.int64, device=q.device)
        out_t = out.transpose(1, 2)
        ctx.save_for_backward(q, k, v, out_t, lse, rng)
        ctx.mark_non_differentiable(lse, rng)
        return out_t, lse, rng

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _g_lse: Any, _g_rng: Any) -> Any:  # noqa: D102
        q, k, v, out_t, _lse, _rng = ctx.saved_tensors
        q_t, k_t, v_t = (x.transpose(1, 2) for x in (q, k, v))
        dout = grad.transpose(
            1, 2
        ).contiguous()  # _flash_attention_backward: the kernel reads dout contiguous
        out_t.transpose(1, 2).contiguous()
        b, tq, h, d = q_t.shape
        tk, hk = k_t.shape[1], k_t.shape[2]
        dq, dk, dv = torch.empty_like(q_t), torch.empty_like(k_t), torch.empty_like(v_t)
        softmax_d = torch.empty((b, h, _round(tq, 128)), dtype=torch.float32, device=q.device)
        dq_accum = torch.empty(
            (b, _round(tq, 128), h, _round(d, 32 if d <= 128 else 64)), dtype=torch.float32, device=q.device
        )
        if hk != h:  # MQA / GQA: gradients per query head, summed per key/value head
            dk_exp = torch.empty((b, tk, h, d), dtype=q.dtype, device=q.device)
            dv_exp = torch.empty((b, tk, h, d), dtype=q.dtype, device=q.device)
            torch.sum(dk_exp.view(b, tk, hk, h // hk, d), 3, out=dk)
            torch.sum(dv_exp.view(b, tk, hk, h // hk, d), 3, out=dv)
            del dk_exp, dv_exp
        del softmax_d, dq_accum, dout
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


def _efficient_workspace(b: int, h: int, m: int, d: int, dv: int, dtype: torch.dtype) -> int:
    """Bytes of the 16-bit backward kernel's fp32 grad_q accumulator (``kernel_backward.h``)."""
    if dtype not in _HALF:
        return 0
    blk = 64 if max(d, dv) <= 64 else 128
    return b * h * _round(math.ceil(m / blk) * math.ceil(d / blk) * blk * blk, 4) * 4


class _Efficient(torch.autograd.Function):
    """``_scaled_dot_product_efficient_attention`` on CUDA: its allocations and saved tensors (module docstring)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Any) -> Any:  # noqa: D102
        b, h, m, _ = q.shape
        kv = v.shape[-1]
        res = torch.empty((b, m, h, kv), dtype=q.dtype, device=q.device)
        lse = torch.empty((b, h, _round(m, 32)), dtype=torch.float32, device=q.device)
        if q.dtype in _HALF and kv > 128:  # the gmem kernels accumulate the output in fp32
            accum = torch.empty((b, m, h, kv), dtype=torch.float32, device=q.device)
            del accum
        out_t = res.transpose(1, 2)
        ctx.has_bias = bias is not None
        ctx.save_for_backward(q, k, v, out_t, lse, *([bias] if bias is not None else []))
        ctx.mark_non_differentiable(lse)
        return out_t, lse

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _g_lse: Any) -> Any:  # noqa: D102
        q, k, v, _out, _lse, *rest = ctx.saved_tensors
        bias = rest[0] if rest else None
        dout = grad.transpose(1, 2).contiguous()
        b, h, m, d = q.shape
        dq = torch.empty((b, m, h, d), dtype=q.dtype, device=q.device)
        dk = torch.empty((b, k.shape[2], h, d), dtype=k.dtype, device=q.device)
        dv = torch.empty((b, v.shape[2], h, v.shape[3]), dtype=v.dtype, device=q.device)
        dbias = None
        if bias is not None and ctx.needs_input_grad[3]:
            n = bias.shape[-1]
            dbias = torch.empty((*bias.shape[:-1], _round(n, 16)), dtype=bias.dtype, device=q.device)[..., :n]
        delta = torch.empty((b, h, m), dtype=torch.float32, device=q.device)
        ws = _efficient_workspace(b, h, m, d, v.shape[3], q.dtype)
        workspace = torch.empty((ws,), dtype=torch.uint8, device=q.device) if ws else None
        del delta, workspace, dout
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2), dbias


def _efficient_bias(mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """``attention.cpp``: a boolean mask made additive in q's dtype, an unaligned one padded (last dim to 8),
    expanded to (B, H, M, N) (a view)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.where(mask, 0.0, float("-inf")).to(q.dtype)
    aligned = mask.stride(-1) == 1 and all(s % 8 == 0 for s in mask.stride()[:-1])
    if not aligned:
        n = mask.shape[-1]
        mask = F.pad(mask, (0, 8 - n % 8))[..., :n]
    return mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _math(q, k, v, mask, p: float, causal: bool, scale: float | None, gqa: bool) -> torch.Tensor:  # noqa: ANN001
    """The math composite (``attention.cpp``, ``_scaled_dot_product_attention_math``) as CUDA runs it: 16-bit
    q, k, v upcast to fp32, both scaled by sqrt(scale), the mask added in place, ``_safe_softmax``, dropout
    through CUDA's fused ``native_dropout`` (a 1-byte mask; the CPU's composite multiplies by an fp32 noise
    tensor), the product cast back (and the probabilities, the composite's second output, dropped). Under
    autocast it runs inside autocast's SDPA kernel, which casts the inputs and excludes autocast: the
    matmuls stay in fp32. A boolean mask becomes additive in q's dtype first (``scaled_dot_product_
    attention``'s ``convert_boolean_attn_mask``)."""
    origin = q.dtype
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.where(mask, 0.0, float("-inf")).to(origin)
    q_acc, k_acc, v_acc = (x.float() if x.dtype in _HALF else x for x in (q, k, v))
    s = math.sqrt(abs(scale) if scale is not None else 1 / math.sqrt(q.shape[-1]))
    query = q_acc * (-s if scale is not None and scale < 0 else s)
    if causal:
        ones = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        mask = torch.where(ones, 0.0, float("-inf")).to(query.dtype)
    if gqa and k.shape[-3] != q.shape[-3]:
        k_acc = k_acc.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
        v_acc = v_acc.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
    attn = torch.matmul(query, k_acc.transpose(-2, -1) * s)
    if mask is not None:
        attn.add_(mask)
    attn = torch.ops.aten._safe_softmax(attn, -1)
    if p > 0:
        attn = torch.native_dropout(attn, p, True)[0]
    out = torch.matmul(attn, v_acc).to(origin)
    attn.to(origin)  # the composite's second output, which scaled_dot_product_attention drops
    return out


# ---------------------------------------------------------------------------------------- the mode
def _args(args: tuple, kwargs: dict) -> tuple:
    """(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) of an SDPA call."""
    names = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    given = dict(zip(names, args[3:], strict=False)) | kwargs
    return (
        *args[:3],
        given.get("attn_mask"),
        float(given.get("dropout_p", 0.0)),
        bool(given.get("is_causal", False)),
        given.get("scale"),
        bool(given.get("enable_gqa", False)),
    )


def _autocast(xs: tuple) -> tuple:
    """CUDA autocast runs SDPA in the lower-precision dtype (its fp16/bf16 op list): floating inputs cast."""
    if not torch.is_autocast_enabled("cpu"):
        return xs
    dt = torch.get_autocast_dtype("cpu")
    return tuple(x.to(dt) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs)


def _is_fake(x: Any) -> bool:
    """Whether ``x`` is a fake tensor (real tensors keep the CPU ops: their values are read)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, FakeTensor)


def _dropout(args: tuple, kwargs: dict) -> tuple[Any, float, bool, bool]:
    """(input, p, training, inplace) of an ``F.dropout`` call."""
    names = ("p", "training", "inplace")
    given = dict(zip(names, args[1:], strict=False)) | kwargs
    return (
        args[0],
        float(given.get("p", 0.5)),
        bool(given.get("training", True)),
        bool(given.get("inplace", False)),
    )


class CudaKernels(TorchFunctionMode):
    """SDPA calls that CUDA runs with its flash or memory-efficient kernel replaced (module docstring), and
    out-of-place training dropout run as CUDA's fused ``native_dropout``; ``chosen`` counts SDPA's backends."""

    def __init__(self, dev: CudaSdpaDevice):
        super().__init__()
        self.dev = dev
        self.chosen: dict[str, int] = {}

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            return func(*args, **kwargs)
        if func is F.dropout:
            x, p, training, inplace = _dropout(args, kwargs)
            if training and not inplace and 0 < p < 1 and _is_fake(x) and x.numel() > 0:
                return torch.native_dropout(x, p, True)[0]
            return func(*args, **kwargs)
        if func is not F.scaled_dot_product_attention or not _is_fake(args[0]):
            return func(*args, **kwargs)
        return self._sdpa(func, args, kwargs)

    def _sdpa(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """One SDPA call: the chosen kernel's stand-in, or the CPU's op."""
        q, k, v, mask, dropout, causal, scale, gqa = _args(args, kwargs)
        q, k, v, mask = _autocast((q, k, v, mask))
        backend = select_backend(q, k, v, mask, dropout, causal, gqa, self.dev)
        if mask is not None and mask.requires_grad and torch.is_grad_enabled() and backend == "efficient":
            backend = "math (the mask needs a gradient: as measured)"  # MEASURED_MATH_FOR_GRAD_MASK
        self.chosen[backend] = self.chosen.get(backend, 0) + 1
        if backend == "flash" and q.shape[-1] % 8 == 0:
            return _Flash.apply(q, k, v)[0]
        if backend == "efficient" and q.shape[1] == k.shape[1]:
            return _Efficient.apply(q, k, v, _efficient_bias(mask, q, k))[0]
        # autocast's SDPA kernel runs the composite (or the CPU's op) on the cast inputs without autocast
        with torch.autocast("cpu", enabled=False):
            if backend.startswith("math"):
                return _math(q, k, v, mask, dropout, causal, scale, gqa)
            kw = {"attn_mask": mask, "dropout_p": dropout, "is_causal": causal, "scale": scale}
            return func(q, k, v, **kw, **({"enable_gqa": True} if gqa else {}))


@contextlib.contextmanager
def cuda_kernels(dev: CudaSdpaDevice | None, notes: list[str] | None = None) -> Iterator[None]:
    """SDPA and dropout as ``dev`` runs them (nothing when None); ``notes`` gets SDPA's backends."""
    if dev is None:
        yield
        return
    mode = CudaKernels(dev)
    try:
        with mode:
            yield
    finally:
        if notes is not None:
            picked = ", ".join(f"{n} x{c}" for n, c in sorted(mode.chosen.items())) or "no SDPA call"
            notes.append(
                f"CUDA sm{dev.sm[0]}{dev.sm[1]}'s kernels (trace/cuda_sdpa.py): SDPA {picked}; dropout fused"
                " (a 1-byte mask)"
            )
