"""A scenario's recipe on the torch side, for every tracer: the weight and autocast dtypes of a precision, and
the optimizer of a name and implementation, built (and probed) as HF Trainer / plain PyTorch build it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from memsim_widget.optimizers import OPTIMIZER_IMPLS

#: What the builders below accept: ``traceable.TRACEABLE_PRECISIONS`` / ``TRACEABLE_OPTIMIZERS`` (written again, not
#: imported: ``traceable`` reads the model catalog, whose calibrated models run this tracer; an import circle).
PRECISIONS = ("fp32", "bf16", "fp16", "amp-bf16", "amp-fp16")
OPTIMIZERS = (
    "adamw",
    "adam",
    "sgd",
    "sgd-momentum",
    "adafactor",
    "adamw-8bit",
    "paged-adamw-8bit",
    "paged-adamw",
)


def precision_dtypes(precision: str) -> tuple[torch.dtype, torch.dtype | None]:
    """(weight dtype, autocast dtype or None) for a precision name."""
    table = {
        "fp32": (torch.float32, None),
        "bf16": (torch.bfloat16, None),
        "fp16": (torch.float16, None),
        "amp-bf16": (torch.float32, torch.bfloat16),
        "amp-fp16": (torch.float32, torch.float16),
    }
    if precision not in table:
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    return table[precision]


def make_optimizer(
    name: str,
    impl: str,
    params: list[Any],
    lr: float,
    host: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> torch.optim.Optimizer:
    """Build the optimizer the way HF Trainer / plain PyTorch would; bitsandbytes' by their states
    (trace/bnb_states.py; ``host()`` makes a paged buffer, which the GPU counter never sees)."""
    from .bnb_states import BNB_OPTIMIZERS, BitsandbytesStates

    if name in BNB_OPTIMIZERS:
        eight_bit, paged = BNB_OPTIMIZERS[name]
        return BitsandbytesStates(params, eight_bit=eight_bit, paged=paged, lr=lr, host=host)
    kw: dict[str, Any] = {}
    if name in ("adamw", "adam", "sgd", "sgd-momentum"):
        if impl == "foreach":
            kw["foreach"] = True
        elif impl == "fused":
            kw["fused"] = True
        elif impl == "for-loop":
            kw["foreach"] = False
        else:
            raise ValueError(f"unknown optimizer_impl {impl!r}; expected one of {OPTIMIZER_IMPLS}")
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, **kw)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, **kw)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, **kw)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, **kw)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False)
    if name == "lion":
        raise ValueError("lion is not part of torch; not traced")
    raise ValueError(f"unknown optimizer {name!r}; expected one of {OPTIMIZERS}")


def probe_optimizer(name: str, impl: str, dtype: torch.dtype, lr: float) -> str | None:
    """Try one step of the optimizer on two small tensors (current mode); return the error text if it fails."""
    try:
        ps = [
            torch.nn.Parameter(torch.zeros(4, 3, dtype=dtype)),
            torch.nn.Parameter(torch.zeros(3, dtype=dtype)),
        ]
        for p in ps:
            p.grad = torch.zeros_like(p)
        opt = make_optimizer(name, impl, ps, lr)
        opt.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
    except Exception as e:  # noqa: BLE001 - any failure means the impl is unusable here
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None
