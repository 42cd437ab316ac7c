"""Memory outside the model's tensors: allocator rounding and fragmentation, workspaces, CUDA context, NCCL.

Facts from REFERENCE.md section 1. The two fragmentation constants are provisional, named here,
and to be fitted on part of the measured data (the accuracy issue) while the rest measures error.
"""

from __future__ import annotations

from memsim_widget.engine.context import Context
from memsim_widget.engine.items import Item, fmt_bytes

GiB = 1024**3
#: Reserved-but-unallocated share of memory that churns during the step (activations, temporaries,
#: gradients). REFERENCE.md: reserved is typically 5-30% above allocated in training.
FRAGMENTATION_TRANSIENT = 0.12
#: Reserved-but-unallocated share of long-lived memory (weights, states): segments rounded to 2 MiB.
FRAGMENTATION_PERSISTENT = 0.01
#: NCCL buffers and proxy state per communicator, outside the caching allocator (nccl#864: 0.5-1.6 GB).
NCCL_PER_COMMUNICATOR = int(0.5 * GiB)
#: Workspaces: one per (cuBLAS handle, stream); forward and the autograd thread use separate ones.
CUBLAS_HANDLES = 2


def workspace_items(ctx: Context) -> list[Item]:
    """cuBLAS workspaces, allocated through the caching allocator after the first matmul."""
    ws = ctx.gpu.cublas_workspace_bytes
    return [
        Item(
            "overhead",
            "cuBLAS workspaces",
            CUBLAS_HANDLES * ws,
            f"{CUBLAS_HANDLES} handles x {fmt_bytes(ws)} ({ctx.gpu.generation})",
            "allocator",
            CUBLAS_HANDLES,
        )
    ]


def communicators(ctx: Context) -> list[str]:
    """Process groups with more than one rank that this rank talks through."""
    p = ctx.par
    return [
        name
        for name, size in (("dp", p.dp * p.cp), ("tp", p.tp), ("pp", p.pp), ("cp", p.cp), ("ep", p.ep))
        if size > 1
    ]


def reserved_item(persistent: int, transient: int) -> Item:
    """Caching-allocator fragmentation: reserved minus allocated at the peak."""
    nbytes = int(FRAGMENTATION_PERSISTENT * persistent + FRAGMENTATION_TRANSIENT * transient)
    return Item(
        "overhead",
        "allocator fragmentation (reserved - allocated)",
        nbytes,
        f"{FRAGMENTATION_PERSISTENT:g} x {fmt_bytes(persistent)} long-lived + "
        f"{FRAGMENTATION_TRANSIENT:g} x {fmt_bytes(transient)} transient",
        "reserved",
        0,
    )


def device_items(ctx: Context) -> list[Item]:
    """CUDA context and NCCL communicators: in nvidia-smi, outside PyTorch's counters."""
    items = [
        Item(
            "overhead",
            "CUDA context and kernels",
            ctx.gpu.context_bytes,
            f"{fmt_bytes(ctx.gpu.context_bytes)} ({ctx.gpu.generation}, lazy module loading)",
            "device",
            0,
        )
    ]
    comms = communicators(ctx)
    if comms:
        n = len(comms)
        items.append(
            Item(
                "overhead",
                "NCCL communicator buffers",
                n * NCCL_PER_COMMUNICATOR,
                f"{n} communicators ({', '.join(comms)}) x {fmt_bytes(NCCL_PER_COMMUNICATOR)}",
                "device",
                0,
            )
        )
    return items
