"""Memory outside the model's tensors -- workspaces, allocator fragmentation, CUDA context, NCCL -- and the
three GPU counters with their uncertainty bands.

Counters (docs/memory-facts.md#counters): ``allocated`` = live tensors rounded to 512 B + cuBLAS workspaces +
kernel scratch; ``reserved`` = allocated + what the caching allocator holds unused; ``device`` (nvidia-smi)
= reserved + CUDA context + NCCL buffers + memory allocated outside PyTorch (bitsandbytes' paged states).
Facts and sources: docs/memory-facts.md#counters, #caching-allocator, #memory-outside-the-tensors.

Reserved: by default (``Scenario.replays_reserved``) and on a step the allocation stream models
(``replayable.replayable``: one GPU, gradient accumulation included, an FSDP2, DDP, DeepSpeed ZeRO-1/2 or
tensor-parallel rank; on one GPU the optimizer in backward and activation offloading too, ``offload_stream``; a
GPipe or 1F1B pipeline stage, ``pp_stream``; no parameter offload, and optimizer offload only on a
DeepSpeed ZeRO rank, ``zero_offload_stream``; the supervised step),
the peak of a replay of the step's allocations and frees through PyTorch's caching allocator
(``alloc_stream.replayed_item``; no fitted constant: docs/allocator.md holds it to the H200 runs). Elsewhere, with
``reserved_model: fitted``, for batches padded to their longest sample (a long run's cache ratchets with their
lengths) and for compiled steps whose stream is not held to its trace (``replayable.compiled_stream_held``), the
fitted rule below (``reserved_item``).

Constants come in two kinds. *Stated* ones are read from a source and never tuned. *Fitted* ones -- only
``FRAGMENTATION_TRANSIENT`` and ``FRAGMENTATION_VARIABLE``, used by the fitted rule alone -- were fitted on the
odd-id rows of ``data/measured/published.csv`` that measure ``reserved`` or ``nvidia-smi`` (the median of each
row's implied value; ``python benchmarks/fidelity_measured.py --fit`` reproduces them) while every other row
measures the error (docs/accuracy.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memsim_widget.engine.activations.budget import ActivationBudget
from memsim_widget.engine.arith import first_largest, maximum, minimum, to_int
from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import expandable_segments
from memsim_widget.engine.items import Category, Item, Level
from memsim_widget.engine.step.lazy_items import ItemGroup
from memsim_widget.units import GiB, fmt_bytes

MiB = 1024**2

# ----- stated constants ----------------------------------------------------------------------------------
#: Reserved-but-unallocated share of long-lived memory (weights, states): 2 MiB segment rounding.
FRAGMENTATION_PERSISTENT = 0.01
#: NCCL buffers and proxy state per communicator, outside the caching allocator (nccl#864: 0.5-1.6 GB).
NCCL_PER_COMMUNICATOR = int(0.5 * GiB)
#: The band of NCCL memory per communicator (nccl#864: about 0.5 GB each, 1.6 GB seen with one).
NCCL_BAND_PER_COMMUNICATOR = (int(0.5e9), int(1.6e9))
#: Workspaces: one per (cuBLAS handle, stream); forward and the autograd thread use separate ones.
CUBLAS_HANDLES = 2
#: Of those handles, the ones first used in backward: the autograd engine runs a CUDA backward on its device
#: thread, whose handle comes from a thread-local pool and gets its workspace from the caching allocator at its
#: first cuBLAS call, right after the first backward matmul's output (PyTorch aten/src/ATen/cuda/
#: CublasHandlePool.cpp, ``getCurrentCUDABlasHandle`` -> ``setWorkspaceForHandle`` -> ``getNewWorkspace``;
#: torch 2.11-2.13). Never freed, it lands among the first step's freed loss buffers (docs/allocator.md).
AUTOGRAD_HANDLES = 1
#: The name of the workspaces' item (``workspace_items``), read by the allocation stream.
WORKSPACE_ITEM = "cuBLAS workspaces"
#: CUDA context with eager module loading (CUDA 11, or CUDA_MODULE_LOADING=EAGER): 1343 MiB measured on a
#: V100 after ``torch.ones(1).cuda()`` (transformers docs, model_memory_anatomy.md, 2022).
EAGER_CONTEXT_BYTES = 1343 * MiB
#: Context bands: 0.3-0.6 GiB with lazy loading on recent CUDA; about 1.3 GiB seen eager
#: (docs/memory-facts.md#memory-outside-the-tensors).
CONTEXT_BAND_LAZY = (int(0.3 * GiB), int(0.6 * GiB))
CONTEXT_BAND_EAGER = (int(1.0 * GiB), int(1.5 * GiB))
#: Spread of the same configuration between software versions, hardware and runs, applied to the
#: allocated and reserved bands: 10% (PR #961 of torchtune: 20.2 GB vs 22.3 GB for one setup;
#: docs/memory-facts.md#headroom-and-spread: 10-30% between versions).
VERSION_SPREAD = 0.10

# ----- fitted constants (docs/accuracy.md, "Fitted constants") --------------------------------------------
#: Reserved-but-unallocated share of the memory that churns during a step (activations, gradients,
#: temporaries) when every batch has the same shape. Fitted: median implied value over the odd-id
#: fixed-shape rows that measure reserved or nvidia-smi (BERT-large, transformers docs 2022: ids 81, 83, 85,
#: 87, 89). Published training runs commonly reserve 5-30% above allocated
#: (docs/memory-facts.md#caching-allocator).
FRAGMENTATION_TRANSIENT = 0.339
#: Extra reserved memory, as a multiple of the loss's T x V buffers, when batches are padded to their
#: longest sample (``padding: "longest"``): those buffers are the largest blocks of a step (GBs) and change
#: size every step, so segments cached for one batch cannot serve a longer one. Fitted: median implied
#: value over the odd-id variable-shape rows (ms-swift, ids 107-121 odd).
FRAGMENTATION_VARIABLE = 2.236

PERSISTENT_CATEGORIES = (Category.PARAMETERS, Category.OPTIMIZER_STATES)


def workspace_items(ctx: Context) -> list[Item]:
    """cuBLAS workspaces, allocated through the caching allocator after the first matmul."""
    ws = ctx.gpu.cublas_workspace_bytes
    return [
        Item(
            Category.OVERHEAD,
            WORKSPACE_ITEM,
            CUBLAS_HANDLES * ws,
            f"{CUBLAS_HANDLES} handles x {fmt_bytes(ws)} ({ctx.gpu.generation})",
            Level.ALLOCATOR,
            CUBLAS_HANDLES,
        )
    ]


def group_sizes(dp: Any, tp: Any, pp: Any, cp: Any, ep: Any, dp_shard: Any = 0) -> dict[str, Any]:
    """The process groups a rank talks through and their ranks; numbers or arrays (``plan/vector`` counts the
    communicators of many layouts at once). Data parallelism spans dp x cp ranks; under hybrid sharding
    (``dp_shard``, 0 or None: unset) the "dp" group is the shard group (dp_shard x cp: all-gathers and
    reduce-scatters) and "dp_replicate" joins the dp / dp_shard replicas of a shard (FSDP2's HSDP all-reduce
    of each reduce-scattered gradient: torch 2.13 ``distributed/fsdp/_fully_shard/_fsdp_collectives.py``
    ``foreach_reduce``, ``all_reduce_group``; FSDP1's ``HYBRID_SHARD`` builds the same two groups,
    ``fsdp/_init_utils.py`` ``_init_intra_and_inter_node_groups``)."""
    if isinstance(dp_shard, int) or dp_shard is None:
        shard = dp_shard or dp
    else:  # a column: 0 where unset
        shard = dp_shard + (dp_shard == 0) * dp
    return {"dp": shard * cp, "dp_replicate": dp // shard, "tp": tp, "pp": pp, "cp": cp, "ep": ep}


def communicator_count(dp: Any, tp: Any, pp: Any, cp: Any, ep: Any, dp_shard: Any = 0) -> Any:
    """NCCL communicators a rank holds: one per process group of more than one rank (``group_sizes``)."""
    return sum(((size > 1) * 1 for size in group_sizes(dp, tp, pp, cp, ep, dp_shard).values()), start=0)


def communicators(ctx: Context) -> list[str]:
    """Process groups with more than one rank that this rank talks through (``group_sizes``; ``dp_shard`` only
    under ZeRO >= 1, where something is sharded)."""
    p = ctx.par
    shard = p.dp_shard if p.zero else None
    return [name for name, size in group_sizes(p.dp, p.tp, p.pp, p.cp, p.ep, shard).items() if size > 1]


def context_bytes(ctx: Context) -> int:
    """CUDA context and resident kernels: the GPU generation's figure with lazy module loading, else the
    eager-loading measurement."""
    if ctx.scenario.cuda_lazy_loading:
        return ctx.gpu.context_bytes
    return max(ctx.gpu.context_bytes, EAGER_CONTEXT_BYTES)


def nccl_bytes(communicators: Any) -> Any:
    """NCCL buffers and proxy state of ``communicators`` communicators (``communicator_count``): numbers or arrays."""
    return communicators * NCCL_PER_COMMUNICATOR


def paged_items(persistent: Iterable[Item]) -> list[Item]:
    """The long-lived items allocated outside PyTorch's caching allocator (bitsandbytes' paged optimizer states:
    level device), which nvidia-smi counts beside the context and NCCL."""
    return [i for i in persistent if i.level == Level.DEVICE]


def outside_bytes(context: Any, communicators: Any, paged: Any) -> Any:
    """nvidia-smi's bytes outside the caching allocator: the CUDA context (``context_bytes``), the NCCL buffers of
    ``communicators`` communicators (``nccl_bytes``) and ``paged`` bytes allocated outside PyTorch
    (``paged_items``). Numbers (one rank: ``engine/core``, its items from ``device_items``) or arrays
    (``plan/vector``: many candidate ranks)."""
    return context + nccl_bytes(communicators) + paged


def device_items(ctx: Context) -> list[Item]:
    """CUDA context and NCCL communicators: in nvidia-smi, outside PyTorch's counters."""
    lazy = ctx.scenario.cuda_lazy_loading
    cb = context_bytes(ctx)
    items = [
        Item(
            Category.OVERHEAD,
            "CUDA context and kernels",
            cb,
            f"{fmt_bytes(cb)} ({ctx.gpu.generation}, "
            + ("lazy module loading)" if lazy else "eager module loading, measured on CUDA 11)"),
            Level.DEVICE,
            0,
        )
    ]
    comms = communicators(ctx)
    if comms:
        n = len(comms)
        items.append(
            Item(
                Category.OVERHEAD,
                "NCCL communicator buffers",
                nccl_bytes(n),
                f"{n} communicators ({', '.join(comms)}) x {fmt_bytes(NCCL_PER_COMMUNICATOR)}",
                Level.DEVICE,
                0,
            )
        )
    return items


def waste_rates(ctx: Context) -> tuple[float, float]:
    """(share of churning memory, multiple of the loss buffers) the allocator holds unused. With
    ``expandable_segments:True`` the churning share is the same ``FRAGMENTATION_TRANSIENT``: a segment that grows
    keeps the freed pages inside it mapped, so a request larger than every free block still maps new pages; the
    replay (``engine/counters/allocator``, expandable mode) of torchtitan's FSDP2 steps leaves 10-15 GiB unused
    beside 25-66 GiB allocated, and torchtitan's published eager FSDP rows are within 2% of that replay
    (docs/allocator.md, "The fitted rule under expandable segments"). The variable-shape term is dropped: a
    growing segment serves a longer batch's buffers from the pages a shorter one freed."""
    if expandable_segments(ctx):
        return FRAGMENTATION_TRANSIENT, 0.0
    variable = FRAGMENTATION_VARIABLE if ctx.scenario.padding == "longest" else 0.0
    return FRAGMENTATION_TRANSIENT, variable


def pool_bytes(ctx: Context, items: Iterable[Item], loss_names: set[str]) -> tuple[int, int]:
    """(allocated, unused-but-reserved) bytes of the caching allocator's pool at one moment."""
    alloc, persistent, loss = ItemGroup(list(items)).pool_sums(PERSISTENT_CATEGORIES, loss_names)
    return alloc, waste_bytes(alloc, persistent, loss, waste_rates(ctx))


def waste_bytes(alloc: Any, persistent: Any, loss: Any, rates: tuple[float, float]) -> Any:
    """Unused-but-reserved bytes of a pool of ``alloc`` allocated bytes, ``persistent`` of them weights and
    states, ``loss`` of them the loss's T x V buffers, at ``rates`` (``waste_rates``): ``FRAGMENTATION_PERSISTENT``
    of the long-lived bytes, the transient rate of the rest, the variable rate of the loss buffers, truncated.
    Numbers (one moment of one rank) or arrays (``plan/vector``: a moment of many candidate ranks)."""
    f_transient, f_variable = rates
    waste = FRAGMENTATION_PERSISTENT * persistent + f_transient * (alloc - persistent)
    if f_variable:  # adding 0.0 changes no sum: skipped (the planner's arrays are large)
        waste = waste + f_variable * loss
    return to_int(waste)


def reserved_cap(ctx: Context, outside: Any) -> Any:
    """The most the allocator can reserve: the card minus what lives outside it (context, NCCL, paged).
    When a cudaMalloc fails the allocator frees its cached blocks and retries, so reserved stops there."""
    return ctx.gpu.memory_bytes - outside


def capped_reserved(peak_allocated: Any, pool: Any, cap: Any) -> Any:
    """The reserved counter from the allocator's largest pool (the fitted rule's, or a replay's peak
    reserved): at least the peak allocated, at most the card's room (``reserved_cap``). Numbers or arrays."""
    return maximum(peak_allocated, minimum(pool, cap))


def reserved_item(
    ctx: Context, moments: Iterable[object], peak_allocated: int, acts: ActivationBudget, outside: int
) -> Item:
    """Caching-allocator fragmentation: the largest pool over the step's moments, minus the peak allocated.

    Each moment's pool is its allocated bytes plus ``FRAGMENTATION_PERSISTENT`` of weights and states,
    ``FRAGMENTATION_TRANSIENT`` of everything else (with expandable segments too: ``waste_rates``)
    and, with variable batch shapes, ``FRAGMENTATION_VARIABLE`` x the loss's T x V buffers; capped by the card.
    """
    loss_names = acts.loss_buffer_names()
    rates = waste_rates(ctx)  # once: every moment of every estimate reads them
    held = [(peak_allocated, 0, "")]  # (allocated, unused, moment): the peak allocated is a floor
    for m in moments:
        alloc, persistent, loss = m.pool_sums(PERSISTENT_CATEGORIES, loss_names)  # type: ignore[attr-defined]
        held.append((alloc, waste_bytes(alloc, persistent, loss, rates), m.name))  # type: ignore[attr-defined]
    pool, at = first_largest([a + w for a, w, _ in held])  # the planner's _peak_and_pool: the same choice
    best_alloc, best_waste, best_name = held[at]
    cap = reserved_cap(ctx, outside)
    reserved = capped_reserved(peak_allocated, pool, cap)
    f_transient, f_variable = rates
    formula = (
        f"largest pool at {best_name}: {fmt_bytes(best_alloc)} allocated + {fmt_bytes(best_waste)} unused "
        f"({FRAGMENTATION_PERSISTENT:g} x weights and states + {f_transient:g} x the rest"
        + (f" + {f_variable:g} x loss T x V buffers, variable batch shapes" if f_variable else "")
        + ")"
        + capped_note(cap, pool > cap)
    )
    return fragmentation_item(reserved - peak_allocated, formula)


def capped_note(cap: int, capped: bool) -> str:
    """The formula's note when the pool would pass the card (empty when it does not)."""
    return f"; capped at {fmt_bytes(cap)} (the card less context and outside allocations)" if capped else ""


def fragmentation_item(nbytes: int, formula: str) -> Item:
    """The reserved-but-unallocated item, whichever rule (fitted, or the replay of engine/counters/alloc_stream) gave it."""
    return Item(
        Category.OVERHEAD,
        "allocator fragmentation (reserved - allocated)",
        nbytes,
        formula,
        Level.RESERVED,
        0,
    )


def counter_bands(ctx: Context, allocated: int, reserved: int, outside: int) -> dict[str, tuple[int, int]]:
    """(low, high) bytes per counter: what runs of the same configuration can plausibly show.

    allocated: +-``VERSION_SPREAD``. reserved: from no fragmentation at all (expandable segments, lucky
    reuse) to twice the modelled fragmentation, with the same spread, at most the card. device: the reserved
    band plus the context band of the loading mode and the NCCL band per communicator; memory allocated
    outside PyTorch (paged optimizer states) is carried as predicted.
    """
    s = VERSION_SPREAD
    a_lo, a_hi = int(allocated * (1 - s)), int(allocated * (1 + s))
    waste = reserved - allocated
    cap = reserved_cap(ctx, outside)
    r_lo = a_lo
    r_hi = max(reserved, min(int((allocated + 2 * waste) * (1 + s)), cap))
    lazy = ctx.scenario.cuda_lazy_loading
    c_lo, c_hi = CONTEXT_BAND_LAZY if lazy else CONTEXT_BAND_EAGER
    cb = context_bytes(ctx)
    c_lo, c_hi = min(c_lo, cb), max(c_hi, cb)
    n = len(communicators(ctx))
    n_lo, n_hi = (n * x for x in NCCL_BAND_PER_COMMUNICATOR)
    other = outside - cb - nccl_bytes(n)  # paged optimizer states and the like
    return {
        "peak_allocated_bytes": (a_lo, a_hi),
        "peak_reserved_bytes": (r_lo, r_hi),
        "device_total_bytes": (r_lo + c_lo + n_lo + other, r_hi + c_hi + n_hi + other),
    }
