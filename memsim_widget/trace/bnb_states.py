"""bitsandbytes' AdamW8bit, PagedAdamW8bit and PagedAdamW (32-bit) on a traced step: what their states allocate.

bitsandbytes' update is a CUDA kernel (``optimizer_update_8bit_blockwise`` / ``optimizer_update_32bit``) that
writes the parameter and its states in place: no temporaries, and nothing of it runs on a CPU. What decides the
memory is ``Optimizer2State.init_state`` on a parameter's first step, reproduced here (bitsandbytes-foundation/
bitsandbytes ``bitsandbytes/optim/optimizer.py``, 256-element blocks as in its current releases):

- a parameter of fewer than ``min_8bit_size`` (4096) elements, or any parameter of a 32-bit optimizer: two fp32
  states shaped like it;
- else two uint8 states shaped like it and two fp32 ``absmax`` vectors of ceil(n / 256) blocks
  (``torch.zeros(..., device=p.device)``), and two 256-entry fp32 quantisation maps per optimizer (``name2qmap``);
- ``get_state_buffer``: a paged optimizer puts a state of a parameter of 1e5 elements or more in CUDA unified
  memory (``cudaMallocManaged`` read through ``torch.frombuffer``), which the caching allocator never counts:
  made here inside ``MemoryTracker.on_host()`` (0 bytes); the absmax vectors and smaller parameters' states are
  ordinary device tensors.

The step itself changes no value (a fake-tensor trace has none) and allocates nothing.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from memsim_widget.optimizers import PAGED_MIN_NUMEL

#: The optimizers this module stands in for: (8-bit states, paged).
BNB_OPTIMIZERS = {"adamw-8bit": (True, False), "paged-adamw-8bit": (True, True), "paged-adamw": (False, True)}
MIN_8BIT_SIZE = 4096
BLOCK = 256
QMAP_ENTRIES = 256


class BitsandbytesStates(torch.optim.Optimizer):
    """The states bitsandbytes' ``Optimizer2State`` allocates, without its CUDA update."""

    def __init__(
        self,
        params: Any,
        *,
        eight_bit: bool,
        paged: bool,
        lr: float = 1e-3,
        host: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ) -> None:
        """``host()``: the context under which a paged buffer is made (it counts 0 bytes)."""
        super().__init__(params, {"lr": lr})
        self.eight_bit, self.paged, self.host = eight_bit, paged, host
        self.qmaps: dict[str, torch.Tensor] = {}

    def _buffer(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.paged and p.numel() >= PAGED_MIN_NUMEL:
            with self.host():
                return torch.zeros_like(p, dtype=dtype)
        return torch.zeros_like(p, dtype=dtype)

    def _init_state(self, p: torch.Tensor) -> None:
        state = self.state[p]
        state["step"] = 0
        if not self.eight_bit or p.numel() < MIN_8BIT_SIZE:
            state["state1"] = self._buffer(p, torch.float32)
            state["state2"] = self._buffer(p, torch.float32)
            return
        if not self.qmaps:  # fill_qmap: signed and unsigned dynamic maps, once per optimizer
            self.qmaps = {k: torch.zeros(QMAP_ENTRIES, dtype=torch.float32) for k in ("dynamic", "udynamic")}
        blocks = math.ceil(p.numel() / BLOCK)
        state["state1"] = self._buffer(p, torch.uint8)
        state["qmap1"] = self.qmaps["dynamic"]
        state["state2"] = self._buffer(p, torch.uint8)
        state["qmap2"] = self.qmaps["udynamic"]
        state["absmax1"] = torch.zeros(blocks, dtype=torch.float32)
        state["absmax2"] = torch.zeros(blocks, dtype=torch.float32)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """Allocate a parameter's states on its first step; the update itself is a CUDA kernel writing in place."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not self.state[p]:
                    self._init_state(p)
                self.state[p]["step"] += 1
