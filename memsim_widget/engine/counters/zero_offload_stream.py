"""What a DeepSpeed ZeRO rank keeps on the GPU when its optimizer is offloaded to the host, for the allocation
stream (``engine/counters/alloc_stream.py``): ZeRO-1/2 and ZeRO-3 with ``offload_optimizer: {device: cpu}`` (the
scenario's ``parallel.offload: optimizer``), the rest as ``zero_stream`` and ``zero3_stream`` write it (a bf16
model, full training, any number of micro-batches a step, DeepSpeed's defaults but the scenario's keys).

The scenario's ``parallel.offload`` (``plan/vector.OFFLOADS``) is ``none``, ``optimizer`` (DeepSpeed's
``offload_optimizer``: the fp32 master copy, the optimizer's states and step on the host) or ``optimizer+params``
(``offload_param`` too, ZeRO-3 alone: the parameters' partitions on the host between uses); the engine's counted
items put the master weights and states at level ``host`` for either (``states/optimizer._sharding``), and the
weights too for ``optimizer+params`` (``states/weights._placement``); under ``optimizer`` the ZeRO-2/3 gradient
partition too, which DeepSpeed keeps on the host (below; ``states/gradients.grads_on_host``), and ZeRO-1/2's
staging buffer is a GPU item (``states/gradients.offload_staging``), which the wrap here writes in its place.

Source: deepspeed 0.19.8, ``deepspeed/runtime/zero/stage_1_and_2.py`` with ``cpu_offload`` (``self.device`` is
'cpu'). Restated, nothing copied; held to a CPU run of the real optimizer (``benchmarks/zero_trace.py
--offload optimizer``, PyTorch's fake process group at world size 4, torch's AdamW stepping on the host's
partitions: ``zero_force_ds_cpu_optimizer: false``, which DeepSpeed allows; on a GPU ``DeepSpeedCPUAdam`` steps
there instead, host memory either way). What the GPU holds, and when:

- **Wrap** (``__init__``): per optimizer group the flat bf16 buffer on the GPU (the parameters views of it, their
  storages freed), as without offload; this rank's partition cloned on the GPU and cast to the fp32 master
  partition on the host (``.clone().to(device=self.device, ...)``: the GPU clone freed); the bf16 staging copy
  (``param_buffer_of_bit16_for_cpu_offload_groups``) and ``temp_grad_buffer_for_cpu_offload`` on the host; then
  ``temp_grad_buffer_for_gpu_offload``: the largest parameter's elements in bf16 on the GPU, kept for good (the
  staging buffer accumulation copies the host's gradient back through). ``initialize_optimizer_states`` makes
  the fp32 gradient partitions on the host and keeps them (``.grad`` of the master partitions).
- **Backward**: the ipg buffer(s), the hooks and the bucket's flat copy at each reduce as without offload
  (``reduce_ipg_grads``; ``contiguous_gradients`` is forced on under offload), but there is no
  ``grads_in_partition``: ``copy_grads_in_partition``'s offload branch, at the accumulation boundary, for each
  reduced parameter overlapping the partition in the bucket's order, casts its slice to fp64 for its norm
  (``set_norm_for_param_grad_in_gpu``: made and freed, an fp64 scalar kept to the step) and to fp32
  (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``: ``src_tensor.to(fp32)`` on the GPU, copied into the host's
  fp32 gradient partition, freed as the function returns), then drops the gradient (a view of the ipg buffer).
  Before the boundary (gradient accumulation) ``async_accumulate_grad_in_cpu_via_gpu`` adds the host's copy into
  the gradient through ``temp_grad_buffer_for_gpu_offload`` and copies it back to a host buffer
  (``accumulated_grads_in_cpu``): nothing new on the GPU.
- **Step**: the norm from the kept scalars, the clip and the inner optimizer's step on the host, the host's
  bf16 staging copy copied into the GPU partition in place (``bit16_partitions[partition_id].data.copy_``), the
  all-gather in place: nothing allocated on the GPU.

ZeRO-3 (``stage3.py`` with ``offload_optimizer``, ``self.device`` 'cpu'; the parameters stay on the GPU):

- **Wrap**: the parameters' partitions and their flat buffer on the GPU, as without offload; the fp32 partitions
  (``_create_fp32_partitions``: the flat bf16 cast to fp32 on the host, then cloned), the zero gradients of
  ``initialize_optimizer_states`` (kept as the fp32 partitions' ``.grad``) and ``grad_partitions_flat_buffer`` (the
  gradient partitions) all on the host; the ipg bucket, the hooks' gather pass and the persisted parameters on
  the GPU.
- **Backward**: the coordinator's fetches and releases and the ipg bucket as without offload; at each
  ``__reduce_and_partition_ipg_grads``, while the reduce-scatter's flat copy lives, ``partition_grads`` takes the
  bucket's parameters in ``ds_id`` order: the gradient partition copied into the host's buffer and brought back
  to the GPU (``grad_buffer.to(grad_partition.device)``; a later micro-batch adds into that copy and copies it
  back), the previous parameter's copy dropped as the next one's is made; at the accumulation boundary its norm
  (``_constant_buffered_norm2``: fp64 casts of parts of at most 2.5e8 elements, one at a time) and its fp32 cast
  copied into the host's fp32 gradient (``_offload_grad_partition_at_boundary``), each made and freed.
- **Step**: the norm from the kept scalars, the host's step, the fp32 partitions copied into the GPU's bf16 ones in
  place (``_reassign_or_swap_out_partitioned_parameters``): nothing allocated on the GPU. A copy between host and
  GPU with a dtype change converts on the CPU side (PyTorch ``aten/src/ATen/native/cuda/Copy.cu``,
  ``copy_kernel_cuda``), so no GPU temporary in any of these.

Not written, ``offload_param`` (``optimizer+params``, the fitted rule stays): each parameter's partition on the
host (``partition_parameters.py``, ``_partition_param`` to the ``remote_device``; ``param_groups_fp16_flat_cpu_
memory`` in place of the GPU's flat buffer), and each fetch copying the partitions to the GPU first
(``_allgather_params_coalesced``' ``ds_tensor.to(device)`` list, concatenated into the gathered buffer;
``_all_gather_sequential`` passing the copy to the all-gather, where NCCL keeps it until the work completes,
which a fake process group does not show). The param swapper is NVMe offload only (not modelled).

Tracing it on a CPU (where host and GPU memory are the same memory): the trace logs every storage as the other
ZeRO traces do and leaves out the host's by identity (``zero_trace._host_side``: the buffers DeepSpeed makes on
``self.device`` = 'cpu', whatever the inner optimizer's ``step`` makes, and the accumulation's host buffers).
ZeRO-3's ``_create_fp32_partitions`` and ``initialize_optimizer_states`` under offload make host tensors only,
transients too, so whatever they allocate is the host's. The one allocation of the GPU's that a CPU run would
not make is a host tensor's ``.to(device)`` (a no-op between two CPU tensors): the trace makes it return a copy
(``zero_trace._host_copies``), ZeRO-3's gradient partition brought back; ZeRO-1/2's copies are all ``copy_``
into buffers made before (``dest_tensor.copy_``, ``dest_buffer.copy_``, ``bit16_partitions[...].data.copy_``),
and its trace is the same either way.

Not written: the fp64 norm scalars (8 B each, one per parameter overlapping the partition, 512 B blocks of the
small pool until the step) and the few one-element tensors of the norm's all-reduce; the streams (on a GPU
ZeRO-3's copies and casts run under ``reduce_and_partition_stream``, ZeRO-1/2's under ``reduction_stream`` with
``overlap_comm``: pools of their own; kept on the compute stream here, as ``zero_stream`` and ``zero3_stream`` keep
those streams' buffers, untraced).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from memsim_widget.engine.counters.zero3_stream import Zero3Units, Zero3Writer
from memsim_widget.engine.counters.zero_stream import MASTER_BYTES, NORM_BYTES, ZeroRank, ZeroWriter
from memsim_widget.fast_dataclass import dataclass


@dataclass(frozen=True)
class ZeroOffloadRank(ZeroRank):
    """A ZeRO-1/2 rank (``zero_stream.ZeroRank``) whose optimizer is offloaded to the host (``offload_optimizer``)."""

    @property
    def largest(self) -> int:
        """Elements of the largest parameter tensor (``temp_grad_buffer_for_gpu_offload``'s)."""
        return max((n for g in self.groups for n in g), default=0)

    def slice_of(self, g: int, t: int) -> int:
        """Elements of tensor ``t`` of group ``g`` inside the rank's partition (0 outside it)."""
        return next((n for i, n in self.slices[g] if i == t), 0)


def offloaded(z: ZeroRank) -> ZeroOffloadRank:
    """``z`` with its optimizer offloaded to the host."""
    return ZeroOffloadRank(**{f.name: getattr(z, f.name) for f in fields(z)})


class ZeroOffloadWriter(ZeroWriter):
    """``zero_stream.ZeroWriter`` of a rank whose optimizer is on the host: the GPU's side of its wrap, reduces and
    step (the module docstring)."""

    z: ZeroOffloadRank

    def wrap(self, weights: Sequence[Sequence[int]]) -> None:
        """Per group the flat bf16 buffer (the weights ``weights[g]`` freed), the partition's clone made and freed
        (its fp32 cast is the host's), then ``temp_grad_buffer_for_gpu_offload``, kept."""
        s, z = self.s, self.z
        for g in range(len(z.groups)):
            s.alloc(z.partitions[g] * z.dp * z.model_bytes)
            s.free(weights[g])
            s.free(s.alloc(z.partitions[g] * z.model_bytes))
        s.alloc(z.largest * z.model_bytes)

    def reduce(self) -> None:
        """``reduce_ipg_grads`` under offload: the bucket's flat copy made and freed, then at the accumulation
        boundary each of the bucket's gradients overlapping the partition has its slice cast to fp64 (its norm)
        and to fp32 (copied to the host), each made and freed; a gradient over the bucket's size freed last."""
        s, z = self.s, self.z
        if self.elements:
            s.free(s.alloc(self.elements * z.model_bytes))
        if self.boundary:
            for g, t in self.pending:
                n = z.slice_of(g, t)
                if n:
                    s.free(s.alloc(n * NORM_BYTES))
                    s.free(s.alloc(n * MASTER_BYTES))
        s.free(self.held)
        self.held, self.pending, self.elements = [], [], 0

    def step(self, first: bool, states: Sequence[float], temps: Sequence[float]) -> None:
        """The step runs on the host: nothing on the GPU (the updated partition copied into the flat buffer in
        place)."""


def zero_writer(s: Any, z: ZeroRank) -> ZeroWriter:
    """The writer of ``z``: ``ZeroOffloadWriter`` for an offloaded rank, else ``zero_stream.ZeroWriter``."""
    return ZeroOffloadWriter(s, z) if isinstance(z, ZeroOffloadRank) else ZeroWriter(s, z)


def zero12_rank(ctx: Any, stage: Any) -> ZeroRank:
    """``zero_stream.rank_zero`` of ``stage``'s rank of ``ctx``, offloaded (``offloaded``) when the scenario offloads
    its optimizer (``parallel.offload``)."""
    from memsim_widget.engine.counters.zero_stream import rank_zero

    z = rank_zero(ctx, stage)
    return offloaded(z) if ctx.par.offload != "none" else z


#: ``_constant_buffered_norm2``'s ``buffer_size`` (elements): a gradient partition's norm casts it to fp64 in parts
#: of at most this many elements, one at a time
NORM_PART = 250_000_000


@dataclass(frozen=True)
class Zero3OffloadUnits(Zero3Units):
    """A ZeRO-3 rank (``zero3_stream.Zero3Units``) whose optimizer is offloaded to the host (``offload_optimizer``),
    its parameters on the GPU."""

    def micro(self, w: Any, m: int, micro: int) -> None:
        """Micro-batch ``m`` of ``micro``: the gradient partitions go to the host's fp32 gradients on the last."""
        w.boundary = m == micro


def offloaded3(u: Zero3Units) -> Zero3OffloadUnits:
    """``u`` with its optimizer offloaded to the host."""
    return Zero3OffloadUnits(**{f.name: getattr(u, f.name) for f in fields(u)})


class Zero3OffloadWriter(Zero3Writer):
    """``zero3_stream.Zero3Writer`` of a rank whose optimizer is on the host (``offload_optimizer``): the GPU's side
    of its wrap, reduces and step (the module docstring)."""

    def __init__(self, s: Any, u: Zero3Units) -> None:
        super().__init__(s, u)
        self.boundary = True  # the step's last micro-batch (``is_gradient_accumulation_boundary``)

    def _masters(self) -> None:
        """None on the GPU: the fp32 partitions and ``initialize_optimizer_states``' zero gradients are the host's
        (``_create_fp32_partitions`` on ``self.device``)."""

    def _grad_partitions(self, total: int) -> None:
        """None on the GPU: ``grad_partitions_flat_buffer`` is made on the host."""

    def step(self, first: bool, states: Sequence[float], temps: Sequence[float]) -> None:
        """The step runs on the host: nothing on the GPU (the updated partitions copied into the flat buffer in
        place)."""

    def _reduce(self) -> None:
        """``__reduce_and_partition_ipg_grads`` under offload: the bucket's flattened copy for the reduce-scatter
        (as ``Zero3Writer._reduce``), and while it lives ``partition_grads`` on each of the bucket's parameters in
        ``ds_id`` order: its partition copied into the host's gradient buffer and back to the GPU
        (``grad_buffer.to(grad_partition.device)``, freed when the next parameter's replaces it), at the
        accumulation boundary its fp64 norm casts (``_constant_buffered_norm2``, parts of ``NORM_PART``) and its
        fp32 cast (``_offload_grad_partition_at_boundary``), each made and freed."""
        s, u = self.s, self.u
        alone = len(self.pending) == 1 and self.numels[self.pending[0]] % u.dp == 0
        flat = []
        if self.pending and not alone:
            flat = s.alloc(sum(self._padded(p) for p in self.pending) * u.model_bytes)
        copy: list[int] = []
        for p in sorted(self.pending):
            n = self.parts[p]
            s.free(copy)
            copy = s.alloc(n * u.model_bytes)
            if self.boundary:
                for at in range(0, n, NORM_PART):
                    s.free(s.alloc(min(NORM_PART, n - at) * NORM_BYTES))
                s.free(s.alloc(n * MASTER_BYTES))
        s.free(copy + flat)
        s.free(self.held)
        self.pending, self.held = [], []


def zero3_writer(s: Any, u: Zero3Units) -> Zero3Writer:
    """The writer of ``u``: ``Zero3OffloadWriter`` for an offloaded rank, else ``zero3_stream.Zero3Writer``."""
    return Zero3OffloadWriter(s, u) if isinstance(u, Zero3OffloadUnits) else Zero3Writer(s, u)


def zero3_rank(ctx: Any, stage: Any) -> Zero3Units:
    """``zero3_stream.zero3_units`` of ``stage``'s rank of ``ctx``, offloaded (``offloaded3``) when the scenario
    offloads its optimizer (``parallel.offload: optimizer``)."""
    from memsim_widget.engine.counters.zero3_stream import zero3_units

    u = zero3_units(ctx, stage)
    return offloaded3(u) if ctx.par.offload != "none" else u


def zero_offload_note(ctx: Any) -> str:
    """The reserved formula's words for an offloaded DeepSpeed rank the stream writes (empty for any other)."""
    if ctx.par.offload == "none" or ctx.par.dp <= 1:
        return ""
    return (
        " (offload_optimizer: the fp32 master partition, the optimizer's states and step on the host; on the GPU "
        + (
            "the staging buffer of the largest parameter and "
            if ctx.par.zero < 3
            else "each gradient partition copied back from the host and "
        )
        + "each partition slice's fp64 and fp32 casts at the boundary: deepspeed 0.19.8, traced on CPU)"
    )
