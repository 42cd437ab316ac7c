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
  buffer is made once the first is unflattened back and freed. At world size 1 too. A bucket of one tensor
  (an embedding of 250 MiB or more) is broadcast as a view of it: no flat buffer (``broadcast_buffers``).
- Then the Reducer: ``compute_bucket_assignment_by_size`` walks the parameters that require a gradient in module
  order (``named_modules``, shared ones once) and closes a bucket once its bytes reach the current limit,
  the limits advancing along a list (the last repeats); per dtype and device. The limits at wrap time:
  ``[1 MiB, 25 MiB]`` (``_DEFAULT_FIRST_BUCKET_BYTES``, ``bucket_cap_mb`` 25) with
  ``find_unused_parameters=True``, else one bucket of everything (``sys.maxsize``; torch 2.13
  ``compute_bucket_size_limits``). DDP hands the list reversed to the Reducer, whose
  ``initialize_buckets`` allocates each bucket's flat gradient tensor (``at::empty``) in that order.
- Frozen parameters (LoRA under peft: the base frozen): broadcast all the same, bucketed not at all; the
  adapters alone fill the buckets. Mixed dtypes (a bf16 base beside fp32 adapters): each dtype's buckets apart,
  all sorted by the first tensor they hold (``compute_bucket_assignment_by_size``, the broadcast's too).
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
(``ddp_find_unused_parameters`` unset), True for any other model (a peft ``PeftModel``); accelerate leaves ``bucket_cap_mb`` unset at its own default of 25, so
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
    return typed_bucket_assignment([(size, "") for size in sizes], limits)


def typed_bucket_assignment(tensors: Sequence[tuple[int, str]], limits: Sequence[int]) -> tuple[int, ...]:
    """``bucket_assignment`` of (bytes, dtype) tensors: each dtype's buckets apart, with limits of its own, and
    all of them sorted by the first tensor they hold (``compute_bucket_assignment_by_size`` without tensor
    indices: the broadcast, the wrap-time buckets). A frozen bf16 base beside fp32 adapters: two lists."""
    return tuple(n for n, _ in _typed_buckets(tensors, limits))


def broadcast_buffers(tensors: Sequence[tuple[int, str]]) -> tuple[int, ...]:
    """The flat buffers the wrap-time broadcast allocates for (bytes, dtype) tensors in module order: its buckets
    (``typed_bucket_assignment`` at ``BROADCAST_BUCKET_BYTES``), 0 for those holding one tensor, which
    ``flatten_dense_tensors`` returns as a view of that tensor (``torch/csrc/utils/tensor_flatten.h``: a single
    tensor is ``contiguous().view(-1)``, no ``cat``), as an embedding of 250 MiB or more is; such a bucket still
    takes one of the two in-flight places (``DdpWriter.wrap``)."""
    return tuple(n if count > 1 else 0 for n, count in _typed_buckets(tensors, [BROADCAST_BUCKET_BYTES]))


def _typed_buckets(tensors: Sequence[tuple[int, str]], limits: Sequence[int]) -> list[tuple[int, int]]:
    """``typed_bucket_assignment``'s buckets as (bytes, tensors held)."""
    open_: dict[str, list[int]] = {}  # dtype: [its open bucket's first tensor, bytes, tensors]
    level: dict[str, int] = {}
    done: list[tuple[int, int, int]] = []
    for i, (size, key) in enumerate(tensors):
        b = open_.setdefault(key, [i, 0, 0])
        b[1] += size
        b[2] += 1
        k = level.setdefault(key, 0)
        if b[1] >= limits[k]:
            done.append((b[0], b[1], b[2]))
            del open_[key]
            level[key] = min(k + 1, len(limits) - 1)
    done += [(first, n, count) for first, n, count in open_.values() if n]
    return [(n, count) for _, n, count in sorted(done)]


@dataclass(frozen=True)
class DdpBuckets:
    """A DDP rank's buffers: the wrap-time broadcast's flat buffers (module order; 0: a bucket of one tensor,
    no buffer), the buckets allocated at wrap time (in allocation order), the buckets the rebuild allocates
    (none: no rebuild) and the bytes of the used-parameter map (0 without ``find_unused_parameters``)."""

    broadcast: tuple[int, ...]
    initial: tuple[int, ...]
    rebuilt: tuple[int, ...]
    used_map: int = 0


def find_unused_parameters(ctx: Any) -> bool:
    """HF Trainer's ``find_unused_parameters`` with ``ddp_find_unused_parameters`` unset (transformers 5.24
    ``Trainer._build_accelerator_args``): for a ``PreTrainedModel``, True unless activation checkpointing is on;
    for any other model True, and peft's ``PeftModel`` (LoRA, QLoRA) is no ``PreTrainedModel`` (peft 0.21)."""
    return not ctx.full_training or ctx.scenario.activation_checkpointing == "none"


def buckets_of(
    weights: Sequence[int | tuple[int, str]], grads: Sequence[int], ready: Sequence[int], find_unused: bool
) -> DdpBuckets:
    """``DdpBuckets`` from bytes: ``weights`` every parameter tensor's (frozen ones too: the broadcast syncs them
    all) in module order, as bytes or (bytes, dtype); ``grads`` the gradients of those that require one in
    module order (DDP buckets only them, all of one dtype) and ``ready`` the same gradients in the order
    backward makes them."""
    limits = [FIRST_BUCKET_BYTES, BUCKET_CAP_BYTES]
    typed = [w if isinstance(w, tuple) else (w, "") for w in weights]
    return DdpBuckets(
        broadcast_buffers(typed),
        bucket_assignment(grads, limits if find_unused else [sys.maxsize])[::-1],
        () if find_unused else bucket_assignment(ready, limits),
        USED_MAP_BYTES * len(grads) if find_unused else 0,
    )


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
        for size in self.b.broadcast:  # 0: a bucket of one tensor, broadcast as a view of it
            if len(in_flight) >= BROADCAST_IN_FLIGHT:
                s.free(in_flight.pop(0))
            in_flight.append(s.alloc(size) if size else [])
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


def weight_dtype(ctx: Any) -> str:
    """The dtype of the base weights: fp32 for a 4-byte recipe (fp32, autocast), else the pure recipe's name."""
    return "fp32" if ctx.recipe.weight_bytes == 4 else ctx.scenario.precision


def _tensors(ctx: Any, lg: Any, adapters: dict[str, Any]) -> list[tuple[int, int, str, bool]]:
    """One of ``lg``'s parameters as DDP sees it: (elements, bytes per element, dtype, requires grad) of each
    tensor in module order. Under LoRA the base weight is frozen, and peft's adapter on it (A: r x in, then B:
    out x r, ``LoraLayer``'s ``lora_A`` registered before ``lora_B``, both after ``base_layer``) trains. Under
    QLoRA a quantised base weight is bitsandbytes' ``Params4bit``: its packed NF4 codes, ceil(n / 2) uint8
    (``functional.quantize_4bit``, ``quant_storage`` uint8, bitsandbytes 0.50.2), all DDP broadcasts; its
    absmax and code live on the ``QuantState``, no parameter or buffer, so neither is broadcast."""
    from memsim_widget.engine.states.weights import stored_in_nf4

    n, b, dt = lg.numel_each, ctx.recipe.weight_bytes, weight_dtype(ctx)
    if stored_in_nf4(ctx, lg.group.kind, lg.group.module, lg.shape):
        n, b, dt = -(-n // 2), 1, "uint8"
    if ctx.full_training:
        return [(n, b, dt, True)]
    out = [(n, b, dt, False)]
    ad = adapters.get(lg.group.name)
    if ad is not None:
        dt = ctx.scenario.lora.adapter_dtype
        out += [(ad.rank * ad.in_features, ctx.adapter_bytes, dt, True)]
        out += [(ad.out_features * ad.rank, ctx.adapter_bytes, dt, True)]
    return out


def rank_buckets(ctx: Any, stage: Any) -> DdpBuckets:
    """``DdpBuckets`` of ``stage``'s DDP rank of ``ctx`` (``states/budget.local_groups``): the parameters in module
    order (embeddings, each layer's, the final norm and head) and in the order backward makes their gradients
    (the head's, the final norm's, each layer's from the top in reverse forward use, ``layer_use_order``, the
    embeddings' last: a tied embedding's two parts are summed at the bottom). Under LoRA (``_tensors``) every
    tensor is broadcast and the adapters alone are bucketed, in module order (``find_unused_parameters``: no
    rebuild, so no ready order)."""
    from memsim_widget.engine.states.budget import local_groups

    groups = local_groups(ctx, stage)
    layers = max(stage.layers, 1)
    adapters = {ad.base.name: ad for ad in ctx.adapters}
    t = {id(g): _tensors(ctx, g, adapters) for g in groups}
    pre = [x for g in groups if g.group.scope == "pre" for _ in range(g.count) for x in t[id(g)]]
    post = [x for g in groups if g.group.scope == "post" for _ in range(g.count) for x in t[id(g)]]
    body = [g for g in groups if g.group.scope == "layer"]
    layer = [x for g in body for _ in range(max(g.count // layers, 1)) for x in t[id(g)]]
    use = [
        x
        for i in layer_use_order([g.group.name for g in body])
        for _ in range(max(body[i].count // layers, 1))
        for x in t[id(body[i])]
    ]
    params = pre + layer * stage.layers + post
    ready = post[::-1] + use[::-1] * stage.layers + pre[::-1]
    grad_b = ctx.recipe.grad_bytes if ctx.full_training else ctx.adapter_bytes
    return buckets_of(
        [(n * b, dt) for n, b, dt, _ in params],
        [n * grad_b for n, _, _, trains in params if trains],
        [n * grad_b for n, _, _, trains in ready if trains],
        find_unused_parameters(ctx),
    )
