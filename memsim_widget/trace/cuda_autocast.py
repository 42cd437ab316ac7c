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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

#: Functions CUDA autocast runs in fp32 and CPU autocast does not, limited to those a traced model uses.
_CUDA_FP32 = frozenset({torch.pow, torch.Tensor.pow, torch.Tensor.__pow__, torch.nn.functional.softplus})
_HALF = (torch.bfloat16, torch.float16)


class _CudaFp32Ops(TorchFunctionMode):
    """Upcasts the 16-bit floating tensor arguments of CUDA's fp32-list ops while CPU autocast is on."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _CUDA_FP32 and torch.is_autocast_enabled("cpu"):
            args = tuple(_fp32(a) for a in args)
        return func(*args, **kwargs)


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


def recompute_context() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    """``context_fn`` for torch.utils.checkpoint: nothing more in the forward (the mode is already on), CUDA's fp32
    ops in the recomputation, which runs inside backward (under the forward's autocast state, which checkpoint
    restores, but outside this module's TorchFunctionMode): the recomputed tensors then have the dtypes the
    forward saved, else checkpoint raises."""
    return contextlib.nullcontext(), _CudaFp32Ops()
