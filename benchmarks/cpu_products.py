"""bf16 matrix products computed in fp32 for the benchmarks that run real models on the CPU under a logging
dispatch mode (``ddp_trace.py``, ``zero_trace.py``).

On a CPU without AVX-512 BF16 (AVX2 only: ``torch.backends.cpu.get_cpu_capability()``) torch 2.13's bf16 GEMM
runs at about 0.4 GFLOP/s on one core, fp32's at about 60 (measured on this project's 2-core AMD EPYC machines,
2026-12-07): a two-step real run with a 152k-vocabulary bf16 head took over 20 minutes. A logging mode that
hands its matrix products to ``fp32_product`` gets the storage the bf16 kernel returns (same shape, dtype and
bytes; the values differ only in the order of the fp32 sums both accumulate in), while the fp32 operands and
product are made inside the mode's handler, below it, and never logged: the recorded allocation events are the
same.
"""

from __future__ import annotations

from typing import Any


def products() -> frozenset[Any]:
    """The aten matrix products ``fp32_product`` computes (what ``linear`` and ``matmul`` decompose to)."""
    import torch

    aten = torch.ops.aten
    return frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default})


def fp32_product(func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """``func`` (one of ``products()``) over bf16 operands computed in fp32 and rounded to bf16; None where no
    operand is bf16 (the caller runs ``func`` as it is)."""
    import torch

    bf16 = torch.bfloat16
    if not any(isinstance(a, torch.Tensor) and a.dtype == bf16 for a in args) or "out" in kwargs:
        return None
    up = [a.float() if isinstance(a, torch.Tensor) and a.dtype == bf16 else a for a in args]
    return func(*up, **kwargs).to(bf16)
