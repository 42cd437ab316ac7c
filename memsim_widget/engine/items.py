"""The unit of a breakdown: one named amount of memory in one category, with its formula."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

#: Breakdown categories in display order. "temporaries" are short-lived buffers of one moment.
CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "temporaries", "overhead")

#: Where an item shows up. "tensor": a live tensor PyTorch's dispatcher sees (and a fake-tensor trace);
#: "allocator": allocated through the caching allocator but not a user-visible tensor (cuBLAS
#: workspace, kernel scratch); "reserved": held by the allocator but not allocated (fragmentation);
#: "device": outside PyTorch (CUDA context, NCCL); "host": CPU RAM (offload).
LEVELS = ("tensor", "allocator", "reserved", "device", "host")

ALLOC_ROUND = 512


def round_alloc(nbytes: int) -> int:
    """The caching allocator's rounding of one request (512 B granularity)."""
    return -(-nbytes // ALLOC_ROUND) * ALLOC_ROUND if nbytes > 0 else 0


@dataclass(frozen=True)
class Item:
    """``bytes`` of one kind of memory; ``tensors`` is how many separate allocations it is made of."""

    category: str
    item: str
    bytes: int
    formula: str
    level: str = "tensor"
    tensors: int = 1

    @cached_property
    def allocated_bytes(self) -> int:
        """Bytes as ``torch.cuda.memory_allocated`` counts them (each tensor rounded up to 512 B)."""
        if self.level not in ("tensor", "allocator") or self.bytes <= 0:
            return 0
        n = max(self.tensors, 1)
        return round_alloc(-(-self.bytes // n)) * n


def fmt_bytes(n: float) -> str:
    """Human-readable binary size, e.g. ``14.96 GiB``."""
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fmt_int(n: float) -> str:
    """Thousands-separated integer for formulas (``8,030,261,248``)."""
    return f"{int(n):,}"
