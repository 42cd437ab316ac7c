"""bf16 matrix products computed in fp32 for the benchmarks that run real models on the CPU under a logging
dispatch mode (``ddp_trace.py``, ``zero_trace.py``).

On a CPU without AVX-512 BF16 (AVX2 only: ``torch.backends.cpu.get_cpu_capability()``) torch 2.13's bf16 GEMM
runs at about 0.4 GFLOP/s on one core, fp32's at about 60 (measured on this project's 2-core AMD EPYC machines,
2026-12-07): a two-step real run with a 152k-vocabulary bf16 head took over 20 minutes. A logging mode that
runs its ops through ``call`` gets the storage the bf16 kernel returns (same shape, dtype and
bytes; the values differ only in the order of the fp32 sums both accumulate in), while the fp32 operands and
product are made inside the mode's handler, below it, and never logged: the recorded allocation events are the
same.
"""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def _products() -> frozenset[Any]:
    """The aten matrix products computed in fp32 (what ``linear`` and ``matmul`` decompose to)."""
    import torch

    aten = torch.ops.aten
    return frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default})


def call(func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)`` as a logging mode's handler runs it, a matrix product over bf16 operands
    computed in fp32 and rounded to bf16."""
    import torch

    bf16 = torch.bfloat16
    if (
        func in _products()
        and "out" not in kwargs
        and any(isinstance(a, torch.Tensor) and a.dtype == bf16 for a in args)
    ):
        up = [a.float() if isinstance(a, torch.Tensor) and a.dtype == bf16 else a for a in args]
        return func(*up, **kwargs).to(bf16)
    return func(*args, **kwargs)
