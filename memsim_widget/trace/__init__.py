"""Fake-tensor tracer of the live tensor memory of real training steps (needs torch; imported lazily)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names __getattr__ gives, for type checkers (nothing imported at run time)
    from .hf import trace_hf
    from .run import TraceResult, trace_training
    from .tracker import MemoryTracker

__all__ = ["MemoryTracker", "TraceResult", "trace_hf", "trace_training"]


def __getattr__(name: str) -> Any:
    """Import the torch-dependent pieces on first use."""
    if name in ("MemoryTracker",):
        from .tracker import MemoryTracker

        return MemoryTracker
    if name in ("TraceResult", "trace_training"):
        from . import run

        return getattr(run, name)
    if name == "trace_hf":
        from .hf import trace_hf

        return trace_hf
    raise AttributeError(name)
