"""What FSDP2 allocates, on which CUDA stream and when it frees it, for the allocation stream of one rank
(``engine/counters/alloc_stream.py``): ``fully_shard`` on each decoder layer, then on the root (embeddings,
final norm, head), the layout ``states/gathered.py`` counts and ``trace/distributed.py`` traces.

Source: torch 2.13.0, ``torch/distributed/fsdp/_fully_shard/`` (``_fsdp_param_group.py``,
``_fsdp_collectives.py``, ``_fsdp_state.py``); restated, nothing copied:

- ``FSDPCommContext.lazy_init`` makes an all-gather copy-in stream, an all-gather stream, a reduce-scatter
  stream and an all-reduce stream (HSDP). The caching allocator caches a block on the stream it was allocated
  on, so a block freed by one stream's requests never serves another's; FSDP2 keeps references until the
  consuming stream has waited (``AllGatherState``, ``ReduceScatterState``) instead of ``record_stream``.
- ``unshard`` -> ``foreach_all_gather``: in forward and pre-backward, under the copy-in stream, the unit's
  shards cast to the gathered dtype (mixed precision only: one buffer, freed once copied in) and the all-gather
  output (world x the
  unit's padded shard; the copy-in buffer is a view of it).
- ``wait_for_unshard``: copies out into the unsharded parameters (``foreach_all_gather_copy_out``, on the
  compute stream, one tensor per parameter); in forward it holds this unit's all-gather output
  (``all_gather_state``, so the copy-in stream cannot reuse memory still being read) and frees the previous
  unit's, which its local ``prev_all_gather_state`` keeps until the copy-out is done; in backward it frees
  the unit's own at once.
  The root's ``_post_forward`` frees the last one held.
- ``reshard`` frees the unsharded parameters after the unit's forward (``reshard_after_forward=True``; with
  an explicit True the root too, ``_fsdp_state._lazy_init``) and after its backward.
- ``pre_backward`` gathers the unit again (unless still unsharded) and ``_backward_prefetch`` issues the
  all-gather of the unit that ran before it in forward (``post_forward_order``).
- ``post_backward``: reshard, then free the oldest reduce-scatter input still held
  (``reduce_scatter_max_input_buffers`` = 1), then ``foreach_reduce``: the reduce-scatter input (world x the
  padded shard in ``reduce_dtype``) on the compute stream, the unsharded gradients freed once copied in, the
  reduce-scatter output (the padded shard) on the reduce-scatter stream: the new gradient shards are views of
  it, so it lives until ``zero_grad`` frees the unit's last one. The root's runs last (its embedding gradient
  is made last), from ``_root_post_backward_final_callback``, which then frees the input still held.

- Gradient accumulation (``Fsdp2Units.accumulation``, the framework's loop: ``frameworks.FrameworkProfile.
  fsdp2_accumulation``): under ``set_requires_gradient_sync(False)`` (``"no_sync"``) ``post_backward`` reshards
  and returns before the reduce, so the unsharded gradients stay on the unsharded parameters and the next
  micro-batch's are added in place; reduce-scattering every micro-batch (``"reduce"``), ``foreach_reduce`` adds
  the new output to the sharded gradient (``sharded_param.grad._local_tensor += new_sharded_grad``) and drops it.

- Frozen parameters (LoRA: peft's adapters beside the frozen base in each unit): every parameter is gathered,
  as bytes where the dtypes differ (``foreach_all_gather``: uint8); only those with an unsharded gradient are
  reduce-scattered (``post_backward``'s ``fsdp_params_with_grad``), and a unit without one reduces nothing.

- HSDP (``fully_shard`` on a replicate x shard mesh, ``parallel.dp_shard``): the units are sharded over the
  shard group (``world`` = dp_shard x cp) and ``foreach_reduce`` all-reduces each reduce-scatter output in
  place across the replicas on the all-reduce stream, which becomes the post-reduce stream; with ``reduce_dtype``
  the parameters' own nothing is allocated there (no cast), and ``FSDPParamGroup._all_reduce_state`` holds
  the output -- already the gradient shards' storage -- until the group's next ``post_backward`` or
  ``finalize_backward``: the same allocations as FSDP2 over the shard group alone. Under gradient
  accumulation that reduces every micro-batch (``"reduce"``) the held output of a later micro-batch is a
  buffer of its own (the gradient already exists and takes ``+=``), kept to the end of that backward: not
  written (up to one more gradient shard late in backward; ``caveats.hybrid_caveat`` says so).

Not modelled here: a ``reduce_dtype`` other than the
parameters' own dtype (the cast on the post-reduce stream; under ``no_sync`` the fp32 accumulated copy),
gradient accumulation without resharding after backward, explicit prefetching, QLoRA's NF4 base and frozen
towers, CPU offload (``replayable.replayable`` keeps the fitted rule for them; docs/allocator.md, "FSDP2's
streams", says why each of QLoRA and CPU offload is not traced).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

from memsim_widget.fast_dataclass import dataclass

#: The CUDA streams a rank allocates on, as the replays number them: the compute stream and FSDP2's
#: communication streams (``FSDPCommContext.lazy_init``). The all-gather stream itself allocates nothing (its
#: output is made under the copy-in stream).
FSDP_STREAMS = {"compute": 0, "all_gather_copy_in": 1, "reduce_scatter": 2, "all_reduce": 3, "all_gather": 4}
COMPUTE, COPY_IN, REDUCE_SCATTER = (
    FSDP_STREAMS["compute"],
    FSDP_STREAMS["all_gather_copy_in"],
    FSDP_STREAMS["reduce_scatter"],
)


def padded_shard(shape: Sequence[int], world: int) -> int:
    """Elements of one rank's FSDP2 shard of a tensor of ``shape``: dim 0 padded to a multiple of ``world``
    (``FSDPParam._init_sharded_param``: ``torch.chunk`` then padding to the first chunk's size)."""
    if not shape:
        return 1
    return -(-shape[0] // world) * prod(shape[1:])


@dataclass(frozen=True)
class Fsdp2Units:
    """A rank's FSDP2 units: each tensor's (elements, padded shard elements) in module order, or under LoRA
    (elements, padded shard elements, bytes per element, trains: 0 for the frozen base, 1 for peft's adapters;
    ``trains``), for one decoder layer and for the root (embeddings first, then final norm and head); ``world``
    the shard group's size, ``gathered`` the bytes per element of the unsharded parameters and their gradients
    (of the tensors without bytes of their own), ``reduced`` of the reduce-scatter buffers (``reduce_dtype``),
    ``cast`` whether the copy-in casts the shards to ``gathered`` (mixed precision), ``reshard``
    ``reshard_after_forward``."""

    layer: tuple[tuple[int, ...], ...]
    root: tuple[tuple[int, ...], ...]
    #: how many of ``root``'s tensors are the input side (the embeddings: their gradient is made last)
    root_pre: int
    world: int
    gathered: int
    reduced: int
    sharded: int
    cast: bool
    reshard: bool
    #: the loop computes the loss on the logits outside the model (torchtitan): the root's post-forward runs
    #: before the loss, its pre-backward (a hook on the logits) once the loss's backward has made their gradient
    loss_outside: bool = False
    #: the head is the input embeddings (tied): the head's backward makes the embeddings' first gradient at the
    #: top, their own backward a second at the bottom, which ``AccumulateGrad`` sums out of place
    tied: bool = False
    #: under gradient accumulation, the micro-batches before a step's last: reduce-scattered (``"reduce"``) or
    #: under ``set_requires_gradient_sync(False)`` (``"no_sync"``; ``frameworks.FrameworkProfile``)
    accumulation: str = "reduce"
    #: under ``fp8_all_gather`` the bytes per element of the sharded weights torchao casts to fp8 before each
    #: all-gather (0: no tensor is gathered in fp8; ``Fsdp2Writer._fp8_casts``)
    fp8_shard_bytes: int = 0

    def micro(self, w: Fsdp2Writer, m: int, micro: int) -> None:
        """Set writer ``w`` for micro-batch ``m`` of ``micro`` in a step."""
        w.no_sync = self.accumulation == "no_sync" and m < micro
        w.accumulate = self.accumulation == "reduce" and m > 1


class Fsdp2Writer:
    """Writes FSDP2's buffers into an allocation stream (``alloc_stream.StreamWriter``) at the points of a
    micro-batch ``alloc_stream.micro_batch`` calls it at; ``Fsdp2Units`` gives the sizes."""

    def __init__(self, s: Any, u: Fsdp2Units) -> None:
        self.s, self.u = s, u
        self.held: list[int] = []  # the all-gather output held until the next copy-out (forward)
        self.prefetched: list[int] = []  # the all-gather output of the unit backward runs next
        self.root: list[int] = []  # the root's unsharded parameters
        self.layers: list[list[int]] = []  # the unsharded layers (kept for backward without resharding)
        self.rs_input: list[int] = []  # the reduce-scatter input still held
        self.grads: list[int] = []  # reduce-scatter outputs: the gradient shards, layer 0's first, root last
        #: a later micro-batch of a step that reduce-scatters every micro-batch: its outputs added to the shards
        self.accumulate = False
        #: a micro-batch under ``set_requires_gradient_sync(False)``: no reduce-scatter, the unsharded gradients
        #: kept on the unsharded parameters (``no_sync``)
        self.no_sync = False
        self.unsynced: dict[int, list[int]] = {}  # the kept unsharded gradients, by unit (-1: the root)

    def _all_gather(self, unit: Sequence[tuple[int, ...]]) -> list[int]:
        """``foreach_all_gather`` under the copy-in stream: the cast shards (freed) and the output."""
        s, u = self.s, self.u
        fp8 = self._fp8_casts([t for t in unit if in_fp8(t)])
        cast = s.alloc(sum(t[1] for t in unit if not in_fp8(t)) * u.gathered, 1, COPY_IN) if u.cast else []
        # mixed dtypes (a frozen bf16 base beside fp32 adapters) gather as bytes (``foreach_all_gather``: uint8)
        out = s.alloc(u.world * sum(t[1] * self._bytes(t) for t in unit), 1, COPY_IN)
        s.free(cast + fp8)
        return out

    def _fp8_casts(self, weights: Sequence[tuple[int, ...]]) -> list[int]:
        """torchao's ``fsdp_pre_all_gather`` of each fp8-gathered weight shard, on the copy-in stream: its amax
        (``abs`` of the shard, freed once reduced), then ``hp_tensor_and_scale_to_float8``: the shard upcast to fp32
        (none when it is fp32), times the scale, freed upcast, clamped, cast to fp8; the fp8 shards (returned)
        live until copied into the all-gather input. Source: torchao 0.18.0 ``float8/fsdp_utils.py``,
        ``float8/float8_scaling_utils.py`` ``hp_tensor_to_float8_dynamic``, ``float8/float8_utils.py``
        ``tensor_to_amax``, ``to_fp8_saturated``; traced (benchmarks/fp8_all_gather.py, the same order)."""
        s, sb = self.s, self.u.fp8_shard_bytes
        out: list[int] = []
        for t in weights:
            n = t[1]
            s.free(s.alloc(n * sb, 1, COPY_IN))  # abs, reduced to the amax
            up = s.alloc(n * 4, 1, COPY_IN) if sb != 4 else []
            scaled = s.alloc(n * 4, 1, COPY_IN)
            s.free(up)
            clamped = s.alloc(n * 4, 1, COPY_IN)
            out += s.alloc(n, 1, COPY_IN)
            s.free(scaled + clamped)
        return out

    def _copy_out(self, unit: Sequence[tuple[int, ...]]) -> list[int]:
        """The unsharded parameters, one tensor each, on the compute stream."""
        return [h for t in unit for h in self.s.alloc(t[0] * self._bytes(t))]

    def _bytes(self, t: tuple[int, ...]) -> int:
        """Bytes per element of tensor ``t`` of a unit: its own (frozen parameters beside adapters, fp8-gathered
        weights), else ``gathered``."""
        return t[2] if len(t) > 2 else self.u.gathered

    def _grad_bytes(self, t: tuple[int, ...]) -> int:
        """Bytes per element of tensor ``t``'s unsharded gradient: its own (an fp8-gathered weight's is in
        ``gathered``), else the tensor's."""
        return t[4] if len(t) > 4 else self._bytes(t)

    def forward_start(self) -> None:
        """The root's pre-forward: gathered, copied out, its all-gather output held."""
        ag = self._all_gather(self.u.root)
        self.root = self._copy_out(self.u.root)
        self.held = ag

    def layer_forward_start(self) -> None:
        """A layer's pre-forward: its all-gather, the copy-out, the previous output freed (``wait_for_unshard``
        drops ``all_gather_state`` first, but its local ``prev_all_gather_state`` holds it until it returns)."""
        ag = self._all_gather(self.u.layer)
        self.layers.append(self._copy_out(self.u.layer))
        self.s.free(self.held)
        self.held = ag

    def layer_forward_end(self) -> None:
        """A layer's post-forward: resharded (``reshard_after_forward``)."""
        if self.u.reshard:
            self.s.free(self.layers.pop())

    def forward_end(self) -> None:
        """The root's post-forward (after the loss, computed inside it): resharded, the last output freed."""
        if self.u.reshard:
            self.s.free(self.root)
            self.root = []
        self.s.free(self.held)
        self.held = []

    def backward_start(self, layers: int) -> None:
        """The root's pre-backward (its hook on the loss): gathered again, then the last layer's all-gather
        prefetched."""
        if self.u.reshard:
            ag = self._all_gather(self.u.root)
            self.root = self._copy_out(self.u.root)
            self.s.free(ag)
            if layers:
                self.prefetched = self._all_gather(self.u.layer)

    def layer_backward_start(self, index: int) -> None:
        """Layer ``index``'s pre-backward: copied out of its prefetched all-gather (which is freed), the next
        layer down prefetched."""
        if not self.u.reshard:
            return
        self.layers.append(self._copy_out(self.u.layer))
        self.s.free(self.prefetched)
        self.prefetched = self._all_gather(self.u.layer) if index > 0 else []

    def unsharded_grads(self, unit: Sequence[tuple[int, ...]], key: int | None = None) -> list[int]:
        """The unsharded gradients autograd makes for ``unit``'s parameters (the gathered dtype); where an earlier
        micro-batch under ``no_sync`` kept unit ``key``'s, each new one is added in place and freed
        (``AccumulateGrad``) and the kept ones are returned."""
        made = [t for t in unit if trains(t)]  # frozen parameters get none
        if key is not None and key in self.unsynced:
            for t in made:
                self.s.free(self.s.alloc(t[0] * self._grad_bytes(t)))
            return self.unsynced.pop(key)
        return [h for t in made for h in self.s.alloc(t[0] * self._grad_bytes(t))]

    def post_backward(self, grads: list[int], root: bool = False, key: int = -1) -> None:
        """A unit's post-backward: resharded, the oldest reduce-scatter input freed, the reduce-scatter; under
        ``no_sync`` resharded only, the gradients kept (``FSDPParamGroup.post_backward`` returns before the
        reduce: ``reduce_grads`` is off)."""
        s, u = self.s, self.u
        s.free(self.root if root else self.layers.pop())
        if self.no_sync:
            self.unsynced[key] = grads
            return
        s.free(self.rs_input)
        self.rs_input = []
        unit = u.root if root else u.layer
        shard = sum(t[1] for t in unit if trains(t))
        if (
            not shard
        ):  # nothing trains in the unit: no reduce (``post_backward`` returns once it has recycled)
            return
        self.rs_input = s.alloc(u.world * shard * u.reduced)
        s.free(grads)
        out = s.alloc(shard * u.sharded, 1, REDUCE_SCATTER)
        if self.accumulate:  # added to the sharded gradient in place, freed as ``foreach_reduce`` returns
            s.free(out)
        else:
            self.grads += out
        if root:  # the final callback frees the input still held
            s.free(self.rs_input)
            self.rs_input = []

    def backward(
        self,
        a: dict[str, Sequence[Any]],
        saved: list[list[int]],
        done: list[int],
        workspaces: Sequence[int] = (),
    ) -> None:
        """A micro-batch's backward from the head down (``alloc_stream.micro_batch``'s order; ``a`` its
        activation groups, ``saved`` each layer's saved tensors, ``done`` what the head's backward frees,
        ``workspaces`` the autograd thread's cuBLAS workspaces, made at the head's matmuls): the head's and
        final norm's unsharded gradients at the top, the final norm's backward, each layer gathered, its
        backward, its unsharded gradients reduce-scattered; the embeddings' gradient last, then the root's
        reduce-scatter."""
        s, u = self.s, self.u
        kept = self.unsynced.pop(-1, None)  # the root's, kept by an earlier micro-batch under no_sync
        head = self.unsharded_grads(u.root[: u.root_pre]) if u.tied else []  # waits in autograd's buffer
        if kept is None:
            top = self.unsharded_grads(u.root[u.root_pre :])
        else:  # each new one added in place and freed
            self.unsynced[-1] = kept[u.root_pre :]
            top = self.unsharded_grads(u.root[u.root_pre :], -1)
        for size in workspaces:  # never freed
            s.alloc(size)
        s.free(done + s.items(a["top_backward"]))
        for i in reversed(range(len(saved))):
            self.layer_backward_start(i)
            recomputed, own = layer_recompute(s, a, saved[i])
            grads = self.unsharded_grads(u.layer[::-1], i)  # autograd: the MLP's first, the input norm's last
            transient = layer_backward_buffers(s, a, own)
            s.free(transient + recomputed + saved[i] + ([] if own is saved[i] else own))
            self.post_backward(grads, key=i)
        full = self.partial_embedding_grads(a)
        bottom = self.unsharded_grads(u.root[: u.root_pre])
        s.free(full)
        if u.tied:  # the two summed into a new tensor, both freed
            summed = self.unsharded_grads(u.root[: u.root_pre])
            s.free(head + bottom)
            bottom = summed
        if kept is not None:  # the embeddings' (or the sum) added in place and freed
            s.free(bottom)
            bottom = kept[: u.root_pre]
        self.post_backward(bottom + top, root=True)

    def partial_embedding_grads(self, a: dict[str, Sequence[Any]]) -> list[int]:
        """An untied embedding TP shards by vocabulary (torchtitan's plan, ``tp_stream.EMBEDDING_GRAD``): DTensor's
        ``embedding_dense_backward`` makes the Partial gradient of the whole table (tp shards' worth) before
        FSDP2's ``_get_grad_inner_tensor`` redistributes it to the parameter's Shard(0), the unsharded gradient
        written next; the full one is freed once that copy exists (traced; ``states/gathered._root_grads_made``).
        Its handles, or none."""
        u = self.u
        f = 1 if u.tied else a.get("embedding_grad", (1,))[0]
        if f == 1:
            return []
        return [h for t in u.root[: u.root_pre] if trains(t) for h in self.s.alloc(t[0] * self._bytes(t) * f)]

    def zero_grad(self) -> None:
        """``zero_grad(set_to_none=True)``: each unit's output freed with its last gradient (parameter order:
        the layers' in turn, the root's with the head's, last)."""
        self.s.free(self.grads)
        self.grads = []


def layer_recompute(s: Any, a: dict[str, Sequence[Any]], saved: list[int]) -> tuple[list[int], list[int]]:
    """A checkpointed layer's recompute before its backward: op by op where ``a`` lists its steps
    (``compiled_backward.LAYER_RECOMPUTE``: an eager-attention layer, ``activations/eager_core_steps``), else the
    ``recompute`` items: (what is freed with the layer's buffers, the saved tensors its backward frees by place:
    the recomputed ones, else the layer's ``saved``)."""
    from memsim_widget.engine.activations.compiled_backward import LAYER_RECOMPUTE
    from memsim_widget.engine.activations.forward import SAVED_AT

    steps = a.get(LAYER_RECOMPUTE, ())
    if not steps:
        return s.items(a["recompute"]), saved
    live: dict[str, list[int]] = {}
    # its saved tensors, each made with its size where its SAVED_AT step says
    placed: dict[int, list[int]] = {}
    for name, size in steps:
        if name.startswith(SAVED_AT):
            placed[int(name[len(SAVED_AT) :])] = s.alloc(size)
        elif size > 0:
            live[name] = s.alloc(size)
        else:
            s.free(live.pop(name))
    return [h for hs in live.values() for h in hs], [h for p in sorted(placed) for h in placed[p]]


def layer_backward_buffers(s: Any, a: dict[str, Sequence[Any]], saved: list[int]) -> list[int]:
    """A layer's backward buffers on a sharded rank (``Fsdp2Writer``'s and ``zero3_stream.Zero3Writer``'s, whose
    gradients are their own, made at the layer's start): op by op where ``a`` lists the layer's steps
    (``compiled_backward.LAYER_BACKWARD``: an eager-attention layer, ``activations/eager_core_steps``; each
    buffer made and freed in order, each saved tensor freed, and dropped from ``saved``, where its ``FREE_SAVED``
    step says; a gradient step names nothing made here), else the ``layer_backward`` items. The handles still
    alive, CUDA's scratch items among them."""
    from memsim_widget.engine.activations.compiled_backward import FREE_SAVED, LAYER_BACKWARD

    steps = a.get(LAYER_BACKWARD, ())
    if not steps:
        return s.items(a["layer_backward"])
    kept = dict(enumerate(saved))
    live: dict[str, list[int]] = {}
    for name, size in steps:
        if name.startswith(FREE_SAVED):
            s.free([kept.pop(int(name[len(FREE_SAVED) :]))])
        elif size > 0:
            live[name] = s.alloc(size)
        elif name in live:  # a gradient or CUDA-scratch step names nothing made here
            s.free(live.pop(name))
    saved[:] = kept.values()
    return [h for hs in live.values() for h in hs] + s.items(
        [x for x in a["layer_backward"] if x.level == "allocator"]
    )


def in_fp8(t: tuple[int, ...]) -> bool:
    """Whether a unit's tensor ``t`` is gathered in fp8 (elements, shard, 1, trains, gradient bytes: torchao's
    float8 weights under ``fp8_all_gather``)."""
    return len(t) > 4


def trains(t: tuple[int, ...]) -> bool:
    """Whether a unit's tensor ``t`` gets a gradient: (elements, shard) trains, (elements, shard, bytes, trains)
    says."""
    return len(t) < 4 or bool(t[3])


#: torchao's NF4 layout (``to_nf4`` defaults): elements per scaler block and scaler blocks per factor
NF4_BLOCK, NF4_SCALER_BLOCK = 64, 256


def nf4_parts(n: int, world: int) -> list[tuple[int, ...]]:
    """A frozen NF4 weight of ``n`` elements as FSDP2 gathers it (torchao 0.18.0 ``NF4Tensor.fsdp_pre_all_gather``:
    three all-gather inputs, each sharded along dim 0 by ``world``): its int8 scalers (one per 64-element
    block), fp32 factors (one per 256 scalers) and uint8 codes (two per byte), as (elements, shard, bytes, 0)."""
    scalers = n // NF4_BLOCK
    parts = ((scalers, 1), (scalers // NF4_SCALER_BLOCK, 4), (n // 2, 1))
    return [(k, -(-k // world), b, 0) for k, b in parts]


def fsdp2_units(ctx: Any, stage: Any) -> Fsdp2Units:
    """``Fsdp2Units`` of ``stage``'s rank of ``ctx`` (``states/budget.local_groups``; bytes as
    ``states/gathered`` counts them: ``frameworks.gathered_weight_bytes``, the recipe's gradient bytes)."""
    from memsim_widget.engine.frameworks import fp8_gathered, fp8_linear_weight, gathered_weight_bytes
    from memsim_widget.engine.states.budget import local_groups
    from memsim_widget.engine.states.weights import stored_in_nf4

    world = ctx.par.shard_degree  # HSDP: each unit is sharded over its shard group only
    wb = gathered_weight_bytes(ctx)
    fp8 = fp8_gathered(ctx)
    grad_b = ctx.recipe.grad_bytes
    adapters = {ad.base.name: ad for ad in ctx.adapters}
    layer: list[tuple[int, ...]] = []
    pre: list[tuple[int, ...]] = []
    post: list[tuple[int, ...]] = []
    for lg in local_groups(ctx, stage):
        t: list[tuple[int, ...]] = [(lg.numel_each, padded_shard(lg.shape, world))]
        if stored_in_nf4(ctx, lg.group.kind, lg.group.module, lg.shape):
            t = nf4_parts(lg.numel_each, world)
        elif not ctx.full_training:  # LoRA: the base frozen, its adapters (A: r x in, B: out x r) after it
            t = [(*t[0], wb, 0)]
        elif fp8 and fp8_linear_weight(lg.group.scope, lg.group.module, lg.group.kind):
            t = [(*t[0], 1, 1, wb)]  # gathered in fp8, its unsharded gradient in the gathered dtype
        if not ctx.full_training:
            ad = adapters.get(lg.group.name)
            if ad is not None:
                ab, r = ctx.adapter_bytes, ad.rank
                a_shape, b_shape = (r, ad.in_features), (ad.out_features, r)
                t += [(r * ad.in_features, padded_shard(a_shape, world), ab, 1)]
                t += [(ad.out_features * r, padded_shard(b_shape, world), ab, 1)]
                grad_b = ab
        if lg.group.scope == "layer":
            layer += t * max(lg.count // max(stage.layers, 1), 1)
        else:
            (pre if lg.group.scope == "pre" else post).extend(t * lg.count)
    from memsim_widget.engine.frameworks import profile

    return Fsdp2Units(
        tuple(layer), tuple(pre + post), len(pre), world, wb, grad_b, grad_b, wb != ctx.recipe.weight_bytes,
        ctx.par.reshard_after_forward, profile(ctx).loss_outside_model, ctx.arch.tied_embeddings,
        profile(ctx).fsdp2_accumulation or "reduce", ctx.recipe.weight_bytes if fp8 else 0,
    )  # fmt: skip
