"""Byte units and their formatting: GiB (2**30 bytes, the unit ``nvidia-smi`` and PyTorch's memory summaries use),
a human-readable size, and the thousands-separated integers of the formulas."""

from __future__ import annotations

GiB = 1024**3


def fmt_bytes(n: float) -> str:
    """Human-readable binary size, e.g. ``14.96 GiB``."""
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fmt_int(n: float) -> str:
    """Thousands-separated integer for formulas (``8,030,261,248``)."""
    return f"{int(n):,}"
