"""What a DeepSpeed ZeRO-1 or ZeRO-2 rank allocates and frees, and when, for the allocation stream
(``engine/counters/alloc_stream.py``): ``DeepSpeedZeroOptimizer`` as HF Trainer / accelerate run it with a bf16
model (``bf16.enabled``, ``data_types.grad_accum_dtype`` unset, so the gradients stay in bf16), no offload (see below), any
number of micro-batches a step (``gradient_accumulation_steps``), DeepSpeed's defaults for stages 1 and 2 (``contiguous_gradients``, ``reduce_scatter`` and
``use_multi_rank_bucket_allreduce`` true) but ``overlap_comm`` and ``reduce_bucket_size`` (default false and 5e8
elements), which the scenario says (``parallel.overlap_comm``, ``parallel.reduce_bucket_size``).

Source: deepspeed 0.19.8, ``deepspeed/runtime/zero/stage_1_and_2.py`` (``__init__``,
``initialize_optimizer_states``, ``setup_buckets``, ``reduce_independent_p_g_buckets_and_remove_grads``,
``reduce_ipg_grads``, ``allreduce_bucket``, ``copy_grads_in_partition``,
``independent_gradient_partition_epilogue``, ``_release_ipg_buffers``, ``get_grad_norm_direct``, ``step``),
``deepspeed/runtime/zero/config.py`` (the defaults) and ``deepspeed/runtime/engine.py``
(``_do_optimizer_sanity_check``: a bf16 model under ZeRO-1 with fp32 gradient accumulation takes the BF16
optimizer instead, not modelled). Restated, nothing copied; held to a CPU run of the real optimizer (PyTorch's
fake process group at world size 4, ``benchmarks/zero_trace.py``, docs/allocator.md "DeepSpeed ZeRO-1/2 ranks"):

- **Wrap** (``deepspeed.initialize``): per optimizer parameter group (HF Trainer: the weights that decay, then
  the norms and biases), the group's bf16 parameters are copied into one flat buffer padded to a multiple of
  2 x dp elements (``flatten_dense_tensors_aligned``, ``nccl_start_alignment_factor`` 2) and the parameters
  become views of it, so their own storages are freed; this rank's partition (flat / dp elements) is cloned
  and cast to an fp32 master copy (the clone freed). Then ``initialize_optimizer_states`` makes an fp32 zero
  gradient per group's partition and drops them all.
- **Backward**: autograd makes each parameter's bf16 ``.grad``; DeepSpeed's hook on it makes the ipg buffer
  (``reduce_bucket_size`` elements of bf16, whatever the model's size) at the first gradient of the backward,
  copies the gradient into it (the gradient becomes a view, its storage freed) and, when the next gradient
  would overflow the buffer, first reduces what it holds: ``allreduce_bucket`` flattens the bucket's slices
  into a new tensor (its elements), all-reduces it in place and copies the slices back (the flat tensor
  freed), then ``copy_grads_in_partition`` copies the gradients of the parameters that overlap this rank's
  partition into ``grads_in_partition``, made at the first such copy: the full size of every parameter that
  overlaps the partition. A gradient over ``reduce_bucket_size`` elements is not copied: it waits as it is
  until the next reduce and is freed once copied. After the last gradient (``independent_gradient_partition_
  epilogue``) what is left is reduced the same way and the ipg buffer is freed. Under ``overlap_comm``
  ``setup_buckets`` makes a second ipg buffer of the same size right after the first (double buffering: the
  hook fills one while the other is reduced, ``bucket.index`` swapped after each reduce) and
  ``_release_ipg_buffers`` frees both; a CPU run allocates the two back to back and frees them together.
- **Step**: the gradient norm casts each partition slice of a gradient to fp64 (``runtime/zero/utils.
  get_norm_dtype``: fp64 where ``accelerator/abstract_accelerator.is_fp64_supported``, true on CUDA) one at a
  time; per group the partition's slices are flattened (a copy when there are several) and cast to an fp32
  gradient (the copy freed), the inner optimizer steps on the group's fp32 partition (its states made at the
  first step), and the fp32 gradient is freed; ``grads_in_partition`` is freed with the last group's slices.
  The all-gather of the updated partitions writes into the flat buffers in place.

ZeRO-1 with one micro-batch runs the same hooks and buffers (the gradients of the parameters outside the
partition stay views of the ipg buffer until the epilogue drops them).

- **Gradient accumulation** (``ZeroWriter.micro``; ``is_gradient_accumulation_boundary`` true on the step's last
  micro-batch): ZeRO-2 (``partition_gradients``) reduces every micro-batch as above, and from the second on
  ``copy_grads_in_partition`` finds ``grads_in_partition`` reset and makes a new one (the accumulated gradients,
  views of the old one, are added in and re-pointed), so the old one lives until that micro-batch's epilogue.
  ZeRO-1 reduces only at the boundary: its hook (``process_gradients``) makes the ipg buffer at the first
  gradient but reduces nothing without ``overlap_comm``, and the engine's ``allreduce_gradients`` calls
  ``reduce_gradients`` only after the boundary's backward; so before it every gradient stays whole and nothing
  frees the buffer; each later micro-batch's new gradient is added in place and freed; at the boundary the kept
  ones are reduced as above (``reduce_gradients`` walks the groups' parameters; here in backward order, the same
  buffers). Traced at 2 and 3 micro-batches (``zero_trace.py --accum N``).

Not modelled: ``overlap_comm``'s reduction stream (on a GPU the flattened bucket is made on DeepSpeed's
``reduction_stream``, a pool of its own in the caching allocator; a CPU trace has one stream, so it stays on the
compute stream here, untraced), fp16's loss scaler and ZeRO-3 (``stage3.py``, another optimizer);
``offload_optimizer`` is ``zero_offload_stream.py``'s, on these writers.
peft's LoRA (the adapters the only flat group, the frozen base left as it is) runs these writers on the
adapters: ``zero_lora.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memsim_widget.engine.frameworks import DEEPSPEED_BUCKET_ELEMENTS
from memsim_widget.fast_dataclass import dataclass

#: ``nccl_start_alignment_factor``: a group's flat buffer is padded to a multiple of this x dp elements
ALIGNMENT = 2
#: bytes per element of the gradient norm's casts (``get_norm_dtype``: fp64 where the device has it)
NORM_BYTES = 8
#: the fp32 master copy and the fp32 gradient cast at the step
MASTER_BYTES = 4


@dataclass(frozen=True)
class ZeroRank:
    """A ZeRO-1/2 rank's geometry: each optimizer group's parameter tensors (elements, module order) and the
    rank's partition (elements) of it; the order backward makes the gradients (group index, tensor index);
    the slices of each tensor in the rank's partition; the bytes per element of the model (and gradients), the
    ipg buffer's elements and how many ipg buffers (two under ``overlap_comm``)."""

    groups: tuple[tuple[int, ...], ...]
    partitions: tuple[int, ...]
    ready: tuple[tuple[int, int], ...]
    #: per group, (tensor index, elements of it inside the rank's partition) in module order
    slices: tuple[tuple[tuple[int, int], ...], ...]
    dp: int
    model_bytes: int = 2
    bucket: int = DEEPSPEED_BUCKET_ELEMENTS
    buffers: int = 1
    #: ZeRO-2 (``partition_gradients``): every micro-batch's hooks reduce; ZeRO-1 reduces only at the boundary
    partition_grads: bool = True
    #: LoRA (``zero_lora.lora_zero12``): the groups are peft's adapters beside a frozen base, made in this many
    #: bytes per element and cast to the model's at the wrap; 0: full training
    cast_from: int = 0

    @property
    def in_partition(self) -> frozenset[tuple[int, int]]:
        """The (group, tensor) pairs that overlap the rank's partition."""
        return frozenset((g, t) for g, sl in enumerate(self.slices) for t, _ in sl)

    @property
    def grads_in_partition(self) -> int:
        """``grads_in_partition``'s elements: every overlapping tensor whole."""
        return sum(self.groups[g][t] for g, t in self.in_partition)


def partition_slices(
    tensors: Sequence[int], dp: int, rank: int = 0
) -> tuple[int, tuple[tuple[int, int], ...]]:
    """The partition size of a group of ``tensors`` (elements, flattened in order, padded to a multiple of
    ``ALIGNMENT`` x ``dp``) over ``dp`` ranks, and the (tensor index, elements inside) of those overlapping
    ``rank``'s partition (``get_data_parallel_partitions``, ``get_partition_info``)."""
    total = sum(tensors)
    align = ALIGNMENT * dp
    size = -(-total // align) * align // dp
    lo, hi = rank * size, (rank + 1) * size
    out: list[tuple[int, int]] = []
    at = 0
    for t, n in enumerate(tensors):
        inside = min(at + n, hi) - max(at, lo)
        if inside > 0:
            out.append((t, inside))
        at += n
    return size, tuple(out)


def zero_rank(
    groups: Sequence[Sequence[int]],
    ready: Sequence[tuple[int, int]],
    dp: int,
    model_bytes: int = 2,
    rank: int = 0,
    bucket: int = DEEPSPEED_BUCKET_ELEMENTS,
    buffers: int = 1,
    partition_grads: bool = True,
) -> ZeroRank:
    """``ZeroRank`` of ``rank`` of ``dp`` for optimizer groups of ``groups`` tensors, gradients ready in the
    order ``ready``, ``buffers`` ipg buffers of ``bucket`` elements, ZeRO-2 (``partition_grads``) or ZeRO-1."""
    parts = [partition_slices(g, dp, rank) for g in groups]
    return ZeroRank(
        tuple(tuple(g) for g in groups),
        tuple(p for p, _ in parts),
        tuple(ready),
        tuple(s for _, s in parts),
        dp,
        model_bytes,
        bucket,
        buffers,
        partition_grads,
    )


class ZeroWriter:
    """Writes a ZeRO-1/2 rank's buffers into an allocation stream (``alloc_stream.StreamWriter``): ``wrap``
    after the weights, ``ready`` for each gradient autograd makes, ``epilogue`` after the last one, ``step``
    for the optimizer step."""

    def __init__(self, s: Any, z: ZeroRank) -> None:
        self.s, self.z = s, z
        self.ipg: list[int] = []
        self.held: list[int] = []  # a gradient too large for the ipg buffer, waiting for its reduce
        self.gip: list[int] = []
        self.elements = 0
        self.pending: list[tuple[int, int]] = []  # the (group, tensor) pairs in the bucket
        self.next = 0  # the next entry of z.ready
        self.first = True  # the step's first micro-batch
        self.boundary = True  # the step's last micro-batch (``is_gradient_accumulation_boundary``)
        self.kept: list[list[int]] = []  # ZeRO-1: the gradients kept as they are until the boundary
        self.stale: list[int] = []  # ZeRO-2: an earlier micro-batch's grads_in_partition, until the epilogue
        self.fresh = False  # grads_in_partition made in this micro-batch

    def micro(self, m: int, micro: int) -> None:
        """Micro-batch ``m`` of ``micro`` a step begins (gradient accumulation)."""
        self.first, self.boundary, self.fresh = m == 1, m == micro, False

    def wrap(self, weights: Sequence[Sequence[int]]) -> None:
        """``DeepSpeedZeroOptimizer.__init__``: per group the flat bf16 buffer (the group's weights, handles
        ``weights[g]``, freed), the partition's clone cast to the fp32 master copy; then the zero fp32 gradients
        of ``initialize_optimizer_states``, made and dropped."""
        s, z = self.s, self.z
        for g in range(len(z.groups)):
            s.alloc(z.partitions[g] * z.dp * z.model_bytes)
            s.free(weights[g])
            clone = s.alloc(z.partitions[g] * z.model_bytes)
            s.alloc(z.partitions[g] * MASTER_BYTES)
            s.free(clone)
        s.free([h for p in z.partitions for h in s.alloc(p * MASTER_BYTES)])

    def ready(self, handle: list[int]) -> None:
        """DeepSpeed's hook on the next gradient of ``z.ready`` (just made, ``handle``): the ipg buffer (both
        under ``overlap_comm``) at the first, a reduce when the gradient would overflow it, then the gradient
        copied in and freed (one over the buffer's size waits for the next reduce). ZeRO-1 keeps it before the
        accumulation boundary; a later micro-batch's is added in place to the kept one and freed."""
        s, z = self.s, self.z
        g, t = z.ready[self.next]
        n = z.groups[g][t]
        if not self.ipg:
            self.ipg = [h for _ in range(z.buffers) for h in s.alloc(z.bucket * z.model_bytes)]
        if not z.partition_grads and not self.boundary:  # ZeRO-1 before the boundary: kept, not reduced
            if self.first:
                self.kept.append(handle)
            else:
                s.free(handle)  # added in place to the kept one
            self.next += 1
            return
        if not z.partition_grads and not self.first:  # the new one added in place; the kept one reduced
            s.free(handle)
            handle = self.kept[self.next]
        self.next += 1
        if self.elements + n > z.bucket:
            self.reduce()
        self.pending.append((g, t))
        self.elements += n
        if n > z.bucket:
            self.held = handle
        else:
            s.free(handle)

    def each(self, handles: Sequence[int]) -> None:
        """``ready`` for each of ``handles`` in turn (one gradient each)."""
        for h in handles:
            self.ready([h])

    def reduce(self) -> None:
        """``reduce_ipg_grads``: the bucket's gradients flattened into a new tensor (freed once copied back), then
        the overlapping ones copied into ``grads_in_partition`` (made at the first)."""
        s, z = self.s, self.z
        if self.elements:
            s.free(s.alloc(self.elements * z.model_bytes))
        if self.gip and not self.fresh:  # ZeRO-2's later micro-batch copies into a new one
            self.stale, self.gip = self.gip, []
        if not self.gip and any(p in z.in_partition for p in self.pending):
            self.gip, self.fresh = s.alloc(z.grads_in_partition * z.model_bytes), True
        s.free(self.held)
        self.held, self.pending, self.elements = [], [], 0

    def epilogue(self) -> None:
        """``independent_gradient_partition_epilogue``: the rest reduced, the ipg buffers freed (then an earlier
        micro-batch's grads_in_partition); ZeRO-1 before the boundary keeps its ipg buffer and reduces nothing."""
        self.next = 0
        if not self.z.partition_grads and not self.boundary:
            return
        self.reduce()
        self.s.free(self.ipg + self.stale)
        self.ipg, self.stale, self.kept = [], [], []

    def step(self, first: bool, states: Sequence[float], temps: Sequence[float]) -> None:
        """``DeepSpeedZeroOptimizer.step``: the norm's fp64 casts, then per group the flattened slices, the fp32
        gradient, the inner optimizer's states (``first`` step; ``states``: bytes per element of each) and its
        step temporaries (``temps``, bytes per element, freed last first), the gradient freed; the partition's
        gradients freed with the last group's slices."""
        s, z = self.s, self.z
        for sl in z.slices:
            for _, n in sl:
                s.free(s.alloc(n * NORM_BYTES))
        last = max((g for g, sl in enumerate(z.slices) if sl), default=-1)
        for g, p in enumerate(z.partitions):
            flat = s.alloc(p * z.model_bytes) if len(z.slices[g]) > 1 else []
            grad = s.alloc(p * MASTER_BYTES)
            s.free(flat)
            if g == last:
                s.free(self.gip)
                self.gip = []
            if first:
                for b in states:
                    s.alloc(max(int(p * b), 1))
            s.free([h for b in temps for h in s.alloc(max(int(p * b), 1))][::-1])
            s.free(grad)


#: The engine's parameter group kind HF Trainer puts in its no-decay optimizer group (``Trainer.get_decay_parameter_names``:
#: norm weights and biases; the engine's groups do not name biases apart, so only the norms move)
NO_DECAY_KIND = "norm"


def rank_zero(ctx: Any, stage: Any) -> ZeroRank:
    """``ZeroRank`` of rank 0 of ``stage``'s ZeRO-1/2 rank of ``ctx`` (``states/budget.local_groups``): HF Trainer's
    two optimizer groups (the weights that decay, then the norms), each in module order (the embeddings, each
    layer's, the final norm and head), the gradients ready in backward order (the output side, each layer's
    from the top, the embeddings last: a tied embedding's hook fires once its two parts are summed)."""
    from memsim_widget.engine.frameworks import reduce_bucket_elements, reduce_buffers
    from memsim_widget.engine.states.budget import local_groups

    layers = max(stage.layers, 1)
    pre: list[tuple[int, int]] = []
    layer: list[tuple[int, int]] = []
    post: list[tuple[int, int]] = []
    for lg in local_groups(ctx, stage):
        g = lg.group
        x = (lg.numel_each, int(g.kind == NO_DECAY_KIND))
        if g.scope == "layer":
            layer += [x] * max(lg.count // layers, 1)
        else:
            (pre if g.scope == "pre" else post).extend([x] * lg.count)
    module = pre + layer * stage.layers + post
    groups: list[list[int]] = [[], []]
    index: list[tuple[int, int]] = []
    for n, g in module:
        index.append((g, len(groups[g])))
        groups[g].append(n)
    nl = len(layer)
    at = len(pre)
    ready = [index[at + stage.layers * nl + j] for j in range(len(post))]
    for k in range(stage.layers - 1, -1, -1):
        ready += [index[at + k * nl + j] for j in range(nl)]
    ready += [index[j] for j in range(len(pre))]
    kept = [g for g in groups if g]
    if not groups[0]:
        ready = [(0, t) for _, t in ready]
    return zero_rank(
        kept,
        ready,
        ctx.par.dp,
        ctx.recipe.weight_bytes,
        0,
        reduce_bucket_elements(ctx),
        reduce_buffers(ctx),
        ctx.par.zero >= 2,
    )
