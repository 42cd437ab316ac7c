"""Autocast for traces on the CPU that follows CUDA's op lists where they change what backward saves.

A trace runs on CPU fake tensors, so it enters ``torch.autocast("cpu")``; the engine predicts a CUDA run.
The two autocast op lists differ (torch.amp docs, "CUDA Ops that can autocast to float32" vs the CPU
lists): CUDA runs ``pow`` in fp32, CPU keeps it in the 16-bit dtype. GPT-2's and Phi's ``gelu_new``
(``0.5 x (1 + tanh(c (x + 0.044715 pow(x, 3)))``) then keeps an fp32 chain on CUDA: the fp32 copy of x
that ``pow`` saves, the fp32 tanh output and the fp32 ``1 + tanh``. Measured on an H200
(docs/accuracy.md, gpt2m runs): 6 more bytes per T x I element and layer than a CPU autocast trace shows.
This mode casts ``pow``'s 16-bit floating inputs to fp32 while autocast is on, as CUDA's list does.

``softplus`` is on CUDA's fp32 list too: the Mamba scans (transformers 5.24 ``modeling_mamba.py``,
``modeling_mamba2.py``, ``modeling_jamba.py``) apply it to the 16-bit ``dt + dt_bias``, so on CUDA it saves an
fp32 copy of its input and returns fp32 (which the scans' later ``dt.float()`` then reuses instead of copying).

``cross_entropy`` on 16-bit logits (a loss that does not upcast them itself: BERT's and RoBERTa's masked-LM
``CrossEntropyLoss``, T5's, ViT's) takes a different path on each device. CPU autocast has ``cross_entropy_loss``
on its fp32 list: it casts the logits to fp32 first (a 4-byte T x V copy, freed once log-softmax has read it) and
the whole loss runs in fp32: the saved log-softmax and both backward buffers are fp32. CUDA autocast has no
``cross_entropy_loss`` entry (PyTorch ``aten/src/ATen/autocast_mode.cpp``, commit 008ec6b, the ``Autocast``
and ``AutocastCPU`` lists; ``torch._C._dispatch_has_kernel_for_dispatch_key`` agrees on torch 2.13), so its
composite runs: ``nll_loss_nd(log_softmax(x, class_dim, x.scalar_type()), ...)`` (``native/LossNLL.cpp``,
``cross_entropy_loss_symint``, commit 0321fa7). ``log_softmax`` is ``fp32_set_opt_dtype`` on CUDA, which keeps a
dtype the caller gave (``autocast_mode.h``, ``set_opt_dtype``: "If the user has explicitly specified a dtype,
respect it"): the log-probabilities stay 16-bit and ``LogSoftmaxBackward`` saves them. ``nll_loss`` is on CUDA's
fp32 list: it casts them to fp32, a 4-byte T x V copy ``NllLossBackward`` saves. In backward: nll_loss's fp32
gradient, its cast back to 16 bits, log-softmax's 16-bit gradient. Measured on an H200 (roberta-base-amp,
data/measured/gpu_h200.csv): 15.48 GiB allocated, one 16-bit T x V under the CPU path's 3 x 4-byte T x V at
backward's start. This mode runs that composite (16-bit ``log_softmax``, then ``nll_loss``, which CPU autocast
also casts to fp32) for class-index targets without label smoothing; other cross-entropies keep CPU's policy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch.overrides import TorchFunctionMode

#: Functions CUDA autocast runs in fp32 and CPU autocast does not, limited to those a traced model uses.
_CUDA_FP32 = frozenset({torch.pow, torch.Tensor.pow, torch.Tensor.__pow__, torch.nn.functional.softplus})
_HALF = (torch.bfloat16, torch.float16)


class _CudaFp32Ops(TorchFunctionMode):
    """Upcasts the 16-bit floating tensor arguments of CUDA's fp32-list ops while CPU autocast is on, and runs
    ``cross_entropy`` as CUDA's autocast does (module docstring)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _CUDA_FP32 and torch.is_autocast_enabled("cpu"):
            args = tuple(_fp32(a) for a in args)
        elif func is F.cross_entropy and torch.is_autocast_enabled("cpu"):
            return cuda_cross_entropy(*args, **kwargs)
        return func(*args, **kwargs)


def cuda_cross_entropy(
    input: torch.Tensor,  # noqa: A002 (F.cross_entropy's own argument names)
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``F.cross_entropy`` as CUDA autocast runs it (module docstring): on 16-bit logits with class-index targets
    and no label smoothing, a 16-bit ``log_softmax`` (the caller's dtype kept) then ``nll_loss`` (cast to fp32 by
    autocast); anything else as ``F.cross_entropy`` itself."""
    plain = label_smoothing == 0.0 and size_average is None and reduce is None
    if input.dtype in _HALF and plain and target.shape != input.shape:
        logp = F.log_softmax(input, 0 if input.dim() == 1 else 1, dtype=input.dtype)
        return F.nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    return F.cross_entropy(
        input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing
    )


def _fp32(x: Any) -> Any:
    """x in fp32 when it is a 16-bit floating tensor, else x."""
    return x.float() if isinstance(x, torch.Tensor) and x.dtype in _HALF else x


@contextlib.contextmanager
def cuda_like_autocast(dtype: torch.dtype | None) -> Iterator[None]:
    """CPU autocast to ``dtype`` with CUDA's fp32 ops (see module docstring); nothing when ``dtype`` is None."""
    if dtype is None:
        yield
        return
    with torch.autocast("cpu", dtype=dtype), _CudaFp32Ops():
        yield


@contextlib.contextmanager
def cuda_fp32_ops_in_recompute(dtype: torch.dtype | None) -> Iterator[None]:
    """CUDA's fp32 ops for the backward pass: activation checkpointing recomputes a layer there under the
    forward's autocast state (torch.utils.checkpoint re-enters ``torch.autocast``), and the recomputed tensors
    must have the dtypes the forward saved (else checkpoint raises). Nothing outside autocast changes."""
    if dtype is None:
        yield
        return
    with _CudaFp32Ops():
        yield


@contextlib.contextmanager
def cuda_fp32_ops_when_autocast() -> Iterator[None]:
    """CUDA's fp32 ops while CPU autocast is on, for a compiled step's AOTAutograd trace (trace/compiled.py).

    Dynamo runs the backend with the torch-function mode stack empty (torch 2.13.0), and traces the mode of
    :func:`cuda_like_autocast` into its graph only where the model calls a function itself: a ``cross_entropy`` that
    ``torch.nn.CrossEntropyLoss`` calls (BERT's and RoBERTa's masked-LM loss, transformers 5.24) stays one
    ``cross_entropy`` node, which AOTAutograd then traces under CPU autocast (its fp32 list: the logits cast to fp32
    first). With the mode on while AOTAutograd traces, that node runs as CUDA autocast does, as eager's does."""
    if not torch.is_autocast_enabled("cpu"):
        yield
        return
    with _CudaFp32Ops():
        yield


def recompute_context() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """``context_fn`` for torch.utils.checkpoint: nothing more in the forward (the mode is already on), CUDA's fp32
    ops in the recomputation, which runs inside backward (under the forward's autocast state, which checkpoint
    restores, but outside this module's TorchFunctionMode): the recomputed tensors then have the dtypes the
    forward saved, else checkpoint raises."""
    return contextlib.nullcontext(), _CudaFp32Ops()
