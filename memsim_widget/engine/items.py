"""The unit of a breakdown: one named amount of memory in one category, with its formula."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from memsim_widget.fast_dataclass import dataclass
from memsim_widget.names import Name


class Category(Name):
    """Breakdown categories, in display order. ``TEMPORARIES`` are short-lived buffers of one moment."""

    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER_STATES = "optimizer_states"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    OVERHEAD = "overhead"


class Level(Name):
    """Where an item shows up. ``TENSOR``: a live tensor PyTorch's dispatcher sees (and a fake-tensor trace);
    ``ALLOCATOR``: allocated through the caching allocator but not a user-visible tensor (cuBLAS workspace,
    kernel scratch); ``RESERVED``: held by the allocator but not allocated (fragmentation); ``DEVICE``: outside
    PyTorch (CUDA context, NCCL); ``HOST``: CPU RAM (offload)."""

    TENSOR = "tensor"
    ALLOCATOR = "allocator"
    RESERVED = "reserved"
    DEVICE = "device"
    HOST = "host"

    @property
    def allocated(self) -> bool:
        """True for the levels ``torch.cuda.memory_allocated`` counts (tensors and allocator scratch)."""
        return self in ALLOCATED_LEVELS


#: The categories in display order, and the levels (as tuples of members, which are their string values).
CATEGORIES = tuple(Category)
LEVELS = tuple(Level)
#: The levels ``torch.cuda.memory_allocated`` counts.
ALLOCATED_LEVELS = frozenset((Level.TENSOR, Level.ALLOCATOR))
#: name -> member, for ``Item``'s conversion of plain strings
_CATEGORY = {m.value: m for m in Category}
_LEVEL = {m.value: m for m in Level}

ALLOC_ROUND = 512


def allocated_of(nbytes: Any, tensors: Any) -> Any:
    """Bytes ``torch.cuda.memory_allocated`` counts for ``nbytes`` (> 0) split over ``tensors`` (>= 1) equal
    tensors, each request rounded up to 512 B; numbers or arrays (``plan/vector`` rounds many terms at once)."""
    per = -(-nbytes // tensors)
    return -(-per // ALLOC_ROUND) * ALLOC_ROUND * tensors


@dataclass(frozen=True)
class Item:
    """``bytes`` of one kind of memory; ``tensors`` is how many separate allocations it is made of."""

    category: Category
    item: str
    bytes: int
    formula: str
    level: Level = Level.TENSOR
    tensors: int = 1

    if TYPE_CHECKING:  # the generated __init__, as callers may call it: a plain name for category and level

        def __init__(self, category: Category | str, item: str, bytes: int, formula: str,
                     level: Level | str = Level.TENSOR, tensors: int = 1) -> None: ...  # fmt: skip

    def __post_init__(self) -> None:
        # callers may pass the plain string ("activations"): stored as the member (an unknown name raises
        # ValueError); a dict lookup, not Category(...), as items are made on the engine's hot path
        if self.category.__class__ is not Category:
            object.__setattr__(self, "category", _CATEGORY.get(self.category) or Category(self.category))
        if self.level.__class__ is not Level:
            object.__setattr__(self, "level", _LEVEL.get(self.level) or Level(self.level))

    @cached_property
    def allocated_bytes(self) -> int:
        """Bytes as ``torch.cuda.memory_allocated`` counts them (each tensor rounded up to 512 B)."""
        if self.level not in ALLOCATED_LEVELS or self.bytes <= 0:
            return 0
        return allocated_of(self.bytes, max(self.tensors, 1))
