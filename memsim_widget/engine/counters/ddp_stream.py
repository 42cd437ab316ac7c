"""What torch ``DistributedDataParallel`` allocates on one rank and when, for the allocation stream
(``engine/counters/alloc_stream.py``): DDP as HF Trainer / accelerate wrap a model (``gradient_as_bucket_view``
False, default bucket caps), the layout ``states/gradients.py``'s "DDP gradient buckets" item counts.

Source: torch 2.13.0, ``torch/nn/parallel/distributed.py`` (``_BucketCapacityConfig``, ``__init__``,
``_ddp_init_helper``, ``_build_params_for_reducer``, ``_pre_forward``), ``torch/distributed/utils.py``
(``_sync_module_states``), and the C++ side as in pytorch/pytorch ``torch/csrc/distributed/c10d/reducer.cpp``
(``compute_bucket_assignment_by_size``, ``Reducer::initialize_buckets``, ``rebuild_buckets``,
``mark_variable_ready_dense``, ``finalize_bucket_dense``) and ``comm.cpp`` (``broadcast_coalesced``); HF's
choice of ``find_unused_parameters`` from transformers 5.24 ``Trainer._build_accelerator_args``. Restated,
nothing copied; held to a CPU run of real DDP (gloo, world size 1) under a logging dispatch mode
(``benchmarks/ddp_trace.py``, docs/allocator.md "DDP's buckets"):

- At wrap time ``_sync_module_states`` broadcasts every parameter (and buffer) from rank 0: C++
  ``broadcast_coalesced`` groups them in module order into flat buffers of at least 250 MiB
  (``broadcast_bucket_size``; a bucket closes once it reaches the cap), at most two in flight: the third flat
  buffer is made once the first is unflattened back and freed. At world size 1 too.
- Then the Reducer: ``compute_bucket_assignment_by_size`` walks the parameters that require a gradient in module
  order (``named_modules``, shared ones once) and closes a bucket once its bytes reach the current limit,
  the limits advancing along a list (the last repeats); per dtype and device. The limits at wrap time:
  ``[1 MiB, 25 MiB]`` (``_DEFAULT_FIRST_BUCKET_BYTES``, ``bucket_cap_mb`` 25) with
  ``find_unused_parameters=True``, else one bucket of everything (``sys.maxsize``; torch 2.13
  ``compute_bucket_size_limits``). DDP hands the list reversed to the Reducer, whose
  ``initialize_buckets`` allocates each bucket's flat gradient tensor (``at::empty``) in that order.
- ``find_unused_parameters=True`` also makes an int32 map of the parameters on the device
  (``initialize_local_used_map``).
- ``gradient_as_bucket_view=False``: autograd makes each ``.grad`` as without DDP; its post-hook copies it into
  the bucket divided by the world size (``at::mul_out`` into the bucket's view: no new tensor), NCCL all-reduces
  the bucket in place, and the bucket is copied back into ``.grad`` (``copy_``: it exists). The buckets never
  change after that.
- Without ``find_unused_parameters`` (or with ``static_graph``) the Reducer records the order gradients became
  ready in the first backward, and the next forward with gradients enabled (``_pre_forward`` ->
  ``_rebuild_buckets``) rebuilds: ``initialize_buckets`` clears the old buckets (freed) and allocates the new
  ones, assigned over the ready order with ``[1 MiB, 25 MiB]`` and not reversed. Once.
- Under gradient accumulation (``no_sync`` on the micro-batches that do not synchronise, as accelerate's
  ``accumulate`` does) the hooks do nothing: the gradients accumulate in ``.grad`` as on one GPU, and the rebuild
  comes at the first forward after the first synchronised backward (the second step's first micro-batch).

HF Trainer passes ``find_unused_parameters = not gradient checkpointing`` for a ``PreTrainedModel``
(``ddp_find_unused_parameters`` unset); accelerate leaves ``bucket_cap_mb`` unset at its own default of 25, so
DDP keeps its 1 MiB first bucket. Not modelled: buffers in the broadcast (RoPE's few KiB), NCCL's
``record_stream`` on the buckets (they are freed only at the rebuild, a step after their last all-reduce), the
process group's watchdog holding a finished work's tensors, a ``reduce_dtype`` or communication hook other than
the default, ``static_graph``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from memsim_widget.fast_dataclass import dataclass

#: ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``: the first bucket's cap when ``bucket_cap_mb`` is unset
FIRST_BUCKET_BYTES = 1024**2
#: ``_DEFAULT_BUCKET_CAP_MB`` (25) x ``_MB_TO_BYTES`` (1024 x 1024)
BUCKET_CAP_BYTES = 25 * 1024**2
#: ``DistributedDataParallel.broadcast_bucket_size``: the flat buffers of the wrap-time broadcast
BROADCAST_BUCKET_BYTES = 250 * 1024**2
#: ``broadcast_coalesced``'s ``max_in_flight``: flat buffers alive at once
BROADCAST_IN_FLIGHT = 2
#: the int32 entries of ``local_used_map_dev_`` (one per parameter)
USED_MAP_BYTES = 4


def bucket_assignment(sizes: Sequence[int], limits: Sequence[int]) -> tuple[int, ...]:
    """The bytes of each bucket ``compute_bucket_assignment_by_size`` makes of tensors of ``sizes`` bytes (one
    dtype and device) taken in order: a bucket closes once its bytes reach the current limit, and the limit
    then advances along ``limits`` (the last one repeats); the bucket still open at the end comes last."""
    out: list[int] = []
    current, i = 0, 0
    for size in sizes:
        current += size
        if current >= limits[i]:
            out.append(current)
            current = 0
            i = min(i + 1, len(limits) - 1)
    if current:
        out.append(current)
    return tuple(out)


@dataclass(frozen=True)
class DdpBuckets:
    """A DDP rank's buffers: the wrap-time broadcast's flat buffers (module order), the buckets allocated at
    wrap time (in allocation order), the buckets the rebuild allocates (none: no rebuild) and the bytes of the
    used-parameter map (0 without ``find_unused_parameters``)."""

    broadcast: tuple[int, ...]
    initial: tuple[int, ...]
    rebuilt: tuple[int, ...]
    used_map: int = 0


def find_unused_parameters(ctx: Any) -> bool:
    """HF Trainer's ``find_unused_parameters`` for a transformers model with ``ddp_find_unused_parameters``
    unset: True unless activation checkpointing is on (transformers 5.24 ``Trainer._build_accelerator_args``)."""
    return ctx.scenario.activation_checkpointing == "none"


def ddp_buckets(
    params: Sequence[int], ready: Sequence[int], weight_bytes: int, grad_bytes: int, find_unused: bool
) -> DdpBuckets:
    """``DdpBuckets`` of a model whose parameter tensors (every one trains) have ``params`` elements in module
    order and become ready in backward in the order ``ready``; ``weight_bytes`` and ``grad_bytes`` per element."""
    if sorted(params) != sorted(ready):
        raise ValueError("ddp_buckets: ready must hold the same tensors as params")
    broadcast = bucket_assignment([n * weight_bytes for n in params], [BROADCAST_BUCKET_BYTES])
    grads = [n * grad_bytes for n in params]
    limits = [FIRST_BUCKET_BYTES, BUCKET_CAP_BYTES]
    initial = bucket_assignment(grads, limits if find_unused else [sys.maxsize])[::-1]
    rebuilt = () if find_unused else bucket_assignment([n * grad_bytes for n in ready], limits)
    return DdpBuckets(broadcast, initial, rebuilt, USED_MAP_BYTES * len(params) if find_unused else 0)


class DdpWriter:
    """Writes DDP's buffers into an allocation stream (``alloc_stream.StreamWriter``): ``wrap`` right after the
    weights, ``rebuild`` before the second step's first forward."""

    def __init__(self, s: Any, b: DdpBuckets) -> None:
        self.s, self.b = s, b
        self.buckets: list[int] = []

    def wrap(self) -> None:
        """``DistributedDataParallel.__init__``: the broadcast's flat buffers (two in flight), then the Reducer's
        buckets and its used-parameter map."""
        s = self.s
        in_flight: list[list[int]] = []
        for size in self.b.broadcast:
            if len(in_flight) >= BROADCAST_IN_FLIGHT:
                s.free(in_flight.pop(0))
            in_flight.append(s.alloc(size))
        for h in in_flight:
            s.free(h)
        self.buckets = [h for size in self.b.initial for h in s.alloc(size)]
        if self.b.used_map:
            s.alloc(self.b.used_map)  # kept for the run

    def rebuild(self) -> None:
        """``_rebuild_buckets`` at the forward after the first synchronised backward: the old buckets freed
        (``buckets_.clear()``), the new ones allocated in the order their gradients became ready."""
        if not self.b.rebuilt:
            return
        self.s.free(self.buckets)
        self.buckets = [h for size in self.b.rebuilt for h in self.s.alloc(size)]


#: Where a decoder layer's norms run in its forward (transformers' Llama-style layers): the input norm before
#: the attention, the post-attention norm before the MLP (``mlp.`` parameters); other parameters run in module order
_INPUT_NORM, _POST_ATTENTION_NORM, _MLP = "input_layernorm", "post_attention_layernorm", ".mlp."


def layer_use_order(names: Sequence[str]) -> list[int]:
    """The indices of a layer's parameter groups (``names`` in module order: attention, MLP, then the norms as
    transformers registers them) in the order its forward uses them: the input norm first, the post-attention
    norm just before the first MLP parameter. Backward makes the gradients in the reverse order."""
    order = [i for i, n in enumerate(names) if _INPUT_NORM not in n and _POST_ATTENTION_NORM not in n]
    post = [i for i, n in enumerate(names) if _POST_ATTENTION_NORM in n]
    at = next((k for k, i in enumerate(order) if _MLP in names[i]), len(order))
    order[at:at] = post
    return [i for i, n in enumerate(names) if _INPUT_NORM in n] + order


def rank_buckets(ctx: Any, stage: Any) -> DdpBuckets:
    """``DdpBuckets`` of ``stage``'s DDP rank of ``ctx`` (``states/budget.local_groups``): the parameters in module
    order (embeddings, each layer's, the final norm and head) and in the order backward makes their gradients
    (the head's, the final norm's, each layer's from the top in reverse forward use, ``layer_use_order``, the
    embeddings' last: a tied embedding's two parts are summed at the bottom)."""
    from memsim_widget.engine.states.budget import local_groups

    groups = local_groups(ctx, stage)
    layers = max(stage.layers, 1)
    pre = [g.numel_each for g in groups if g.group.scope == "pre" for _ in range(g.count)]
    post = [g.numel_each for g in groups if g.group.scope == "post" for _ in range(g.count)]
    body = [g for g in groups if g.group.scope == "layer"]
    layer = [g.numel_each for g in body for _ in range(max(g.count // layers, 1))]
    use = [
        n
        for i in layer_use_order([g.group.name for g in body])
        for n in [body[i].numel_each] * max(body[i].count // layers, 1)
    ]
    params = pre + layer * stage.layers + post
    ready = post[::-1] + use[::-1] * stage.layers + pre[::-1]
    return ddp_buckets(
        params, ready, ctx.recipe.weight_bytes, ctx.recipe.grad_bytes, find_unused_parameters(ctx)
    )
