"""Optimizer registry: the state each optimizer keeps per parameter tensor and its step temporaries.

Facts and sources: docs/memory-facts.md#optimizer-states and #the-optimizer-step. A new optimizer is one
``register_optimizer(OptimizerSpec(...))``
saying how many states it keeps, in which dtype, and what its step allocates, e.g.::

    register_optimizer(OptimizerSpec("sophia", states=2))
"""

from __future__ import annotations

import math

from memsim_widget.fast_dataclass import dataclass

#: The implementations of a torch optimizer step (``optimizer_impl``); each optimizer lists those it has.
OPTIMIZER_IMPLS = ("foreach", "fused", "for-loop")


#: The smallest parameter whose state a bitsandbytes paged optimizer pages (``get_state_buffer``: ``p.numel() < 1e5``
#: gets ``torch.zeros_like`` on the device).
PAGED_MIN_NUMEL = 100_000


@dataclass(frozen=True)
class OptimizerSpec:
    """State and temporaries of one optimizer.

    ``states``: state tensors per parameter (Adam: m and v). ``state_dtype``: ``"param"`` follows the
    precision recipe's state size (fp32, or the weight dtype in pure 16-bit), ``"int8"`` / ``"int4"`` are
    block-quantised with one fp32 absmax per ``block_size`` elements, tensors under ``min_quant_numel``
    elements keeping ``"param"`` state. ``factored``: Adafactor's row and column vectors for matrices.
    Step temporaries: ``temp_foreach`` gradient-sized buffers for the foreach path (``_foreach_sqrt`` of
    a whole group), ``temp_for_loop`` times the largest parameter for the per-tensor path (the previous
    parameter's last temporary is still alive when the next starts: measured max(P[i-1] + 2 P[i])),
    ``temp_fp32_copies`` fp32 copies of the parameter being updated when the step upcasts 16-bit
    parameters (HF Adafactor: grad, param, grad^2 + eps, update),
    ``temp_fused`` gradient-sized buffers for fused kernels (none).
    """

    name: str
    states: int
    description: str = ""
    state_dtype: str = "param"
    block_size: int = 0
    min_quant_numel: int = 0
    factored: bool = False
    paged: bool = False
    temp_foreach: float = 1.0
    temp_for_loop: float = 2.0
    temp_fp32_copies: int = 0
    temp_fused: float = 0.0
    impls: tuple[str, ...] = OPTIMIZER_IMPLS

    def state_bytes(self, shape: tuple[int, ...], param_state_bytes: int) -> int:
        """Bytes of this optimizer's state for one parameter tensor of ``shape``."""
        n = math.prod(shape)
        if self.states == 0 or n == 0:
            return 0
        if self.factored:
            if len(shape) >= 2:
                rows = n // shape[-1]
                cols = n // shape[-2]
                return (rows + cols) * param_state_bytes
            return n * param_state_bytes
        if self.state_dtype in ("int8", "int4"):
            if n < self.min_quant_numel:  # small tensors keep 32-bit state (bitsandbytes min_8bit_size)
                return self.states * n * 4
            per = 1.0 if self.state_dtype == "int8" else 0.5
            blocks = math.ceil(n / self.block_size)
            return self.states * (math.ceil(n * per) + 4 * blocks)
        return self.states * n * param_state_bytes

    def paged_bytes(self, shape: tuple[int, ...], param_state_bytes: int) -> int:
        """Bytes of one tensor's state that a paged optimizer keeps in unified memory (outside the caching
        allocator): the state buffers of a parameter of ``PAGED_MIN_NUMEL`` elements or more. The fp32 absmax of
        the blocks and a smaller parameter's states are ordinary CUDA tensors (bitsandbytes
        ``Optimizer8bit.get_state_buffer`` pages only ``p.numel() >= 1e5``; ``Optimizer2State.init_state``
        makes ``absmax1``/``absmax2`` with ``torch.zeros(..., device=p.device)``;
        bitsandbytes-foundation/bitsandbytes ``bitsandbytes/optim/optimizer.py``; traced: trace/bnb_states.py)."""
        n = math.prod(shape)
        if not self.paged or self.states == 0 or n < PAGED_MIN_NUMEL:
            return 0
        if self.state_dtype in ("int8", "int4"):
            return self.states * math.ceil(n * (1.0 if self.state_dtype == "int8" else 0.5))
        return self.state_bytes(shape, param_state_bytes)

    def state_formula(self, param_state_bytes: int) -> str:
        """A human-readable bytes-per-element formula for the state."""
        if self.states == 0:
            return "no state"
        if self.factored:
            return f"(rows + cols) x {param_state_bytes} B per matrix, n x {param_state_bytes} B per vector"
        if self.state_dtype in ("int8", "int4"):
            per = "1" if self.state_dtype == "int8" else "0.5"
            return f"{self.states} x ({per} B/elem + 4 B per {self.block_size}-block absmax)"
        return f"{self.states} states x {param_state_bytes} B/elem"


OPTIMIZERS: dict[str, OptimizerSpec] = {}


def register_optimizer(spec: OptimizerSpec) -> OptimizerSpec:
    """Add or replace an optimizer."""
    OPTIMIZERS[spec.name] = spec
    return spec


register_optimizer(OptimizerSpec("adamw", 2, "AdamW (torch.optim): exp_avg, exp_avg_sq"))
register_optimizer(OptimizerSpec("adam", 2, "Adam (torch.optim): exp_avg, exp_avg_sq"))
register_optimizer(OptimizerSpec("sgd", 0, "SGD without momentum", temp_foreach=0.0, temp_for_loop=0.0))
register_optimizer(
    OptimizerSpec("sgd-momentum", 1, "SGD with momentum buffer", temp_foreach=0.0, temp_for_loop=0.0)
)
register_optimizer(
    OptimizerSpec(
        "adafactor",
        1,
        "Adafactor (HF transformers, no first moment): row and column second-moment vectors",
        factored=True,
        temp_foreach=0.0,
        temp_for_loop=2.0,
        temp_fp32_copies=4,
        impls=("for-loop",),
    )
)
register_optimizer(OptimizerSpec("lion", 1, "Lion: one momentum buffer", temp_foreach=1.0))
register_optimizer(
    OptimizerSpec(
        "adamw-8bit",
        2,
        "bitsandbytes AdamW8bit: 1 B/state + fp32 absmax per 256 block; tensors < 4096 elements stay 32-bit",
        state_dtype="int8",
        block_size=256,
        min_quant_numel=4096,
        temp_foreach=0.0,
        temp_for_loop=0.0,
        impls=("fused",),
    )
)
register_optimizer(
    OptimizerSpec(
        "paged-adamw-8bit",
        2,
        "bitsandbytes PagedAdamW8bit: as adamw-8bit, states in unified memory that can spill to the host",
        state_dtype="int8",
        block_size=256,
        min_quant_numel=4096,
        paged=True,
        temp_foreach=0.0,
        temp_for_loop=0.0,
        impls=("fused",),
    )
)
register_optimizer(
    OptimizerSpec(
        "adamw-4bit",
        2,
        "torchao AdamW4bit: 0.5 B/state + fp32 scale per 128 block; tensors < 4096 elements stay 32-bit",
        state_dtype="int4",
        block_size=128,
        min_quant_numel=4096,
        temp_foreach=0.0,
        temp_for_loop=2.0,
        impls=("fused", "for-loop"),
    )
)
register_optimizer(
    OptimizerSpec(
        "none", 0, "no optimizer step (forward + backward only)", temp_foreach=0.0, temp_for_loop=0.0
    )
)
