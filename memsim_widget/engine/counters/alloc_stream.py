"""The allocations and frees of a training step, written from the engine's own groups, replayed through the
caching allocator (``engine/counters/allocator.py``): the ``reserved`` counter without a fitted constant.

The stream follows the order a PyTorch step runs in (``engine/step/timeline`` names the groups): weights and the
cuBLAS workspaces; per step the inputs, per layer its saved activations (under checkpointing the layer's
forward runs without saving, so its transients come and go around the checkpointed input), the final norm and
head, the loss's T x V buffers (forward, saved, backward), the output the loop holds; backward from the top
layer down: the recomputed layer, the layer's backward transients, its gradients, then its saved tensors
freed; the optimizer step (its states made at the first step) and its temporaries; gradients freed
(``zero_grad(set_to_none=True)``). ``trace/replay.py`` replays the fake-tensor trace of the real framework
the same way; docs/allocator.md compares the two.

Cost: a replay is a few thousand events (about 1 us each, benchmarks/replay_speed.py); it is cached per shape
key (the state groups' and activation groups' keys of ``engine/caches/parts_cache``, the layers and the allocator
settings), so only a new shape pays it, and per stream, so a new shape whose stream is one already replayed
(another card) pays only the stream's building. The building writes two layers and copies the second for the
others (``StreamWriter.repeat``: the same events as writing each, tests/engine/test_replay_paths.py); a shape's
replay on its card reuses the stream its unlimited replay built. Whether a shape runs on a card whose room its
stream's requested bytes exceed is known without a replay (``asks``: out of memory), which the planner reads.

Whether the stream models a step at all is decided in ``engine/counters/replayable`` (without importing this
module); the replay on a card's real capacity, the verdict's, lives in ``engine/counters/card_replay``.
"""

from __future__ import annotations

import marshal
import threading
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import lru_cache
from hashlib import blake2b
from typing import Any, cast

from memsim_widget.alloc_conf import LARGE_BUFFER
from memsim_widget.engine.activations import eager_core_steps
from memsim_widget.engine.activations.compiled_backward import (
    CONSTANT,
    FREE_SAVED,
    GRADS,
    LAYER_BACKWARD,
    LAYER_RECOMPUTE,
    RELEASE,
    TANGENT,
)
from memsim_widget.engine.activations.compiled_olmo2_steps import KEEP, KEEP_SAVED, LATE
from memsim_widget.engine.activations.compiled_steps import (
    bottom_layer_backward_steps,
    bottom_order,
    final_norm_steps,
    first_layer_forward_steps,
    kept_top,
    layer_backward_steps,
    layer_forward_steps,
    weights_in_module_order,
)
from memsim_widget.engine.activations.eager_steps import (
    ARRIVING,
    CUDA_SCRATCH,
    HEAD_DONE,
    INPUT_GRADIENT,
    eager_layer_backward_transients,
    eager_layer_forward_transients,
    final_norm_backward_transients,
    layer_norm_backward_transients,
    rotary_transients,
)
from memsim_widget.engine.activations.eager_steps import SAVED_COUNT as NORM_SAVED
from memsim_widget.engine.activations.forward import (
    HELD,
    IN,
    LATER,
    OUT,
    SAVED,
    SAVED_AT,
    SAVED_BYTES,
    Step,
    final_norm_transients,
)
from memsim_widget.engine.activations.loss import (
    COMPILED_APART,
    LOSS_PARALLEL_BACKWARD,
    LOSS_PARALLEL_SHIFTED,
    NLL_FP32_COPY,
    SOFTCAP_SAVED,
)
from memsim_widget.engine.activations.tangents import (
    CACHE_TANGENTS,
    LOGITS_TANGENT,
    LOSS_GRADIENT,
    tangent_role,
)
from memsim_widget.engine.counters.allocator import (
    FREE,
    MIN_BLOCK,
    AllocatorConf,
    CachingAllocator,
    Event,
    alloc,
)
from memsim_widget.engine.counters.ddp_stream import DdpBuckets, DdpWriter, rank_buckets
from memsim_widget.engine.counters.fsdp_stream import Fsdp2Units, Fsdp2Writer, fsdp2_units
from memsim_widget.engine.counters.offload_stream import (
    InBackwardGrads,
    Offloader,
    copy_stream,
    savers_note,
)
from memsim_widget.engine.counters.overhead import AUTOGRAD_HANDLES, WORKSPACE_ITEM
from memsim_widget.engine.counters.pp_stream import PipelineStage, pipeline_stage, pp_replayable, run_schedule
from memsim_widget.engine.counters.replayable import (
    ddp_replayable,
    fsdp2_replayable,
    zero3_replayable,
    zero12_replayable,
)
from memsim_widget.engine.counters.tp_stream import (
    EMBEDDING_GRAD,
    HEAD_GATHER,
    embedding_grad,
    gather_logits,
    head_gather,
    optimizer_groups,
    scatter_gradient,
    tp_note,
    weights_by_param,
    whole_table_grads,
)
from memsim_widget.engine.counters.zero3_stream import (
    Zero3Units,
    Zero3Writer,
    per_element,
    rest_of,
)
from memsim_widget.engine.counters.zero_lora import ADAPTER_ITEM, lora_cast, lora_zero3_units, lora_zero12
from memsim_widget.engine.counters.zero_offload_stream import (
    zero3_rank,
    zero3_writer,
    zero12_rank,
    zero_offload_note,
    zero_writer,
)
from memsim_widget.engine.counters.zero_stream import NO_DECAY_KIND, ZeroRank, ZeroWriter
from memsim_widget.engine.frameworks import grads_kept
from memsim_widget.engine.items import ALLOCATED_LEVELS, Item
from memsim_widget.engine.states.gradients import (
    DDP_BUCKETS_ITEM,
    OFFLOAD_STAGING_ITEM,
    ZERO_BUCKET_ITEM,
    new_gradient,
)
from memsim_widget.engine.states.optimizer import MASTER_ITEM
from memsim_widget.fast_dataclass import dataclass
from memsim_widget.units import fmt_bytes

#: The persistent items a ZeRO-1/2 rank's wrap replaces with DeepSpeed's own buffers (``zero_stream``,
#: ``zero_offload_stream``): the ipg buffer, the master weights, the offload staging buffer
ZERO_WRITTEN = (ZERO_BUCKET_ITEM, MASTER_ITEM, OFFLOAD_STAGING_ITEM)

#: Steps replayed: the first makes the optimizer states; the second shows what the cache left by a whole step
#: serves. A third step reached the same peak reserved on every H200 run (benchmarks/allocator_replay.py
#: --engine-stream prints it).
STEPS = 2
#: Batches padded to their longest sample (``padding: "longest"``): the first step replayed is this many times
#: shorter than the longest, whose step comes last, so the segments the shorter step's T x V buffers left are
#: cached when the longest needs larger ones. An assumption (the lengths of real batches are unknown), not
#: fitted. Over a long run of varying lengths the cache grows further (``batch_lengths`` replays such runs;
#: docs/allocator.md, "Variable lengths").
VARIABLE_DIVISOR = 2
#: The key of ``step_stream``'s activation groups holding a layer's forward transients
#: (``engine/activations/forward.layer_forward_transients``; absent or empty: none).
LAYER_FORWARD = "layer_forward"
#: The key of a flag (``compiled_steps.bottom_order``): the buffers a compiled backward keeps to the bottom are
#: freed in the trace's order (``_bottom_freed``); absent or empty: in the order they were made.
BOTTOM_ORDER = "bottom_order"
#: The key of the bottom layer's forward steps where they differ from the others' (``compiled_steps.
#: first_layer_forward_steps``; absent or empty: ``LAYER_FORWARD``'s).
FIRST_LAYER_FORWARD = "first_layer_forward"
#: The key of the final norm's forward transients, its saved tensors and the head's input at ``SAVED``
#: (``engine/activations/forward.final_norm_transients``; absent or empty: the ``post`` items alone).
FINAL_NORM = "final_norm_forward"
#: The key of the bottom layer's backward buffers where they differ from the others' (``compiled_backward.
#: compiled_lora_steps.bottom_layer_backward_steps``: a compiled LoRA layer 0 reads the frozen embedding and makes no input
#: gradient; absent or empty: ``LAYER_BACKWARD``'s).
BOTTOM_LAYER_BACKWARD = "bottom_layer_backward_steps"
#: The key of the places, among the top's backward tensors and then the ``post`` ones, of those a compiled
#: backward keeps until the bottom layer is done (``compiled_steps.kept_top``: where the residual gradient is never
#: summed per layer, the kernel at the bottom reads the head's input gradient, the last layer's output and the
#: final norm's rsqrt; freed with the buffers the layers keep, where a layer's ``RELEASE`` + ``KEEP`` step frees them
#: (a compiled Gemma 3 LoRA layer 0) or after the bottom layer; absent or empty: all freed before the layers).
KEPT_TOP = "kept_top"
#: The key of the final norm's backward buffers, op by op (``engine/activations/eager_steps``; absent or empty:
#: the ``top_backward`` items).
FINAL_NORM_BACKWARD = "final_norm_backward"
#: The key of one of a layer's two RMSNorms' backward buffers, op by op (``engine/activations/eager_steps``;
#: absent or empty: none beside the ``layer_backward`` items).
LAYER_NORM_BACKWARD = "layer_norm_backward"
#: The key of the rotary embedding's forward buffers (``engine/activations/eager_steps.rotary_transients``; absent or
#: empty: the ``pre`` items alone).
ROTARY_FORWARD = "rotary_forward"
#: Item levels the caching allocator serves (device-level items live outside it): those it counts as allocated.
_POOLED = ALLOCATED_LEVELS


@dataclass(frozen=True)
class GradOrder:
    """A rank's parameter tensors (elements each) in the order backward makes their gradients: the head and
    final norm first (with the input embeddings when the head is tied to them: the head's backward makes
    their gradient), each layer's, the embeddings' last."""

    top: tuple[int, ...]
    layer: tuple[int, ...]
    bottom: tuple[int, ...]
    #: how many of ``top``'s first tensors are input-side parameters (the tied embeddings): they come first in
    #: the module's parameter order
    top_pre: int = 0
    #: the same tensors in the module's parameter order (``model.parameters()``: the input side, each layer's
    #: in turn, the output side), the order the optimizer makes its states and temporaries and
    #: ``zero_grad`` frees the gradients in; empty when the layers' groups do not split evenly by layer
    params: tuple[int, ...] = ()


def grad_order(ctx: Any, stage: Any) -> GradOrder:
    """``GradOrder`` of ``stage``'s rank (``engine/states.local_groups``; a layer's share of each group:
    ``states/budget.per_layer_tensors``)."""
    from memsim_widget.engine.states.budget import local_groups, per_layer_tensors

    top: list[int] = []
    layer: list[int] = []
    bottom: list[int] = []
    pre: list[int] = []
    post: list[int] = []
    even = True
    tied = ctx.arch.tied_embeddings and stage.last
    for lg in local_groups(ctx, stage):
        g = lg.group
        if g.scope == "layer":
            layer += per_layer_tensors(lg.numel_each, lg.count, max(stage.layers, 1))
            even = even and lg.count % max(stage.layers, 1) == 0
        elif g.scope == "pre":
            (top if tied and g.kind == "embedding" else bottom).extend([lg.numel_each] * lg.count)
            pre += [lg.numel_each] * lg.count
        else:
            top += [lg.numel_each] * lg.count
            post += [lg.numel_each] * lg.count
    top_pre = len(top) - len(post)
    params = tuple(pre + layer * stage.layers + post) if even else ()
    return GradOrder(tuple(top), tuple(layer), tuple(bottom), top_pre, params)


@dataclass(frozen=True)
class PoolReplay:
    """What the replay of a rank's steps found: the peak of each counter, the phase where reserved peaked,
    the largest cached-but-unused blocks at that moment, the segments cudaMalloc'd and the events replayed."""

    peak_reserved: int
    peak_allocated: int
    at: str
    largest_cached: tuple[int, ...]
    segments: int
    events: int
    #: the peak of the bytes asked for (sizes before rounding): ``card_replay.card_runs`` reads it
    peak_requested: int = 0


def tensor_sizes(
    items: Sequence[Any], numels: tuple[int, ...] = (), share: int = 1, first: bool = False
) -> list[int]:
    """The bytes of each tensor of ``1/share`` of the pooled ``items``, in order (``StreamWriter.items``; ``first``:
    layer 0's share). Per-tensor sizes: the item's own ``shares`` of its bytes where it has them (repeated over
    its tensors; where layer 0 lacks whole cycles of them, ``LazyItem.cut``, its share has the cycles it keeps and
    the others theirs, each cycle its true size), else proportional to the parameter tensors' elements when the
    item has k tensors per parameter (gradients, optimizer states and their step temporaries), else
    ``bytes / tensors`` each."""
    out: list[int] = []
    total = sum(numels)
    for i in items:
        if i.level not in _POOLED or i.bytes <= 0:
            continue
        n = max(i.tensors, 1)
        k = max(n // share, 1)
        shares = getattr(i, "shares", ())
        cut, sets = getattr(i, "cut", (0, 0))
        if cut and k % len(shares) == 0 and (share == 1 or sets == 1) and n - cut * sets > 0:
            # layer 0's missing tensors (its first ones: the first norm's) as empty requests, which the allocator
            # skips as PyTorch does a 0-byte tensor's: every layer keeps its handles (``StreamWriter.repeat``)
            cycle = i.bytes / ((n - cut * sets) // len(shares))
            empty = cut * sets if share == 1 else (cut if first else 0)
            out += [0] * empty
            for _ in range((n if share == 1 else k) // len(shares) - empty // len(shares)):
                for x in shares:
                    out.append(max(int(cycle * x), 1))
        elif shares and k % len(shares) == 0:
            part = i.bytes / share / (k // len(shares))
            for _ in range(k // len(shares)):
                for x in shares:
                    out.append(max(int(part * x), 1))
        elif share == 1 and numels and n % len(numels) == 0 and total:
            per = i.bytes / (n // len(numels) * total)
            for _ in range(n // len(numels)):
                for x in numels:
                    out.append(max(int(x * per), 1))
        else:
            out += [max(int(i.bytes / share / k), 1)] * k
    return out


class StreamWriter:
    """An allocation stream being written: handles numbered in allocation order, phases marked."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.marks: list[tuple[int, str]] = []
        self.handle = 0
        #: the bytes of handle ``h`` at ``sizes[h - 1]`` (``size``: handles are numbered in allocation order)
        self.sizes: list[int] = []
        #: per step, ``here()`` at the start of its micro-batches 2 to M and after the last: where the replay may
        #: find them copies of each other (``replay_stream``; nothing is assumed, each copy is checked)
        self.micro_bounds: list[list[tuple[int, int]]] = []

    def mark(self, label: str) -> None:
        """Name the phase the next events belong to."""
        self.marks.append((len(self.events), label))

    def alloc(self, size: int, n: int = 1, stream: int = 0) -> list[int]:
        """``n`` allocations of ``size`` bytes each on ``stream``; their handles."""
        h = self.handle
        if n == 1:  # most calls: one tensor
            self.handle = h + 1
            self.events.append((h + 1, size, stream))
            self.sizes.append(size)
            return [h + 1]
        self.events += [alloc(h + k + 1, size, stream) for k in range(n)]
        self.sizes += [size] * max(n, 0)
        self.handle = h + n
        return list(range(h + 1, h + n + 1))

    def repeat(self, begin: tuple[int, int], times: int, lowest: int = 0, back: int = 0) -> int:
        """Write the events from ``begin`` (an event index and the handle counter then, ``here``) to the end
        ``times`` more times, each copy's handles shifted by the handles the block allocated (its own, and the
        ones it freed of the block before: identical layers), handles under ``lowest`` by ``-back`` (tensors of
        earlier layers it frees, taken in reverse); returns the shift per copy."""
        start, h0 = begin
        block = cast("list[tuple[int, int, int]]", self.events[start:])  # the writer's handles are ints
        d = self.handle - h0
        ev = self.events
        for k in range(1, times + 1):
            up, down = k * d, k * back
            if back:
                ev += [(h + up if h > lowest else h - down, size, st) for h, size, st in block]
            else:
                ev += [(h + up, size, st) for h, size, st in block]
        self.handle += times * d
        self.sizes += self.sizes[h0 : h0 + d] * times  # each copy allocates the block's handles, in order
        return d

    def here(self) -> tuple[int, int]:
        """The next event's index and the handle counter (``repeat``'s ``begin``)."""
        return len(self.events), self.handle

    def free(self, handles: Sequence[int]) -> None:
        """Free ``handles`` in order."""
        self.events += [(h, FREE, 0) for h in handles]

    def items(
        self, items: Sequence[Any], numels: tuple[int, ...] = (), share: int = 1, first: bool = False
    ) -> list[int]:
        """Allocate ``1/share`` of each pooled item (a layer's share when ``share`` is the layer count; ``first``:
        layer 0's), one handle per tensor of ``tensor_sizes``."""
        out: list[int] = []
        for size in tensor_sizes(items, numels, share, first):
            out += self.alloc(size)
        return out

    def per_param(
        self, items: Sequence[Any], params: tuple[int, ...], of: tuple[int, ...] = (), total: int = 0
    ) -> list[int]:
        """Allocate the pooled ``items`` that hold k tensors per parameter parameter by parameter, each item's
        in turn (Adam's ``_init_group`` makes ``exp_avg`` then ``exp_avg_sq`` for one parameter before the
        next; a foreach step's ``_foreach_sqrt`` returns its list in parameter order), ``params`` the
        parameters' elements in that order; other items as ``items`` allocates them, first. ``of``: the
        parameters the items hold k tensors each of, when ``params`` is part of them (an optimizer group),
        ``total`` the elements the items' bytes are spread over (default: all of ``of``)."""
        of = of or params
        total = total or sum(of)
        split = [
            i
            for i in items
            if i.level in _POOLED
            and i.bytes > 0
            and total
            and not getattr(i, "shares", ())
            and max(i.tensors, 1) % len(of) == 0
        ]
        out = self.items([i for i in items if i not in split])
        per = [
            (max(i.tensors, 1) // len(of), i.bytes / (max(i.tensors, 1) // len(of) * total)) for i in split
        ]
        for x in params:
            for k, b in per:
                out += self.alloc(max(int(x * b), 1), k)
        return out

    def size(self, handle: int) -> int:
        """The bytes ``handle`` was allocated with (handles are numbered in allocation order; where events were
        written past ``alloc`` and ``repeat``, found among them)."""
        if len(self.sizes) == self.handle:
            return self.sizes[handle - 1]
        return next(size for h, size, _ in reversed(self.events) if h == handle and size != FREE)


class _Grads:
    """How a micro-batch's backward writes its gradients: per parameter tensor in backward order (``order``,
    where the gradients are one item of one tensor per parameter) or each layer's share of the items; from the
    second micro-batch of a step on (``new``), each is made apart and freed as ``AccumulateGrad`` adds it to the
    parameter's ``.grad`` in place (``engine/states/gradients.new_gradient``), so none is kept."""

    def __init__(
        self, s: StreamWriter, sg: dict[str, Sequence[Any]], numels: tuple[int, ...], order: Any
    ) -> None:
        g_items = [i for i in sg["grads"] if i.level in _POOLED and i.bytes > 0]
        self.s, self.sg, self.order = s, sg, order
        self.by_tensor = bool(
            order is not None and len(g_items) == 1 and g_items[0].tensors == len(numels) and sum(numels)
        )
        self.per = g_items[0].bytes / sum(numels) if self.by_tensor else 0.0
        self.new = False
        #: a ZeRO-1/2 rank's hooks (``zero_stream.ZeroWriter``): each gradient made whole, then handed to them
        self.zero: ZeroWriter | None = None

    def made(self, part: tuple[int, ...], share: int, hold: bool = False) -> list[int]:
        """The gradients of ``part`` (parameter tensors' elements; else a ``share`` of the items): their
        handles, or none when each new one was added in place and freed (``hold``: the tied head part, which
        ``micro_batch`` makes with ``new`` off; ``offload_stream.InBackwardGrads`` reads it)."""
        s = self.s
        if self.zero is not None and self.by_tensor:  # DeepSpeed's hook copies each into its ipg buffer
            for x in part:
                self.zero.ready(s.alloc(x * self.zero.z.model_bytes))
            return []
        if not self.by_tensor:
            out = s.items(self.sg["grads"], share=share)
        elif self.new:  # one at a time: each freed once added, before the next is made
            for x in part:
                size = max(int(x * self.per), 1)
                if self.per.is_integer():  # the engine's item for it (its bytes the same)
                    size = new_gradient(x, int(self.per)).bytes
                s.free(s.alloc(size))
            return []
        else:
            out = [h for x in part for h in s.alloc(max(int(x * self.per), 1))]
        if self.new:
            s.free(out)
            return []
        return out


def step_stream(
    ag: dict[str, Sequence[Any]],
    sg: dict[str, Sequence[Any]],
    first: Sequence[Any],
    numels: tuple[int, ...],
    layers: int,
    steps: int = STEPS,
    order: GradOrder | None = None,
    replayed: int | None = None,
    earlier: dict[str, Sequence[Any]] | None = None,
    micro: int = 1,
    repeat: bool = True,
    fsdp: Any = None,
    kept: bool = False,
    ddp: DdpBuckets | None = None,
    schedule: Sequence[dict[str, Sequence[Any]]] = (),
    per_param: bool = False,
    opt_groups: tuple[tuple[int, ...], ...] = (),
    zero: ZeroRank | None = None,
    pipe: PipelineStage | None = None,
    in_backward: bool = False,
    offload: int | None = None,
) -> StreamWriter:
    """The stream of ``steps`` steps of a rank with ``layers`` layers: ``ag``/``sg`` the activation and state
    groups' items (``moments.ACTIVATION_GROUPS``, ``STATE_GROUPS``), ``first`` the persistent items before the
    first optimizer step, ``numels`` the rank's parameter tensors' elements, ``order`` the same tensors in the
    order backward makes their gradients (None: every layer's share of the gradients at once), ``micro`` the
    micro-batches run forward and backward before each optimizer step (gradient accumulation: the first makes
    the gradients, the later ones add theirs in place, ``_Grads``), ``fsdp`` a rank's FSDP2 units
    (``fsdp_stream.Fsdp2Units``: its buffers on their streams, the gradients its reduce-scatter outputs), ``kept``
    the gradients kept as zeros by ``zero_grad`` (``frameworks.grads_kept``): made by the first step's backward
    and never freed, every later backward adding its gradients in place as an accumulation step does; ``ddp`` a
    DDP rank's buffers (``ddp_stream.DdpBuckets``: the wrap-time broadcast and buckets after the weights, the
    rebuild before the second step's first forward; its item in ``first`` and ``sg`` is not written again);
    ``schedule`` the activation items of every micro-batch in turn (batches of varying lengths: ``steps`` x
    ``micro`` entries, micro-batch ``j`` of the stream reads entry ``j``; empty: ``ag``, and ``earlier`` on the
    first step); ``pipe`` a pipeline stage (``pp_stream.PipelineStage``: its micro-batches in the schedule's
    order, ``ag`` one micro-batch's); ``per_param`` the weights made one tensor at a time in the module's order
    (``tp_stream.weights_by_param``; a TP rank's); ``opt_groups`` the optimizer's parameter groups (indices into
    the parameters' order), each making its states and stepping in turn (``tp_stream.optimizer_groups``);
    ``zero`` a DeepSpeed ZeRO-1/2 rank (``zero_stream``: its flat weights and master partition at wrap, its ipg
    buffer and partition gradients in backward, its step; its items in ``first`` and ``sg`` not written again);
    ``in_backward`` each parameter stepped by its hook in backward (``offload_stream.InBackwardGrads``: no step
    after backward); ``offload`` the stream offloaded layers' saved tensors are brought back on
    (``offload_stream.Offloader``; None: not offloaded)."""
    s = StreamWriter()
    if ddp is not None:
        first = [i for i in first if i.item != DDP_BUCKETS_ITEM]
        sg = {**sg, "persistent": [i for i in sg["persistent"] if i.item != DDP_BUCKETS_ITEM]}
    reducer = DdpWriter(s, ddp) if ddp is not None else None
    z3 = zero3_writer(s, fsdp) if isinstance(fsdp, Zero3Units) else None
    comm: Any = (
        z3 if z3 is not None else Fsdp2Writer(s, cast("Fsdp2Units", fsdp)) if fsdp is not None else None
    )
    params = order.params if order and sorted(order.params) == sorted(numels) else numels
    later = [i for i in sg["persistent"] if i not in first]  # optimizer states, made by the first step
    inb = InBackwardGrads(s, sg, order, later, params) if in_backward else None
    grads = inb or _Grads(s, sg, numels, order)
    off = Offloader(s, offload) if offload is not None else None
    s.mark("weights")
    if zero is not None:
        grads.zero = _zero_wrap(s, zero, first)
        sg = {
            **sg,
            "persistent": [i for i in sg["persistent"] if i.item not in ZERO_WRITTEN],
        }
        repeat = False  # the ipg buffer's fill differs layer by layer
    elif z3 is not None:  # DeepSpeed's partitions and buffers in place of the engine's
        _zero3_wrap(s, z3, first)
    elif not (per_param and weights_by_param(s, first, params)):
        s.items(first, numels)
    if reducer is not None:
        s.mark("DDP wrap")
        reducer.wrap()
    late = _autograd_workspaces(sg["overhead"])
    s.items([i for i in sg["overhead"] if i.item != WORKSPACE_ITEM])
    for i in sg["overhead"]:
        if i.item == WORKSPACE_ITEM and i.bytes > 0:  # the forward thread's, at the first forward
            s.alloc(i.bytes // max(i.tensors, 1), max(i.tensors, 1) - len(late))
    for step in range(1, steps + 1):
        if inb is not None:
            inb.first = step == 1
        a = earlier if step == 1 and earlier is not None else ag
        made_grads: list[int] = []
        held: list[int] = []
        if pipe is not None:  # the schedule's forwards and backwards (pp_stream)
            work = late if step == 1 else ()
            made_grads = run_schedule(
                s, pipe, a, sg, layers, step, grads, work, micro_forward, micro_backward, repeat, kept
            )
        bounds: list[tuple[int, int]] = []
        for m in range(1, max(micro, 1) + 1) if pipe is None else ():
            if m > 1:
                bounds.append(s.here())
            if schedule:
                a = schedule[((step - 1) * max(micro, 1) + m - 1) % len(schedule)]
            s.free(held)  # an earlier micro-batch's output the loop held: dropped as the next one starts
            grads.new = m > 1 or (kept and step > 1)
            if comm is not None:
                comm.u.micro(comm, m, micro)
            if grads.zero is not None:
                grads.zero.micro(m, max(micro, 1))
            label = f"step {step}" + (f" micro-batch {m}" if micro > 1 else "")
            if reducer is not None and step == 2 and m == 1 and reducer.b.rebuilt:
                s.mark(f"{label} DDP bucket rebuild")
                reducer.rebuild()
            work = late if step == m == 1 else ()
            made, held = micro_batch(s, a, sg, layers, label, grads, replayed, work, repeat, comm, off)
            made_grads = made_grads or made
        if bounds:
            s.micro_bounds.append([*bounds, s.here()])
        s.mark(f"step {step} optimizer step")
        if inb is None:  # else every parameter was stepped in backward
            _optimizer_step(s, grads, sg, step, later, numels, params, opt_groups, zero, z3)
        # zero_grad(set_to_none=True) drops the gradients in the parameters' order; zeroed in place, they stay
        s.free(held if kept else made_grads + held)
        if comm is not None:
            comm.zero_grad()
    return s


def _optimizer_step(
    s: StreamWriter,
    grads: _Grads | InBackwardGrads,
    sg: dict[str, Sequence[Any]],
    step: int,
    later: Sequence[Any],
    numels: tuple[int, ...],
    params: tuple[int, ...],
    opt_groups: tuple[tuple[int, ...], ...],
    zero: ZeroRank | None,
    z3: Zero3Writer | None = None,
) -> None:
    """The optimizer's step after backward (``step_stream``'s): its states made at the first step (``later``),
    its foreach temporaries made and freed last first; a ZeRO-1/2 rank's on its flat partition
    (``zero_stream.ZeroWriter.step``), a ZeRO-3 rank's on its sub groups' flat partitions
    (``zero3_stream.Zero3Writer.step``), a TP rank's per parameter group (``tp_stream.optimizer_groups``)."""
    if z3 is not None:
        z3.step(step == 1, per_element(later, z3.u), per_element(sg["step_temps"], z3.u))
    elif grads.zero is not None:
        grads.zero.step(
            step == 1, _per_element(later, numels, zero), _per_element(sg["step_temps"], numels, zero)
        )
    elif not opt_groups:
        if step == 1:
            s.per_param(later, params)
        s.free(s.per_param(sg["step_temps"], params)[::-1])  # the foreach step's lists, freed last first
    else:  # the optimizer's groups one after the other (tp_stream.optimizer_groups)
        parts = [tuple(params[j] for j in g) for g in opt_groups]
        larger = max(sum(p) for p in parts)  # the item is the larger group's foreach buffer
        for part in parts:
            if step == 1:
                s.per_param(later, part, params)
            s.free(s.per_param(sg["step_temps"], part, params, larger)[::-1])


def _zero_wrap(s: StreamWriter, zero: ZeroRank, first: Sequence[Any]) -> ZeroWriter:
    """A ZeRO-1/2 rank's weights (each parameter item's tensors, the norms' in the second optimizer group) and
    DeepSpeed's wrap (``zero_stream.ZeroWriter.wrap``); the other persistent items of ``first`` but the ipg
    buffer and the engine's master weights, which DeepSpeed's own buffers replace. Under LoRA
    (``ZeroRank.cast_from``) the frozen base's items stay and the adapters are written one tensor each, cast
    to the model's dtype at the wrap (``zero_lora.lora_cast``). The hooks' writer."""
    weights: list[list[int]] = [[] for _ in zero.groups]
    rest = []
    for i in first:
        if zero.cast_from and i.category == "parameters":  # LoRA: the frozen base stays; the adapters below
            rest += [] if i.item == ADAPTER_ITEM else [i]
        elif i.category == "parameters" and i.level in _POOLED:
            g = int(i.item == f"{NO_DECAY_KIND} weights") if len(zero.groups) > 1 else 0
            weights[g] += s.items([i])
        elif i.item not in ZERO_WRITTEN:
            rest.append(i)
    s.items(rest)
    made = [s.alloc(n * zero.cast_from) for g in zero.groups for n in g] if zero.cast_from else []
    s.mark("ZeRO wrap")
    if made:  # ``_cast_module_mixed_precision``: each adapter not in the model's dtype copied to it
        weights = [lora_cast(s, zero, made)]
    w = zero_writer(s, zero)  # zero_offload_stream.ZeroOffloadWriter when its optimizer is on the host
    w.wrap(weights)
    return w


def _zero3_wrap(s: StreamWriter, z3: Zero3Writer, first: Sequence[Any]) -> None:
    """A ZeRO-3 rank's wrap (``zero3_stream.Zero3Writer.wrap``: its weights, partitions and buffers), after the
    persistent items of ``first`` it does not replace (``zero3_stream.rest_of``)."""
    s.items(rest_of(first))
    s.mark("ZeRO-3 wrap")
    z3.wrap()


def _per_element(items: Sequence[Any], numels: tuple[int, ...], zero: ZeroRank | None) -> list[float]:
    """Bytes per element of each tensor the pooled ``items`` hold per parameter (an optimizer's states, its step
    temporaries), from their bytes over the rank's share of the parameters (ZeRO's partitions: the items are
    sharded over dp)."""
    total = sum(numels)
    out: list[float] = []
    for i in items:
        n = max(i.tensors, 1)
        if i.level in _POOLED and i.bytes > 0 and total and n % len(numels) == 0:
            k = n // len(numels)
            share = total / (zero.dp if zero else 1)
            out += [i.bytes / (k * share)] * k
    return out


def _autograd_workspaces(overhead: Sequence[Any]) -> list[int]:
    """The sizes of the cuBLAS workspaces the autograd thread makes at its first matmul
    (``overhead.AUTOGRAD_HANDLES`` of the workspaces' item; none when the item has a single handle)."""
    out: list[int] = []
    for i in overhead:
        n = max(i.tensors, 1)
        if i.item == WORKSPACE_ITEM and i.bytes > 0 and n > AUTOGRAD_HANDLES:
            out += [i.bytes // n] * AUTOGRAD_HANDLES
    return out


def micro_batch(
    s: StreamWriter,
    a: dict[str, Sequence[Any]],
    sg: dict[str, Sequence[Any]],
    layers: int,
    label: str,
    grads: _Grads | InBackwardGrads,
    replayed: int | None = None,
    workspaces: Sequence[int] = (),
    repeat: bool = True,
    comm: Fsdp2Writer | None = None,
    off: Offloader | None = None,
) -> tuple[list[int], list[int]]:
    """One micro-batch's forward, loss and backward (``step_stream``'s order): the gradients it made and
    keeps, in the parameters' order (none when it adds them in place), and the output the loop holds.
    ``workspaces``: the autograd thread's cuBLAS workspaces, made at the first backward matmul (the head's).
    Under FSDP2 (``comm``) its buffers come at the hooks FSDP2 runs them in and the gradients it makes are the
    unsharded ones, reduce-scattered per unit (``fsdp_stream.Fsdp2Writer`` keeps the shards); ``off``: the
    layers' saved tensors offloaded."""
    fw = micro_forward(s, a, layers, label, replayed, repeat, comm, off=off)
    return micro_backward(s, fw, sg, grads, workspaces)


@dataclass
class Forward:
    """What a micro-batch's forward left for its backward (``micro_forward``): the handles of its inputs, each
    layer's saved tensors, the head's, the loss's, the output the loop holds, and how the layers were written."""

    a: dict[str, Sequence[Any]]
    label: str
    layers: int
    n: int
    pre: list[int]
    saved: list[list[int]]
    d: int
    copied: bool
    compiled: bool
    post: list[int]
    tanh: list[int]
    cast: list[int]
    held: list[int]
    kept: list[int]
    copy: list[int]
    comm: Fsdp2Writer | None
    #: the offloader of the layers' saved tensors (``offload_stream.Offloader``), None when not offloaded
    off: Offloader | None
    #: the last layer's output when the forward keeps it (a pipeline stage's output, sent on): freed by its backward
    out: list[int]


def micro_forward(
    s: StreamWriter,
    a: dict[str, Sequence[Any]],
    layers: int,
    label: str,
    replayed: int | None = None,
    repeat: bool = True,
    comm: Fsdp2Writer | None = None,
    hidden_in: list[int] | None = None,
    keep_output: bool = False,
    drop: Sequence[int] = (),
    off: Offloader | None = None,
) -> Forward:
    """A micro-batch's forward and loss (``micro_batch``'s first half). ``hidden_in``: the layers' input when
    it is not the embeddings' output (a later pipeline stage's receive buffer: never freed here);
    ``keep_output``: the model's output (the last layer's, or on a stage with the head its logits) kept for the
    backward (a pipeline stage's output, ``Forward.out``); ``drop``: handles freed once the head has run;
    ``off``: the layers' saved tensors offloaded."""
    s.mark(f"{label} forward")
    if comm is not None:
        comm.forward_start()
    rotary = a.get(ROTARY_FORWARD, ())  # the positions kept until the layers have run, the rotary embedding's
    positions, pre = forward_layer(s, rotary, [], a["pre"], 1) if rotary else ([], s.items(a["pre"]))
    share = layers if off is None else off.start()  # offloaded: the saved group is the one layer on the GPU
    fwd = a.get(LAYER_FORWARD, ())
    out = next((size for name, size in fwd if name == OUT), 0)
    if hidden_in is not None:
        hidden: list[int] = []
    else:  # the embeddings' output (compiled: a saved tensor, no transient)
        hidden = s.alloc(out) if out else []
    saved: list[list[int]] = []
    # the layers' HELD buffers (the returned KV cache's fp32 k): freed as the forward ends; a layer's LATER
    # buffers: freed after the next saved term (the next layer's input or the final norm's)
    cache: list[int] = []
    pending: list[int] = []
    n = layers if replayed is None else replayed
    compiled = any(tangent_role(i.item) for i in a["loss_backward"])
    # a compiled backward frees zero gradients made at its top, layer by layer; FSDP2's writer follows each layer
    repeat = repeat and not compiled and comm is None
    begin = s.here()
    for i in range(min(n, 2) if repeat else n):  # identical layers: the third on are the second's copies
        begin = s.here() if i == 1 else begin
        if comm is not None:
            comm.layer_forward_start()
        # a checkpointed layer's forward: dropped but its input (written op by op where its recompute is)
        transient = [] if a.get(LAYER_RECOMPUTE) else s.items(a["recompute"])
        steps = (a.get(FIRST_LAYER_FORWARD) or fwd) if i == 0 else fwd
        hidden, kept = _layer_saved(s, steps, hidden, a["saved"], share, off, cache, pending, i == 0)
        saved.append(kept)
        s.free(transient)
        if comm is not None:
            comm.layer_forward_end()
    d, copied = 0, repeat and n > 2
    if copied:  # the second layer freed the first's output: the copies free their predecessor's
        d = s.repeat(begin, n - 2)
        saved += [[h + k * d for h in saved[1]] for k in range(1, n - 1)]
        hidden = [h + (n - 2) * d for h in hidden]
    fin = a.get(FINAL_NORM, ())
    at = len(s.events)
    post = forward_layer(s, fin, [], a["post"], 1)[1] if fin else s.items(a["post"])
    # a LATER buffer: freed once the final norm's first saved tensor (the last layer's output) is made
    if pending:
        rest = s.events[at + 1 :]
        del s.events[at + 1 :]
        s.free(pending)
        s.events += rest
    s.free(positions)
    last = bool(a["loss_forward"])
    kept_out = hidden if keep_output and not last else []
    if not kept_out:
        s.free(hidden)  # the last layer's output, once the final norm has read it
    s.mark(f"{label} loss")
    if not last:  # the stage's output is the last layer's: made, so the loop's earlier one is dropped
        s.free(drop)
    # the head's softcapping runs before the loss: its tanh output comes before the logits' upcast
    capped = [i for i in a["loss_saved"] if i.item.startswith(SOFTCAP_SAVED)]
    tanh = s.items(capped)
    cast, held, kept, copy = _loss_forward(s, a, capped, comm, keep_output and last, drop if last else ())
    if keep_output and last:  # the logits, the model's output: the first tensor the loss's forward made
        kept_out, held = held[:1], held[1:]
    s.free(cache[::-1])
    return Forward(a, label, layers, n, pre, saved, d, copied, compiled, post, tanh, cast, held, kept, copy, comm,
                   off, kept_out)  # fmt: skip


def micro_backward(
    s: StreamWriter,
    fw: Forward,
    sg: dict[str, Sequence[Any]],
    grads: _Grads | InBackwardGrads,
    workspaces: Sequence[int] = (),
    handed: list[int] | None = None,
) -> tuple[list[int], list[int]]:
    """A micro-batch's backward from what its forward left (``micro_batch``'s second half): the gradients it
    made and keeps, and the output the loop holds. ``handed``: gets the bottom layer's input gradient, not freed
    (a later pipeline stage's, which it sends; left empty where the layers' backward is not op by op)."""
    a, label, layers, n, saved, d = fw.a, fw.label, fw.layers, fw.n, fw.saved, fw.d
    copied, comm = fw.copied, fw.comm
    tanh, post, kept = fw.tanh, fw.post, fw.kept
    order = grads.order
    by_tensor = grads.by_tensor
    outside = comm is not None and comm.u.loss_outside
    s.mark(f"{label} loss backward")
    if comm is not None and not outside:
        comm.backward_start(len(saved))
    # a compiled step's zero gradients of the returned KV cache, freed layer by layer
    tangents: list[int] = []
    if fw.compiled:
        tangents, grad_logits = compiled_loss_backward(s, a["loss_backward"], kept)
    else:
        grad_logits = _loss_backward(s, a["loss_backward"], fw.cast, kept, fw.copy)
        if a.get(HEAD_GATHER):  # TP's gathered logits: the gradient cut back to the rank's columns
            grad_logits = scatter_gradient(s, grad_logits, a[HEAD_GATHER][0])
    if comm is not None and outside:
        comm.backward_start(len(saved))
    s.mark(f"{label} backward")
    if comm is not None:  # FSDP2: the gradients it keeps are its reduce-scatter outputs
        comm.backward(a, saved, grad_logits + tanh + post, workspaces)
        return [], _inputs_freed(s, a, fw.pre, fw.held)
    k = order.top_pre if order and by_tensor else 0
    new, zero = grads.new, grads.zero
    top_grads = _top_grads(s, grads, order, k) if order and by_tensor else []
    for size in workspaces:  # never freed: among the loss's freed buffers (overhead.AUTOGRAD_HANDLES)
        s.alloc(size)
    top, post = _final_norm_backward(s, a, post, grad_logits + tanh)  # after the head's matmuls
    # by tensor the head's are top_grads; under accumulation the state groups' head_grads are the carried ones
    head = [] if by_tensor or new else s.items(sg["head_grads"])
    ends = top + post
    keep = a.get(KEPT_TOP, ())
    if keep:  # a compiled step's top (no op-by-op final norm): head_read, then the top_backward items
        ends = top[len(grad_logits) + len(tanh) :] + post
    kept_top = [ends[i] for i in keep if i < len(ends)]  # read by the bottom's kernel
    s.free([h for h in top + post if h not in kept_top])
    if zero is not None:  # the head's hook, once its node has dropped the logits' gradient
        zero.each(top_grads[k:])
        top_grads = top_grads[:k]
    received = not a["loss_forward"]  # a pipeline stage without the head: its output's gradient is received
    copies = (n, d) if copied else None
    top_n = sum(1 for i in keep if i < len(ends) - len(post))  # of the kept, the top's gradients
    bottom = (kept_top[:top_n], kept_top[top_n:]) if a.get(BOTTOM_ORDER) else None
    at_top = kept_top if bottom is None else []
    layer_grads = _layers_backward(
        s, a, saved, grads, layers, tangents, copies, fw.off, received, bottom, at_top, handed
    )
    f = a.get(EMBEDDING_GRAD, (1,))[0] if by_tensor else 1  # TP: the vocab-sharded embedding's full gradient
    bottom_grads = grads.made(tuple(x * f for x in order.bottom) if order else (), layers + 2)
    if k:  # tied embeddings: their backward's gradient, summed out of place with the head's (traced)
        emb = [h for x in top_grads[:k] for h in s.alloc(s.size(x) * f)]
        summed = [h for x in top_grads[:k] for h in s.alloc(s.size(x))]
        s.free(top_grads[:k] + emb)
        top_grads = summed + top_grads[k:]
        if zero is not None:  # the tied embeddings' gradient complete: DeepSpeed's hook
            zero.each(summed)
            top_grads, k = top_grads[k:], 0
        if isinstance(grads, InBackwardGrads):  # the tied weight's hook, once its two parts are summed
            new = grads.hook(order.top[:k])
        if new:  # added in place to the accumulated gradient, or stepped by its hook: dropped
            s.free(summed)
            top_grads = top_grads[k:]
            k = 0
    if zero is not None:  # after the last gradient: DeepSpeed's epilogue
        zero.epilogue()
    held = _inputs_freed(s, a, fw.pre, fw.held)
    by_layer = [h for hs in reversed(layer_grads) for h in hs]
    return top_grads[:k] + bottom_grads + by_layer + top_grads[k:] + head, held


def _final_norm_backward(
    s: StreamWriter, a: dict[str, Sequence[Any]], post: list[int], head_read: list[int]
) -> tuple[list[int], list[int]]:
    """The final norm's backward: op by op where ``a[FINAL_NORM_BACKWARD]`` lists it (``activations/eager_steps``:
    its buffers made and freed in order, ``post``'s saved tensors freed where it says, ``head_read`` (the logits'
    gradient) at ``HEAD_DONE``), else the ``top_backward`` items. (What the caller frees next, in order:
    ``head_read`` and the items, or the buffers still alive; the saved tensors alive.)"""
    steps = a.get(FINAL_NORM_BACKWARD, ())
    if not steps or len(post) != NORM_SAVED:
        return head_read + s.items(a["top_backward"]), post
    kept = dict(enumerate(post))
    return _run_steps(s, steps, kept, head_read), list(kept.values())


def _run_steps(
    s: StreamWriter, steps: Sequence[Step], kept: dict[int, int], head_read: Sequence[int] = ()
) -> list[int]:
    """Write ``steps`` (name, bytes: bytes > 0 allocates ``name``, 0 frees it; ``FREE_SAVED`` + i frees ``kept``'s
    i-th and drops it; ``HEAD_DONE`` frees ``head_read``): the handles still alive after them."""
    live: dict[str, list[int]] = {}
    for name, size in steps:
        if name == HEAD_DONE:
            s.free(head_read)
        elif name.startswith(FREE_SAVED):
            s.free([kept.pop(int(name[len(FREE_SAVED) :]))])
        elif size > 0:
            live[name] = s.alloc(size)
        else:
            s.free(live.pop(name))
    return [h for hs in live.values() for h in hs]


def _top_grads(s: StreamWriter, grads: _Grads | InBackwardGrads, order: GradOrder, k: int) -> list[int]:
    """The gradients of the output side (``order.top``; its first ``k`` the tied embeddings, whose head part waits
    in autograd's buffer, kept or not). Under ZeRO whole, in the model's dtype, their hooks run by the caller:
    the head's AccumulateGrad runs once the head's node has dropped the logits' gradient, the tied embeddings'
    once their two parts are summed."""
    if grads.zero is not None:
        return [h for x in order.top for h in s.alloc(x * grads.zero.z.model_bytes)]
    new, grads.new = grads.new, False
    out = grads.made(order.top[:k], 1, hold=True) if k else []
    grads.new = new
    return out + grads.made(order.top[k:], 1)


def _layer_saved(
    s: StreamWriter,
    fwd: Sequence[Step],
    hidden: list[int],
    saved: Sequence[Any],
    share: int,
    off: Offloader | None,
    held: list[int] | None = None,
    pending: list[int] | None = None,
    first: bool = False,
) -> tuple[list[int], list[int]]:
    """A layer's forward (``forward_layer`` where its transients are listed, else its ``share`` of the ``saved``
    items; ``first``: layer 0's): its output and the saved tensors it leaves on the GPU (none when offloaded:
    ``off``); its ``HELD`` buffers added to ``held``, its ``LATER`` ones to ``pending``."""
    if fwd:
        hidden, kept = forward_layer(s, fwd, hidden, saved, share, held, pending, first)
    else:
        kept = s.items(saved, share=share, first=first)
    return hidden, kept if off is None else off.away(kept)


def _inputs_freed(s: StreamWriter, a: dict[str, Sequence[Any]], pre: list[int], held: list[int]) -> list[int]:
    """The end of a micro-batch's backward: its inputs (``pre``) freed, and the output the loop held unless it
    holds it through the optimizer step; what is still held."""
    s.free(pre)
    if a["held_through_step"]:
        return held
    s.free(held)
    return []


def _loss_forward(
    s: StreamWriter,
    a: dict[str, Sequence[Any]],
    capped: list[Any],
    comm: Fsdp2Writer | None,
    keep_logits: bool = False,
    drop: Sequence[int] = (),
) -> tuple[list[int], list[int], list[int], list[int]]:
    """The loss's forward (``micro_batch``'s order): the logits and their upcast, the output the loop holds, what
    the loss saves (but ``capped``, made before), the logits freed; the handles of the 16-bit logits an upcast
    loss's backward casts its gradient back to, of the held output, of the saved tensors and (CUDA autocast's
    cross-entropy on 16-bit logits) of nll_loss's fp32 copy of the log-softmax, made after them (``keep_logits``:
    the logits, first, among the held output's handles and not freed: a pipeline's output). Under FSDP2
    (``comm``) the root's post-forward runs once the model has returned: before a loss computed outside the model
    upcasts its logits (torchtitan), after a loss computed inside it. ``drop``: freed once the logits are made (a
    pipeline's last stage: the schedule loop's earlier output, released as ``forward_one_chunk`` returns the new
    one, before the loss upcasts it; traced). Loss parallel's shifted logits: freed once the log-softmax is made
    (activations/loss.loss_parallel_terms)."""
    outside = comm is not None and comm.u.loss_outside
    logits: list[int] = []
    shifted: list[int] = []
    cast: list[int] = []
    gather = a.get(HEAD_GATHER, ())
    for i in a["loss_forward"]:
        at = len(s.events)
        made = s.items([i])
        if gather and not logits and made:  # TP's head gathers the logits (tp_stream)
            gather_logits(s, at, gather[0])
            at += 4  # the logits after the local logits and the gather's output, which are freed then
        cast += made[:1] if _upcast([i]) and not cast else []
        if comm is not None and outside and not logits and made:  # the model's output (the first tensor)
            rest = s.events[at + 1 :]
            del s.events[at + 1 :]
            comm.forward_end()
            s.events += rest
        if drop and not logits and made:  # after the logits, before their upcast
            rest = s.events[at + 1 :]
            del s.events[at + 1 :]
            s.free(drop)
            s.events += rest
            drop = ()
        if i.item.startswith(LOSS_PARALLEL_SHIFTED):  # freed once the saved log-softmax is made
            shifted += made
        else:
            logits += made
    saved = [i for i in a["loss_saved"] if i not in capped]
    apart = bool(saved) and saved[0].item.startswith(COMPILED_APART)  # the logits: saved by a compiled loss
    if (
        comm is not None and outside and not logits and not apart
    ):  # no logits made: the post-forward still runs
        comm.forward_end()
    s.free(drop)
    held = s.items(a["held_logits"]) + s.items(a["held_cache_extra"])
    at = len(s.events)
    kept, copy = _loss_saved(s, saved)
    if comm is not None and outside and apart:  # the model has returned its logits: the root's post-forward
        rest = s.events[at + 1 :]
        del s.events[at + 1 :]
        comm.forward_end()
        s.events += rest
    s.free(shifted)
    if keep_logits:
        held, logits = logits[:1] + held, logits[1:]
    s.free(logits)
    if comm is not None and not outside:
        comm.forward_end()
    return cast, held, kept, copy


def _loss_saved(s: StreamWriter, saved: Sequence[Any]) -> tuple[list[int], list[int]]:
    """What the loss saves (``saved``), made as its forward makes it: the handles of the saved tensors and, apart,
    of nll_loss's fp32 copies of a 16-bit log-softmax (CUDA autocast's cross-entropy on 16-bit logits,
    activations/loss.autocast_ce_saved). A loss of n calls (litgpt's chunked_cross_entropy: a copy item of n
    tensors) makes each call's log-softmax (the item listed before the copy) then its copy, call by call."""
    copies = [i for i in saved if i.item.startswith(NLL_FP32_COPY)]
    n = max(copies[0].tensors, 1) if copies else 1
    if n == 1:
        return s.items([i for i in saved if i not in copies]), s.items(copies)
    logp = saved[saved.index(copies[0]) - 1]
    kept: list[int] = []
    copy: list[int] = []
    for _ in range(n):
        kept += s.items([logp], share=n)
        copy += s.items(copies[:1], share=n)
    return kept + s.items([i for i in saved if i is not logp and i not in copies]), copy


def _loss_backward(
    s: StreamWriter, items: Sequence[Any], cast: list[int], kept: list[int], copy: list[int]
) -> list[int]:
    """An eager loss's backward from its buffers (``items``) and what its forward saved (``kept``; ``copy``:
    nll_loss's fp32 copies of a 16-bit log-softmax, one per call, each paired with the saved tensor of the same
    place in ``kept``), freeing them as autograd does; the logits' gradient it leaves (``cast``: the 16-bit logits
    an upcast loss casts its gradient back to), empty where the stream omits it."""
    if copy:  # CUDA autocast's cross-entropy on 16-bit logits (activations/loss.autocast_ce_backward)
        grad_logits: list[int] = []
        for c, logp in reversed(list(zip(copy, kept, strict=False))):  # the last call's backward first
            grad_out = s.items(items)  # nll_loss's fp32 gradient of one call
            s.free([c])  # the fp32 copy it saved is freed
            back = s.alloc(s.size(logp))  # the gradient cast back to the log-softmax's 16-bit dtype
            s.free(grad_out)
            grad_logits += s.alloc(s.size(logp))  # log-softmax's backward: the call's logits' gradient
            s.free(back + [logp])
        s.free(kept[len(copy) :])
        return grad_logits
    if items and items[0].item.startswith(LOSS_PARALLEL_BACKWARD):
        return _loss_parallel_backward(s, items, cast, kept)
    if items and items[0].item.startswith(COMPILED_APART):
        # a loss compiled apart (activations/loss.compiled_apart_terms): Inductor's joint-graph pass fuses nll_loss's
        # fp32 buffer into the kernel that writes the logits' gradient, which reads the saved logits (alive until
        # it has run: codegen/wrapper.py frees a buffer after its last kernel)
        grad_logits = s.alloc(s.size(kept[0]))
        s.free(kept)
        return grad_logits
    grad_out = s.items(items)
    s.free(grad_out[:1] + kept)  # nll_loss's gradient, then the saved log-softmax
    # an upcast loss: the logits' gradient cast back to their dtype while log-softmax's is alive
    grad_logits = s.alloc(s.size(cast[0])) if cast else []
    s.free(grad_out[1:])
    return grad_logits


def _loss_parallel_backward(
    s: StreamWriter, items: Sequence[Any], cast: list[int], kept: list[int]
) -> list[int]:
    """Loss parallel's fused nll + log-softmax backward (activations/loss.loss_parallel_terms): ``grad_input =
    zeros_like(x)``, ``exp(x)``, their sum (the exp freed), the sum times the loss's gradient (the sum and
    ``grad_input`` freed as the kernel returns); the saved log-softmax freed once log-softmax's node has run,
    then the gradient cast back to the logits' dtype (``cast``) and the fp32 one freed."""
    zeros, exp, total = s.items(items)
    s.free([exp])
    grad = s.alloc(s.size(total))
    s.free([total, zeros] + kept)
    grad_logits = s.alloc(s.size(cast[0])) if cast else []
    s.free(grad)
    return grad_logits


def compiled_loss_backward(
    s: StreamWriter, items: Sequence[Any], kept: list[int]
) -> tuple[list[int], list[int]]:
    """The top of a compiled backward as Inductor runs it (``engine/activations/tangents``; docs/allocator.md):
    AOTAutograd's zero gradients of the returned KV cache (layer 0's first) and of the logits; nll_loss's gradient
    buffer (``LOSS_GRADIENT``) is never made (Inductor's joint-graph pass fuses it), so one kernel writes the logits'
    gradient (a new buffer of the logits' size) reading the saved logits (``kept``, with their row statistics) and
    the logits' zero gradient, which are freed after it. A loss-backward buffer of another name (GPT-2's rule) is
    made first and freed with what the loss saved before the logits' gradient, as the default trace orders it. The
    handles of the KV cache's zero gradients (each layer's backward frees its own) and of the logits' gradient."""
    tangents = s.items([i for i in items if tangent_role(i.item) == CACHE_TANGENTS])
    zero = s.items([i for i in items if tangent_role(i.item) == LOGITS_TANGENT])
    buffer = s.items([i for i in items if not tangent_role(i.item)])
    fused = any(tangent_role(i.item) == LOSS_GRADIENT for i in items)
    if not fused:
        s.free(buffer + kept)
    grad_logits = [h for x in zero for h in s.alloc(s.size(x))]
    s.free((buffer + kept if fused else []) + zero)
    return tangents, grad_logits


def _layers_backward(
    s: StreamWriter,
    a: dict[str, Sequence[Any]],
    saved: list[list[int]],
    grads: _Grads | InBackwardGrads,
    layers: int,
    tangents: list[int],
    copies: tuple[int, int] | None,
    off: Offloader | None = None,
    received: bool = False,
    at_bottom: tuple[list[int], list[int]] | None = None,
    kept: Sequence[int] = (),
    handed: list[int] | None = None,
) -> list[list[int]]:
    """The layers' backward from the top (``micro_batch``'s): per layer the recompute, its backward buffers (a
    compiled layer's op by op, ``backward_layer``; else the ``layer_backward`` items) and its gradients, its
    ``saved`` tensors and its k and v zero ``tangents`` freed; ``copies``: (layers, the forward's handle shift)
    where the third layer on are the second's copies; ``off``: the saved tensors brought back from the host
    first; ``received``: the top layer's arriving gradient is a pipeline stage's receive buffer, read in place
    (``eager_steps.ARRIVING`` not written for it); ``at_bottom``: the top's kept gradients and saved tensors
    (``KEPT_TOP``), freed with the buffers kept to the bottom in the trace's order (``_bottom_freed``); ``kept``:
    the top's kept buffers freed with those kept to the bottom, where a layer's steps free them (``RELEASE`` +
    ``KEEP``) or after the bottom layer; ``handed``: gets the bottom layer's input gradient (``INPUT_GRADIENT``),
    not freed, where the layers are written one by one (no ``copies``). Each layer's gradients' handles, from the
    top."""
    order = grads.order
    layer_grads: list[list[int]] = []
    begin = s.here()
    bwd = a.get(LAYER_BACKWARD, ())
    bottom = a.get(BOTTOM_LAYER_BACKWARD, ()) or bwd
    # a compiled backward's buffers all layers use
    shared: dict[str, list[int]] = {f"{KEEP}top": list(kept)} if kept else {}
    for i, layer in enumerate(saved[::-1][:2] if copies else saved[::-1]):
        begin = s.here() if i == 1 else begin
        layer = layer if off is None else off.back(len(saved) - 1 - i)
        recomputed = s.items(a["recompute"])
        mine: list[int] = []
        if bwd:  # its own buffers, op by op; of the items only CUDA's scratch
            part = order.layer if order else ()
            steps = bottom if i == len(saved) - 1 and not copies else bwd
            if received and i == 0:
                steps = [st for st in steps if st[0] != ARRIVING]
            cuda = [x for x in a["layer_backward"] if x.level == "allocator"]
            # made where SDPA's kernel runs (eager_steps.CUDA_SCRATCH); a compiled layer's: for the whole layer
            at_kernel = any(st[0] == CUDA_SCRATCH for st in steps)
            transient = [] if at_kernel else s.items(cuda)
            # a checkpointed layer's saved tensors are its recompute's (activations/eager_steps); its input last
            own = recomputed or layer
            # the layer's k and v zero gradients
            mine = [tangents.pop() for _ in range(min(2, len(tangents)))]
            out = handed if i == len(saved) - 1 and not copies else None
            layer_grads.append(
                backward_layer(
                    s, steps, own, shared, grads, part, layers, mine, cuda if at_kernel else (), out
                )
            )
            layer, recomputed = ([], []) if own is layer else (layer, [])
        else:
            transient = s.items(a["layer_backward"])
            layer_grads.append(grads.made(order.layer if order else (), layers + 2))
            if a.get(LAYER_NORM_BACKWARD):  # the gradients' items released, its two norms' backward op by op
                s.free(transient)
                transient = [h for _ in range(2) for h in _run_steps(s, a[LAYER_NORM_BACKWARD], {})]
        s.free(transient + recomputed + layer)
        # the layer's k and v zero gradients (a compiled layer's: those its steps did not free)
        s.free(mine if bwd else [tangents.pop() for _ in range(min(2, len(tangents)))])
    s.free(_bottom_freed(shared, at_bottom) if at_bottom else [h for hs in shared.values() for h in hs])
    if copies:  # the copies free the saved tensors of the layer below: handles allocated d earlier each
        n, d = copies
        db = s.repeat(begin, n - 2, lowest=begin[1], back=d)
        layer_grads += [[h + k * db for h in layer_grads[1]] for k in range(1, n - 1)]
    return layer_grads


def _bottom_freed(shared: dict[str, list[int]], bottom: tuple[list[int], list[int]]) -> list[int]:
    """The buffers kept to the bottom (``shared``, in the order the layers made them, and the top's ``bottom``:
    gradients, saved tensors) in the order the kernel at the bottom frees them (a compiled autocast trace): the
    shared buffers first, then the saved tensors from the bottom layer's up (each layer's ``KEEP_SAVED`` steps are
    listed last first) and the top's, then the gradients from the top's down, and among them, where the layer kept
    it, each saved tensor kept ``LATE``."""
    keys = list(shared)
    kept = [k for k in keys if k.startswith(KEEP_SAVED) and LATE not in k]
    grads = [k for k in keys if k.startswith(KEEP) and k not in kept]
    rest = [k for k in keys if not k.startswith(KEEP)]
    saved = [h for k in kept[::-1] for h in shared[k]] + bottom[1]
    return [h for k in rest for h in shared[k]] + saved + bottom[0] + [h for k in grads for h in shared[k]]


def backward_layer(
    s: StreamWriter,
    steps: Sequence[Step],
    saved: list[int],
    shared: dict[str, list[int]],
    grads: _Grads | InBackwardGrads,
    part: tuple[int, ...],
    layers: int,
    tangents: list[int] | None = None,
    scratch: Sequence[Any] = (),
    handed: list[int] | None = None,
) -> list[int]:
    """A compiled layer's backward written as ``engine/activations/compiled_backward`` lists it: its buffers
    allocated and freed in order, its ``saved`` tensors freed where ``FREE_SAVED`` says (the rest at the end), its
    KV cache's zero gradients (``tangents``: k's, v's) freed from the last where ``TANGENT`` says,
    each of the layer's gradients (``grads.made`` of ``part``'s tensor) at its ``GRADS`` step, each ``CONSTANT`` buffer made once into
    ``shared`` (the caller frees them after the last layer), the ``scratch`` items (CUDA's) made and freed at the
    ``CUDA_SCRATCH`` step (``eager_steps``), the layer's input gradient added to ``handed`` instead of freed;
    the gradients' handles."""
    live: dict[str, list[int]] = {}
    made: dict[int, list[int]] = {}
    kept = dict(enumerate(saved))
    one = grads.by_tensor and bool(part)  # else the layer's share, at the first gradient step
    for name, size in steps:
        if name == TANGENT:
            s.free([tangents.pop()] if tangents else [])
        elif name == CUDA_SCRATCH:  # alive only while SDPA's backward kernel runs
            s.free(s.items(scratch))
        elif name.startswith(GRADS):
            i = int(name[len(GRADS) :]) if one else -1
            if i not in made and i < len(part):
                made[i] = grads.made((part[i],) if one else part, layers + 2)
        elif name.startswith(FREE_SAVED):
            s.free([kept.pop(int(name[len(FREE_SAVED) :]))] if int(name[len(FREE_SAVED) :]) in kept else [])
        elif name == f"{RELEASE}{KEEP}":  # the kernel at the bottom has run: what was kept for it freed
            for k in [k for k in shared if k.startswith(KEEP)]:
                s.free(shared.pop(k))
        elif name.startswith(RELEASE):
            s.free(shared.pop(name[len(RELEASE) :], []))
        elif name.startswith(CONSTANT):
            if name not in shared:
                shared[name] = s.alloc(size)
        elif name.startswith(KEEP_SAVED):  # a saved tensor kept to the bottom
            i = int(name[len(KEEP_SAVED) :].split()[0])
            if i in kept:
                shared[f"{name} {len(shared)}"] = [kept.pop(i)]
        elif name.startswith(KEEP):  # kept to the bottom: freed with the shared buffers
            shared[f"{name} {len(shared)}"] = s.alloc(size)
        elif size > 0:
            live[name] = s.alloc(size)
        elif name == INPUT_GRADIENT and handed is not None:
            handed += live.pop(name)
        else:
            s.free(live.pop(name))
    s.free(list(kept.values()))  # any the steps do not name
    for i in range(len(part) if one else 0):  # any the steps do not name
        if i not in made:
            made[i] = grads.made((part[i],), layers + 2)
    if not made:
        made[-1] = grads.made(part, layers + 2)
    return [h for i in sorted(made) for h in made[i]]  # in the parameters' order


def forward_layer(
    s: StreamWriter,
    steps: Sequence[Step],
    hidden: list[int],
    saved: Sequence[Any],
    layers: int,
    held: list[int] | None = None,
    pending: list[int] | None = None,
    first: bool = False,
) -> tuple[list[int], list[int]]:
    """A layer's forward written as ``engine/activations/forward`` lists it: its transients allocated and freed
    in order, its share of the ``saved`` items (``layers`` layers; ``first``: layer 0's) where it says (all at
    once, or term by term),
    its input ``hidden`` freed
    when it returns, its ``HELD`` buffers added to ``held`` (freed by the caller when the forward ends), its
    ``LATER`` ones to ``pending`` (freed after the next saved term, here or in the next layer); the handles of its
    output and of its saved tensors."""
    live: dict[str, list[int]] = {}
    kept: list[int] = []
    at = 0  # the saved terms made so far: (SAVED, n) makes the next n, (SAVED, -1) the rest
    sizes: list[int] = []
    placed: dict[int, int] = {}  # SAVED_AT + p: the saved tensor at place p, made op by op
    for name, size in steps:
        if name in (SAVED, SAVED_BYTES):
            n = len(saved) - at if size < 0 else size
            kept += (
                s.alloc(size)
                if name == SAVED_BYTES
                else s.items(saved[at : at + n], share=layers, first=first)
            )
            at += 1 if name == SAVED_BYTES else n
            if pending:
                s.free(pending)
                pending.clear()
        elif name.startswith(LATER) and pending is not None:
            pending += live.pop(name[len(LATER) :])
        elif name.startswith(SAVED_AT):
            p = int(name[len(SAVED_AT) :])
            if size <= 0:
                sizes = sizes or tensor_sizes(saved, share=layers, first=first)
            placed[p] = s.alloc(size if size > 0 else sizes[p])[0]
        elif name == IN:
            s.free(hidden)
        elif name.startswith(HELD) and held is not None:
            held += s.alloc(size)
        elif size > 0:
            live[name] = s.alloc(size)
        else:
            s.free(live.pop(name))
    return live.pop(OUT, []), kept + [placed[p] for p in sorted(placed)]


def _upcast(loss_forward: Sequence[Any]) -> bool:
    """Whether the loss upcasts the logits (its forward term lists the logits and their fp32 copy)."""
    return any(len(getattr(i, "shares", ())) == 2 and i.bytes > 0 for i in loss_forward)


def replay_stream(stream: StreamWriter, conf: AllocatorConf, every_event: bool = False) -> PoolReplay:
    """Replay ``stream`` on an unlimited card: the peaks, where reserved peaked and what was cached then (the
    phase of the allocation after which reserved last rose, ``CachingAllocator.run``'s ``peak_event``).
    ``every_event``: no micro-batch skipped (``_run_micro_batches``; the same figures, the tests hold them)."""
    a = CachingAllocator(None, conf)
    if every_event:
        a.run(stream.events)
    else:
        _run_micro_batches(a, stream)
    j = bisect_right([n for n, _ in stream.marks], a.peak_event) - 1
    at = stream.marks[j][1] if j >= 0 and a.peak_event >= 0 else ""
    return PoolReplay(
        a.peak_reserved,
        a.peak_allocated,
        at,
        a.largest_at_peak(),
        a.segments,
        len(stream.events),
        a.peak_requested,
    )


def _run_micro_batches(a: CachingAllocator, stream: StreamWriter) -> None:
    """``a.run(stream.events)``, the same figures, faster under gradient accumulation: where a step's
    micro-batches from the third on (to the last, or the one before: FSDP2's last differs) are copies of each
    other (the same events, each copy's own handles, those after the second micro-batch began, shifted by the
    handles one allocates: checked event by event) and the allocator is in the same state at the start of the
    third and of the fourth (reserved, the segments, the cached blocks and the live blocks by address, the
    copies' live handles by their place after the handle counter), every later copy replays as the third did:
    nothing new is cached and no counter rises past its peak, so they are skipped and the live copies' handles
    moved to the last one's. Elsewhere (other settings than the fast path's, expandable segments, copies that
    differ, a state that changed) every event is replayed."""
    ev = stream.events
    ints = cast("list[tuple[int, int, int]]", ev)  # the writer's handles are ints
    pos = 0
    for bounds in stream.micro_bounds if a.skippable else ():
        copies = len(bounds) - 1  # micro-batches 2..M
        if copies < 3 or bounds[0][0] < pos:
            continue
        # the third micro-batch on (the second frees the first's output, which is not a copy's), as far as the
        # copies go (the last micro-batch may differ: FSDP2 reduce-scatters after it)
        lo, d = bounds[0][1], bounds[2][1] - bounds[1][1]
        n = bounds[2][0] - bounds[1][0]
        third = ints[bounds[1][0] : bounds[2][0]]
        last = 1  # copies 1..last (of 0..copies-1) are the third micro-batch's
        for k in range(2, copies):
            if bounds[k + 1][0] - bounds[k][0] != n or bounds[k + 1][1] - bounds[k][1] != d:
                break
            if ev[bounds[k][0] : bounds[k + 1][0]] != [
                (h + (k - 1) * d if h > lo else h, z, st) for h, z, st in third
            ]:
                break
            last = k
        if last < 2:
            continue
        a.run_from(ev, pos, bounds[1][0])
        before = a.state(lo, bounds[1][1])
        a.run_from(ev, bounds[1][0], bounds[2][0])
        pos = bounds[2][0]
        if a.state(lo, bounds[2][1]) != before:
            continue
        shift = (last - 1) * d  # the third's trajectory, last - 1 more times: skipped
        a.shift_live(lo, shift)
        pos = bounds[last + 1][0]
    a.run_from(ev, pos, len(ev))


@dataclass(frozen=True)
class StreamAsks:
    """What an unlimited replay of a stream asks for, read off its events without the allocator (``asks``)."""

    #: the peak of the bytes requested: ``PoolReplay.peak_requested`` (a request counts from its allocation to
    #: its free, whatever block serves it)
    peak_requested: int
    #: a bound on its peak reserved (None under expandable segments, which map pages instead of segments)
    reserved_bound: int | None


def asks(stream: StreamWriter, conf: AllocatorConf) -> StreamAsks:
    """``StreamAsks`` of ``stream``: the requested bytes' peak, counted as ``CachingAllocator`` counts them (a
    handle allocated again replaces the first in ``live``: only the second is subtracted at its free), and a
    bound on reserved. On an unlimited card nothing is released (a release follows a failed cudaMalloc, garbage
    collection needs a memory fraction of a capacity), so reserved is at most the segments the allocations
    would make each: ``allocation_size(round_size(n))`` <= 2 n + 512 B + 20 MiB (``round_size`` at most
    doubles, or adds under 512 B; a new segment adds at most 20 MiB)."""
    req: dict[Any, int] = {}
    requested = peak = total = count = 0
    for h, size, _ in stream.events:
        if size == FREE:
            n = req.pop(h, None)
            if n is not None:
                requested -= n
        elif size > 0:
            req[h] = size
            requested += size
            total += size
            count += 1
            if requested > peak:
                peak = requested
    bound = None if conf.expandable_segments else 2 * total + count * (MIN_BLOCK + LARGE_BUFFER)
    return StreamAsks(peak, bound)


def stream_asks(ctx: Any, stage: Any) -> StreamAsks:
    """``asks`` of ``stage``'s rank of ``ctx`` (its stream reused while among the last built), cached per shape as
    ``pool_replay`` is: where the requested bytes alone exceed a card's room, the planner needs no replay."""
    from memsim_widget.engine.caches.parts_cache import activations_key, state_groups_key
    from memsim_widget.engine.frameworks import allocator_conf

    conf = allocator_conf(ctx)
    key = (state_groups_key(ctx.scenario), activations_key(ctx.scenario), stage, conf)
    return _asks_cached(ReplayArgs(key, (ctx, stage, conf)))


@lru_cache(maxsize=4096)
def _asks_cached(args: ReplayArgs) -> StreamAsks:
    ctx, stage, conf = args.args
    args.args = ()
    return asks(built_stream(args.key[:3], ctx, stage), conf)


class ReplayArgs:
    """The replay's inputs, compared by ``key`` alone (the cache computes from the first it sees)."""

    __slots__ = ("args", "key")

    def __init__(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> None:
        self.key, self.args = key, args

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReplayArgs) and self.key == other.key


def pool_replay(ctx: Any, stage: Any) -> PoolReplay:
    """The replay of ``stage``'s rank of ``ctx``: its steps' stream built from the engine's cached groups,
    cached by the groups' shape keys, the stage and the allocator settings."""
    from memsim_widget.engine.caches.parts_cache import activations_key, state_groups_key
    from memsim_widget.engine.frameworks import allocator_conf

    conf = allocator_conf(ctx)
    key = (state_groups_key(ctx.scenario), activations_key(ctx.scenario), stage, conf)
    return _replay_cached(ReplayArgs(key, (ctx, stage, conf)))


def layer_steps(ctx: Any, last: bool = True) -> dict[str, Sequence[Any]]:
    """The stream's per-op lists of one shape, by key (read by ``rank_stream`` and ``batch_lengths``): a layer's
    forward and backward (a compiled layout's own, else the eager steps, else the items), the bottom layer's, the
    top tensors a compiled backward keeps, the final norm's forward and backward (on the last stage only), the
    layers' norms' backward, the rotary buffers, TP's gathered head and the full embedding gradient. A DeepSpeed
    ZeRO-3 rank's and an FSDP2 rank's eager-attention layer op by op (``activations/eager_core_steps``: held to
    their CPU traces; on an FSDP2 rank under full checkpointing too, its recompute at ``LAYER_RECOMPUTE``); the
    DDP and ZeRO-1/2 streams keep the items (DDP's held to its traces within 1% so)."""
    fsdp2 = fsdp2_replayable(ctx) and ctx.full_training
    core = (zero3_replayable(ctx) or fsdp2) and eager_core_steps.applies(ctx)
    full = fsdp2 and eager_core_steps.applies_full(ctx)  # its recompute written by FSDP2's writer alone
    return {
        LAYER_FORWARD: (eager_core_steps.layer_forward(ctx) if core else ())
        or (eager_core_steps.checkpointed_forward(ctx) if full else ())
        or eager_layer_forward_transients(ctx)
        or layer_forward_steps(ctx),
        FIRST_LAYER_FORWARD: first_layer_forward_steps(ctx),
        BOTTOM_ORDER: bottom_order(ctx),
        LAYER_BACKWARD: layer_backward_steps(ctx)
        or eager_layer_backward_transients(ctx)
        or (eager_core_steps.layer_backward_steps(ctx) if core else ())
        or (eager_core_steps.checkpointed_backward(ctx) if full else ()),
        LAYER_RECOMPUTE: eager_core_steps.recompute_steps(ctx) if full else (),
        BOTTOM_LAYER_BACKWARD: bottom_layer_backward_steps(ctx),
        KEPT_TOP: kept_top(ctx),
        FINAL_NORM: (final_norm_transients(ctx) or final_norm_steps(ctx)) if last else (),
        FINAL_NORM_BACKWARD: final_norm_backward_transients(ctx) if last else (),
        LAYER_NORM_BACKWARD: layer_norm_backward_transients(ctx),
        ROTARY_FORWARD: rotary_transients(ctx),
        HEAD_GATHER: head_gather(ctx),
        EMBEDDING_GRAD: embedding_grad(ctx),
    }


def rank_stream(ctx: Any, stage: Any, steps: int = STEPS, traced_only: bool = False) -> StreamWriter:
    """The stream of ``steps`` steps of ``stage``'s rank of ``ctx``, from the engine's cached groups;
    ``traced_only``: without the activation items a fake-tensor trace cannot see (``Level.ALLOCATOR``: CUDA
    kernels' scratch such as flash attention's fp32 dq accumulator), to compare with a trace's replay."""
    from memsim_widget.engine.caches.parts_cache import cached_activation_groups, cached_state_groups
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.states.budget import local_groups

    pipe = pipeline_stage(ctx, stage) if pp_replayable(ctx) else None
    ag: dict[str, Sequence[Any]] = (
        {k: g.entries for k, g in cached_activation_groups(ctx, stage).items()}
        if pipe is None
        else _micro_batch_groups(ctx, stage)
    )
    ag.update(layer_steps(ctx, stage.last))
    groups, step1 = cached_state_groups(ctx, stage)
    numels = tuple(lg.numel_each for lg in local_groups(ctx, stage) for _ in range(lg.count))
    sg = whole_table_grads(ctx, {k: g.entries for k, g in groups.items()}, numels)
    sg = _host_grads_shape(ctx, stage, sg)
    first = step1.entries if step1 is not None else sg["persistent"]
    order = grad_order(ctx, stage)
    earlier: dict[str, Sequence[Any]] | None = None
    if ctx.scenario.padding == "longest":  # the loss buffers change size every step: a shorter one first
        short = Context(ctx.scenario.replace(seq_len=max(ctx.scenario.seq_len // VARIABLE_DIVISOR, 1)))
        earlier = {k: list(g.entries) for k, g in cached_activation_groups(short, stage).items()}
        earlier.update(layer_steps(short))
    if traced_only:  # the stream's per-op transients are traced facts; leave out only what CUDA alone makes
        # the per-op transients stay, and the TP facts (counts, not items) pass through
        kept = (
            LAYER_FORWARD,
            FIRST_LAYER_FORWARD,
            LAYER_BACKWARD,
            BOTTOM_LAYER_BACKWARD,
            KEPT_TOP,
            FINAL_NORM,
        )
        kept += (HEAD_GATHER, BOTTOM_ORDER)
        kept += (FINAL_NORM_BACKWARD, LAYER_NORM_BACKWARD, EMBEDDING_GRAD, ROTARY_FORWARD)
        ag = {k: v if k in kept else [i for i in v if i.level != "allocator"] for k, v in ag.items()}
    micro = ctx.scenario.grad_accum_steps
    fsdp: Any = None
    if zero3_replayable(ctx):  # under LoRA the adapters alone train (zero_lora)
        fsdp = zero3_rank(ctx, stage) if ctx.full_training else lora_zero3_units(ctx, stage)
    elif ctx.par.dp > 1 and ctx.par.zero >= 3:
        fsdp = fsdp2_units(ctx, stage)
    ddp = rank_buckets(ctx, stage) if ddp_replayable(ctx) else None
    zero = zero12_rank(ctx, stage) if zero12_replayable(ctx) else None
    if zero is not None and not ctx.full_training:  # the adapters alone have gradients (zero_lora)
        numels, (top, layer, bottom, params), zero = lora_zero12(ctx, stage)
        order = GradOrder(top, layer, bottom, 0, params)
    sc = ctx.scenario
    offloaded = sc.offloads_activations
    return step_stream(
        ag,
        sg,
        first,
        numels,
        stage.layers,
        steps,
        order,
        earlier=earlier,
        micro=micro,
        fsdp=fsdp,
        kept=grads_kept(ctx.scenario),
        ddp=ddp,
        per_param=ctx.par.tp > 1 or weights_in_module_order(ctx),
        opt_groups=optimizer_groups(ctx, stage) if order.params else (),
        zero=zero,
        pipe=pipe,
        in_backward=sc.optimizer_in_backward,
        offload=copy_stream(ctx) if offloaded else None,
    )


def _host_grads_shape(ctx: Any, stage: Any, sg: dict[str, Any]) -> dict[str, Any]:
    """``sg`` with the gradients item the ZeRO writers read the parameters' tensors from (``_Grads.by_tensor``)
    where the items keep DeepSpeed's gradient partition on the host (``states/gradients.grads_on_host``): the
    host item as the one tensor-level item of one tensor per parameter, as without offload; the writers make
    DeepSpeed's own buffers from it (``zero_offload_stream``), never the item itself."""
    from memsim_widget.engine.caches.parts_cache import cached_model_states
    from memsim_widget.engine.states.gradients import HOST_GRADS_ITEM, grads_on_host

    if not grads_on_host(ctx):
        return sg
    host = [i for i in cached_model_states(ctx, stage).host if i.item == HOST_GRADS_ITEM]
    return {**sg, "grads": [replace(i, level="tensor") for i in host]}


def _micro_batch_groups(ctx: Any, stage: Any) -> dict[str, Sequence[Any]]:
    """One micro-batch's activation groups of a pipeline stage (``timeline.micro_batch_groups``)."""
    from memsim_widget.engine.caches.parts_cache import cached_activations
    from memsim_widget.engine.step.timeline import micro_batch_groups

    acts = cached_activations(ctx)
    groups: dict[str, Sequence[Any]] = dict(micro_batch_groups(ctx, stage, acts))
    if not stage.first:  # every stage computes its rotary embeddings (trace/pipeline.StageModule)
        own = list(groups.get("pre", ()))  # a later stage's: the step's inputs alone
        first = micro_batch_groups(ctx, replace(stage, first=True), acts)["pre"]
        # the first stage's "pre" is its own terms, then the inputs (timeline.activation_group_table): a middle
        # stage holds no token ids and no labels
        groups["pre"] = list(first[: len(first) - len(own)]) + (own if stage.last else [])
    return groups


@lru_cache(maxsize=4096)
def _replay_cached(args: ReplayArgs) -> PoolReplay:
    ctx, stage, conf = args.args
    stream = built_stream(args.key[:3], ctx, stage)
    return _replay_same_stream(ReplayArgs(stream_key(stream, conf), (stream, conf)))


#: The streams built last, by shape key (the groups' keys and the stage; the settings do not change a stream):
#: a shape's replay on its card (``card_replay.card_replay``), asked right after its unlimited replay, reuses its
#: stream.
_STREAMS: dict[tuple[Any, ...], StreamWriter] = {}
_STREAMS_KEPT = 2


#: Guards ``_STREAMS``: the widget estimates on a worker thread while the kernel's thread may estimate too.
_STREAMS_LOCK = threading.Lock()


def built_stream(key: tuple[Any, ...], ctx: Any, stage: Any) -> StreamWriter:
    """``rank_stream`` of ``stage``'s rank of ``ctx``, reused while it is among the last built."""
    with _STREAMS_LOCK:
        stream = _STREAMS.pop(key, None)
    if stream is None:
        stream = rank_stream(ctx, stage)
    with _STREAMS_LOCK:
        _STREAMS[key] = stream
        while len(_STREAMS) > _STREAMS_KEPT:
            del _STREAMS[next(iter(_STREAMS))]
    return stream


def stream_key(stream: StreamWriter, conf: AllocatorConf) -> tuple[Any, ...]:
    """A stream's identity: a 128-bit BLAKE2 digest of its events, its phases and the allocator settings."""
    return (blake2b(marshal.dumps(stream.events, 2), digest_size=16).digest(), tuple(stream.marks), conf)


@lru_cache(maxsize=1024)
def _replay_same_stream(args: ReplayArgs) -> PoolReplay:
    """The replay of a stream, cached by ``stream_key``: shapes whose keys differ in fields the stream does not
    read (another card of the same workspace sizes: the states' key holds the GPU) replay it once."""
    stream, conf = args.args
    args.args = ()  # the cache keeps this key: not the stream
    return replay_stream(stream, conf)


def replayed_item(ctx: Any, rep: PoolReplay, peak_allocated: int, outside: int) -> Item:
    """Caching-allocator fragmentation from the replay of the step's allocation stream
    (``engine/counters/alloc_stream``): its peak reserved less the peak allocated, capped by the card."""
    from memsim_widget.engine.counters.overhead import (
        capped_note,
        capped_reserved,
        fragmentation_item,
        reserved_cap,
    )
    from memsim_widget.engine.frameworks import allocator_conf

    cap = reserved_cap(ctx, outside)
    reserved = capped_reserved(peak_allocated, rep.peak_reserved, cap)
    conf = allocator_conf(ctx).text or "PyTorch's defaults"
    cached = ", ".join(fmt_bytes(b) for b in rep.largest_cached) or "none"
    formula = (
        f"caching allocator replayed ({conf}) over {STEPS} steps built from the engine's items"
        + (
            (
                " (DDP's wrap-time broadcast and gradient buckets, rebuilt at step 2: from torch 2.13's source, "
                "traced on CPU)"
                if ddp_replayable(ctx)
                else " (DeepSpeed ZeRO-1/2's flat weights, fp32 master partition, ipg buffer and partition "
                "gradients: deepspeed 0.19.8's stage_1_and_2.py, traced on CPU at world size 4, with "
                "overlap_comm's second ipg buffer and gradient accumulation"
                + (
                    "; under LoRA the adapters' alone, cast to bf16, beside the frozen base, traced with peft"
                    if not ctx.full_training
                    else ""
                )
                + "; its reduction stream not modelled)"
                if zero12_replayable(ctx)
                else " (DeepSpeed ZeRO-3's partitions, ipg bucket, gradient partitions and its coordinator's "
                "gathers, prefetches and releases: deepspeed 0.19.8's stage3.py and partitioned_param_coordinator.py, "
                "traced on CPU at world size 4"
                + (
                    "; under LoRA the adapters' alone beside the frozen base, every Linear keeping its input "
                    "(its zero3 linear), traced with peft"
                    if not ctx.full_training
                    else ""
                )
                + "; its all-gather and reduce streams not modelled)"
                if zero3_replayable(ctx)
                else " (FSDP2's all-gather and reduce-scatter buffers cached on their own CUDA streams)"
            )
            if ctx.par.dp > 1
            else ""
        )
        + tp_note(ctx)
        + zero_offload_note(ctx)
        + savers_note(ctx)
        + (
            f" (pipeline {ctx.par.pp_schedule} over {ctx.par.pp_microbatches} micro-batches: the schedule's order, "
            "receive buffers, kept outputs and input gradients from torch 2.13's pipelining, traced on CPU)"
            if ctx.par.pp > 1
            else ""
        )
        + (
            f" (step 1 at 1/{VARIABLE_DIVISOR} of the longest length: batches padded to their longest sample; a"
            " long run of varying lengths can reserve more, docs/allocator.md#variable-lengths)"
            if ctx.scenario.padding == "longest"
            else ""
        )
        + f": peak reserved "
        f"{fmt_bytes(rep.peak_reserved)} at {rep.at}, {rep.segments} segments; largest cached-but-unused "
        f"blocks then: {cached}" + capped_note(cap, rep.peak_reserved > cap)
    )
    return fragmentation_item(reserved - peak_allocated, formula)


#: The caches of the modules built on these replays (``card_replay``'s, added at its import): ``cache_clear`` empties
#: them too, without this module importing theirs.
CLEARED_TOO: list[Callable[[], None]] = []


def cache_clear() -> None:
    """Forget every cached replay (benchmarks measuring a cold engine), those on a card's capacity too."""
    _replay_cached.cache_clear()
    _replay_same_stream.cache_clear()
    _asks_cached.cache_clear()
    for clear in CLEARED_TOO:
        clear()
    with _STREAMS_LOCK:
        _STREAMS.clear()
