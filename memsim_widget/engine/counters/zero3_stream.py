"""What a DeepSpeed ZeRO-3 rank allocates and frees, and when, for the allocation stream
(``engine/counters/alloc_stream.py``): ``DeepSpeedZeroOptimizer_Stage3`` as HF Trainer / accelerate run it with a
bf16 model (``bf16.enabled``), full training, any number of micro-batches a step, no offload (see below), DeepSpeed's stage-3
defaults
(``runtime/zero/config.py``: ``stage3_prefetch_bucket_size`` 5e7, ``stage3_max_live_parameters`` and
``stage3_max_reuse_distance`` 1e9, ``stage3_param_persistence_threshold`` 1e5 elements, ``sub_group_size`` 1e9,
``contiguous_gradients``, ``reduce_scatter`` and ``overlap_comm`` true) but ``reduce_bucket_size``
(``parallel.reduce_bucket_size``, default 5e8 elements).

Source: deepspeed 0.19.8, ``deepspeed/runtime/zero/stage3.py`` (``__init__``, ``_setup_for_real_optimizer``,
``create_reduce_and_remove_grad_hooks``, ``reduce_independent_p_g_buckets_and_remove_grads``,
``__add_grad_to_ipg_bucket``, ``__reduce_and_partition_ipg_grads``, ``partition_grads``, ``_create_fp16_sub_groups``,
``step``, ``_get_norm_groups``, ``get_grad_norm_direct``, ``_prepare_fp32_grad_for_sub_group``),
``runtime/zero/partitioned_param_coordinator.py`` (``fetch_sub_module``, ``release_sub_module``,
``__params_to_release``, ``__all_gather_params``), ``runtime/zero/parameter_offload.py`` (``setup_zero_stage3_hooks``,
``pre_sub_module_forward_function``: the fetches are module forward hooks, so a checkpointed layer's recompute
fetches again) and ``runtime/zero/partition_parameters.py``
(``_all_gather_sequential``, ``_all_gather_coalesced``, ``AllGatherCoalescedHandle.wait``, ``_partition_param``).
Restated, nothing copied; held to a CPU run of the real optimizer (PyTorch's fake process group at world size 4,
``benchmarks/zero_trace.py --stage 3``, docs/allocator.md "DeepSpeed ZeRO-3 ranks"):

- **Wrap** (``deepspeed.initialize``): each parameter partitioned (a ``ceil(numel / dp)``-element ``ds_tensor``,
  the whole weight freed); the partitions copied into one flat bf16 buffer (``fp16_partitioned_groups_flat``,
  the per-parameter partitions freed); per sub group (an optimizer group, split at ``sub_group_size``) the fp32
  master partition and a same-sized fp32 copy made and dropped, then ``initialize_optimizer_states``' fp32 zero
  gradient per sub group, made and dropped; the ipg bucket (``reduce_bucket_size`` bf16 elements, made once, kept:
  ``bucket.buffer``) and the gradient partitions' flat buffer (the rank's partitions in bf16, kept);
  ``create_reduce_and_remove_grad_hooks`` gathers and re-partitions each parameter in turn; the parameters of at
  most ``stage3_param_persistence_threshold`` elements (norms) are persisted: gathered once, never released.
- **Fetch and release** (the coordinator, per module: a decoder layer's Linears here written at the layer's
  start and end): a module's parameters not available are all-gathered one at a time (``_all_gather_sequential``:
  a ``ceil(numel / dp) x dp``-element buffer, the parameter a view of it); on the first step (the trace is being
  recorded: ``reset_step`` runs at every forward's start, so the first forward records and every later one, the
  next micro-batch's or step's, finds it complete) every module's parameters are released after it; from the
  second on, a fetch first prefetches the
  parameters the recorded order needs next, up to ``stage3_prefetch_bucket_size`` elements (and
  ``stage3_max_live_parameters`` live), in one coalesced all-gather: a flat buffer of their partitions x dp, each
  parameter copied out of it (``torch.cat`` of its parts) when the first of them is waited on, the flat buffer freed
  once the last of them has been fetched; and a release keeps a parameter fetched for a later module or used
  again within ``stage3_max_reuse_distance`` elements of parameters. The step's first fetch is the root module's,
  which has no parameters of its own: it prefetches from the start.
- **Backward** (every micro-batch; ``partition_grads`` adds a later micro-batch's partitions in place): each
  gradient (bf16, whole) copied into the ipg bucket and freed (``contiguous_gradients``); when
  the next would overflow it, and after the last, ``__reduce_and_partition_ipg_grads`` reduce-scatters the bucket
  (a flat copy of its gradients, each padded to a multiple of dp, freed; none for a lone gradient that divides
  by dp: ``runtime/comm/coalesced_collectives.reduce_scatter_coalesced``) into the gradient partitions' buffer.
- **Checkpointing** (HF's full gradient checkpointing, non-reentrant): a layer's recompute runs its forward in
  the backward, the hooks fetching its parameters and releasing them after it, before its backward fetches them
  again; the first step records the recompute in the order like any module, so later steps keep them gathered
  (reuse distance). Megatron's selective checkpointing (an eager attention core under a checkpoint of its own)
  recomputes no parameter's module: the coordinator fetches nothing for it, the layer's steps write the recompute
  (``activations/eager_core_steps``; ``_layer_backward``). **Tied embeddings**: the head's weight is the embeddings' parameter, gathered again for the
  head (the first step released it after the embeddings); its gradient is the head's part (held) and the
  embeddings' part, summed out of place by autograd before the parameter's one hook.
- **Step**: the gradient norm casts each parameter's gradient partition to fp64 one at a time
  (``get_grad_norm_direct``, ``get_norm_dtype``); per sub group the partitions flattened (a bf16 copy when there are
  several) and cast to an fp32 gradient (the copy freed), the inner optimizer's states (first step) and
  temporaries on the fp32 partition, the fp32 gradient freed.

Not modelled: ``overlap_comm``'s ``reduce_and_partition_stream`` and the all-gather stream (on a GPU the bucket's
flat copy and the gathers are made on streams of their own, pools of their own in the caching allocator; a CPU trace
has one stream, so they stay on the compute stream here, untraced), module-level fetches inside a layer (a layer's
Linears are fetched together at its start, so up to one layer's parameters more are live than DeepSpeed's
one-module-at-a-time), parameter offload (``offload_optimizer`` is ``zero_offload_stream.py``'s, on these writers).
peft's LoRA (the adapters the only trained tensors, the frozen base partitioned
and gathered all the same) runs this writer on ``zero_lora.lora_zero3_units`` (bf16 adapters; replayed by default).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from memsim_widget.engine.counters.allocator import FREE as FREE_EVENT
from memsim_widget.engine.items import ALLOCATED_LEVELS
from memsim_widget.fast_dataclass import dataclass

#: ``stage3_prefetch_bucket_size``'s default (elements)
PREFETCH_BUCKET = 50_000_000
#: ``stage3_max_live_parameters`` and ``stage3_max_reuse_distance``'s defaults (elements)
MAX_LIVE = 1_000_000_000
MAX_REUSE = 1_000_000_000
#: ``stage3_param_persistence_threshold``'s default (elements): parameters this small stay gathered
PERSISTENCE = 100_000
#: ``sub_group_size``'s default (elements of a sub group's partition)
SUB_GROUP = 1_000_000_000
#: the fp32 master partition, the fp32 gradient of the step; the norm's fp64 casts
MASTER_BYTES, NORM_BYTES = 4, 8


@dataclass(frozen=True)
class Zero3Units:
    """A ZeRO-3 rank's parameter tensors (elements) in module order, for the input side (``pre``: the
    embeddings), one decoder layer and the output side (``post``: final norm, head), ``layers`` layers; each
    optimizer group's tensors as indices into the module order; ``dp`` ranks; the model's bytes per element; the
    ipg bucket, prefetch bucket, live and reuse limits and persistence threshold (elements)."""

    pre: tuple[int, ...]
    layer: tuple[int, ...]
    post: tuple[int, ...]
    layers: int
    groups: tuple[tuple[int, ...], ...]
    dp: int
    model_bytes: int = 2
    bucket: int = 500_000_000
    prefetch: int = PREFETCH_BUCKET
    max_live: int = MAX_LIVE
    reuse: int = MAX_REUSE
    persist: int = PERSISTENCE
    sub_group: int = SUB_GROUP
    #: the head module's post-forward runs as soon as it has made the logits, its pre-backward once the loss's
    #: backward has made their gradient (``alloc_stream``'s hook points for a root outside the loss)
    loss_outside: bool = True
    #: full activation checkpointing: each layer's recompute runs its forward again in the backward, the
    #: coordinator fetching (and after it releasing) the layer's parameters once more before its backward
    recompute: bool = False
    #: tied embeddings: the head's weight is the embeddings' (tensor 0), gathered again for the head and its
    #: gradient the sum of the head's and the embeddings' parts, hooked once
    tied: bool = False
    #: the input side's modules run a backward (their parameters train, or a tied head's gradient reaches them);
    #: under LoRA with a frozen embedding autograd never reaches it, so the coordinator's recorded order has it in
    #: the forward alone: released after it (nothing used again) and not fetched in the backward
    bottom_backward: bool = True
    #: bytes per element of the trained tensors where they differ from the model's (0: the model's): peft's fp32
    #: adapters, left fp32 under ``zero.Init`` (``zero_lora.lora_zero3_units``); their partitions, flat buffer,
    #: gathers and gradients are fp32, the ipg bucket and the gradient partitions' buffer stay the model's
    train_bytes: int = 0

    @property
    def numels(self) -> tuple[int, ...]:
        """Every tensor's elements in module order."""
        return self.pre + self.layer * self.layers + self.post

    @property
    def units(self) -> tuple[tuple[int, ...], ...]:
        """Each unit's tensors (indices into ``numels``): the input side, each layer, the output side."""
        n, k = len(self.pre), len(self.layer)
        out = [tuple(range(n))]
        out += [tuple(range(n + i * k, n + (i + 1) * k)) for i in range(self.layers)]
        at = n + self.layers * k
        return (*out, tuple(range(at, at + len(self.post))) + ((0,) if self.tied else ()))

    def part(self, p: int) -> int:
        """Elements of tensor ``p``'s partition (``ds_tensor``)."""
        return -(-self.numels[p] // self.dp)

    def parts(self) -> tuple[int, ...]:
        """Every tensor's partition elements, in module order."""
        return tuple(-(-n // self.dp) for n in self.numels)

    def bytes_each(self) -> tuple[int, ...]:
        """Every tensor's bytes per element, in module order: a trained one's ``train_bytes`` if set."""
        trained, tb = self.trained, self.train_bytes or self.model_bytes
        return tuple(tb if p in trained else self.model_bytes for p in range(len(self.numels)))

    @property
    def trained(self) -> frozenset[int]:
        """The tensors the optimizer holds (indices into ``numels``): every one in full training, peft's adapters
        under LoRA (``zero_lora.lora_zero3_units``: the frozen base is partitioned and gathered all the same,
        but has no flat buffer, gradient, master or state)."""
        return frozenset(p for g in self.groups for p in g)

    def sub_groups(self) -> list[list[int]]:
        """The optimizer's sub groups (``_create_fp16_sub_groups``: a group split where its partitions reach
        ``sub_group_size`` elements)."""
        parts = self.parts()
        out: list[list[int]] = []
        for g in self.groups:
            if sum(parts[p] for p in g) <= self.sub_group:
                out.append(list(g))
                continue
            cur: list[int] = []
            size = 0
            for p in g:
                cur.append(p)
                size += parts[p]
                if size >= self.sub_group or p == g[-1]:
                    out.append(cur)
                    cur, size = [], 0
        return [g for g in out if g]

    def micro(self, w: Zero3Writer, m: int, micro: int) -> None:
        """Nothing to set per micro-batch: every micro-batch reduces, the coordinator resets at each forward."""


class Zero3Writer:
    """Writes a ZeRO-3 rank's buffers into an allocation stream (``alloc_stream.StreamWriter``) at the hook points
    ``alloc_stream.micro_batch`` calls an FSDP writer at, plus ``wrap`` and ``step``."""

    def __init__(self, s: Any, u: Zero3Units) -> None:
        self.s, self.u = s, u
        self.numels = u.numels
        self.parts = u.parts()
        self.pb = u.bytes_each()  # each tensor's bytes per element
        self.subs = u.sub_groups()
        self.units = u.units
        nu = len(self.units)
        #: the step's module order: the units forward, then backward (a checkpointed layer twice: its recompute's
        #: forward, then its backward)
        back = [x for i in range(nu - 1, -1, -1) for x in ([i, i] if u.recompute and 0 < i < nu - 1 else [i])]
        back = back if u.bottom_backward else back[:-1]
        self.order = list(range(nu)) + back
        self.persistent = {p for p, n in enumerate(self.numels) if n <= u.persist}
        self.data: dict[int, list[int]] = {}  # a gathered parameter's storage
        self.inflight: dict[int, int] = {}  # a prefetched parameter not yet fetched: its coalesced gather
        self.flats: dict[int, tuple[list[int], set[int], bool]] = {}  # gather: (flat, params left, copied)
        self.recorded = False  # the coordinator's trace is complete (from the second forward on)
        self.forwards = 0
        self.at = 0  # the step's next position in ``order``
        self.queue: deque[tuple[int, int]] = deque()
        self.fetched_for: dict[int, int] = {}
        self.live = 0  # elements gathered (``__n_available_params``)
        self.pending: list[int] = []  # gradients in the ipg bucket (tensor indices)
        self.held: list[int] = []  # a gradient over the bucket's size, waiting for its reduce
        self.gathered_units = 0  # forward: layers fetched so far

    # -- wrap and step -------------------------------------------------------------------------------------------

    def wrap(self) -> None:
        """``deepspeed.initialize`` (HF's ``zero.Init`` partitions each weight as it is made): each weight whole
        then its partition (the whole freed), the partitions flattened, the fp32 masters, the ipg bucket and
        gradient partitions, the hooks' gather pass and the persisted parameters."""
        s, u = self.s, self.u
        trained = u.trained
        parts = []
        for p, n in enumerate(self.numels):
            whole = s.alloc(n * self.pb[p])
            part = s.alloc(self.parts[p] * self.pb[p])
            parts += part if p in trained else []  # a frozen one keeps its own partition (LoRA's base)
            s.free(whole)
        total = sum(self.parts[p] for p in trained)
        s.alloc(total * (u.train_bytes or u.model_bytes))  # fp16_partitioned_groups_flat
        s.free(parts)
        self._masters()
        s.alloc(u.bucket * u.model_bytes)  # the ipg bucket, kept
        self._grad_partitions(total)
        for p in range(len(self.numels)):  # create_reduce_and_remove_grad_hooks: all_gather, then partition
            if p not in self.persistent and p in trained:
                s.free(s.alloc(self._padded(p) * self.pb[p]))
        for p in sorted(self.persistent & trained):  # a frozen one is gathered at its first fetch
            self.data[p] = s.alloc(self.numels[p] * self.pb[p])

    def _masters(self) -> None:
        """The fp32 master partition of each sub group and a copy made and dropped, then
        ``initialize_optimizer_states``' zero gradients made and freed (the host's under ``offload_optimizer``)."""
        s = self.s
        subs = [sum(self.parts[p] for p in g) for g in self.subs]
        cast = (
            self.u.train_bytes or self.u.model_bytes
        ) != MASTER_BYTES  # fp32 partitions: the clone is the master
        for n in subs:
            s.alloc(n * MASTER_BYTES)
            if cast:
                s.free(s.alloc(n * MASTER_BYTES))
        s.free([h for n in subs for h in s.alloc(n * MASTER_BYTES)])

    def _grad_partitions(self, total: int) -> None:
        """``grad_partitions_flat_buffer``, kept (the host's under ``offload_optimizer``)."""
        self.s.alloc(total * self.u.model_bytes)

    def step(self, first: bool, states: Sequence[float], temps: Sequence[float]) -> None:
        """``step``: the norm's fp64 casts of each gradient partition, then per sub group the flattened bf16
        partitions (several tensors), the fp32 gradient, the states (``first`` step; bytes per element of each)
        and the temporaries (bytes per element, freed last first), the fp32 gradient freed."""
        s, u = self.s, self.u
        subs = self.subs
        for g in subs:
            for p in g:
                s.free(s.alloc(self.parts[p] * NORM_BYTES))
        for g in subs:
            n = sum(self.parts[p] for p in g)
            flat = s.alloc(n * u.model_bytes) if len(g) > 1 else []
            grad = s.alloc(n * MASTER_BYTES)
            s.free(flat)
            if first:
                for b in states:
                    s.alloc(max(int(n * b), 1))
            s.free([h for b in temps for h in s.alloc(max(int(n * b), 1))][::-1])
            s.free(grad)

    def _reset(self) -> None:
        """The coordinator's ``reset_step``, at every forward's start (the root module's forward pre-hook): the
        first forward records the module order, from the second on (the next micro-batch or step) it is complete;
        the prefetch queue rebuilt, the live count zeroed."""
        self.forwards += 1
        self.recorded, self.at, self.live = self.forwards > 1, 0, 0
        self.queue = deque((p, k) for k, unit in enumerate(self.order) for p in self.units[unit])
        self.fetched_for = {}

    # -- the coordinator -----------------------------------------------------------------------------------------

    def _padded(self, p: int) -> int:
        """Elements of a sequential all-gather's buffer for tensor ``p``."""
        return self.parts[p] * self.u.dp

    def _fetch(self, unit: int | None) -> None:
        """``fetch_sub_module`` of the next module in order (``unit`` None: the root, no parameters of its own)."""
        s = self.s
        params = [] if unit is None else list(self.units[unit])
        for p in params:
            if p in self.inflight:  # the coalesced gather's copies made at the first wait
                self._copy_out(self.inflight[p])
            elif p not in self.data:
                self.data[p] = s.alloc(self._padded(p) * self.pb[p])
                self.live += self.numels[p]
        for p in params:
            if p in self.inflight:
                g = self.inflight.pop(p)
                flat, left, copied = self.flats[g]
                left.discard(p)
                if not left:
                    s.free(flat)
                    del self.flats[g]
        if self.recorded:
            self._prefetch(params)
        if unit is not None:
            self.at += 1

    def _copy_out(self, g: int) -> None:
        """The coalesced gather ``g``'s wait: each of its parameters copied out of the flat buffer."""
        flat, left, copied = self.flats[g]
        if not copied:
            for p in sorted(left):
                self.data[p] = self.s.alloc(self.numels[p] * self.pb[p])
            self.flats[g] = (flat, left, True)

    def _prefetch(self, params: Sequence[int]) -> None:
        """The prefetch after a fetch: the module's own entries dropped from the queue, then the next parameters
        not gathered up to the prefetch bucket, in one coalesced all-gather."""
        u, k = self.u, self.at
        mine = {p for p in params if self.fetched_for.get(p, -1) < k}
        seen: set[int] = set()
        while self.queue and seen != mine:
            p, at = self.queue.popleft()
            self.fetched_for[p] = at
            seen.add(p)
        room = min(u.max_live - self.live, u.prefetch)
        chosen: list[int] = []
        numel = 0
        while self.queue and numel < room:
            p, at = self.queue.popleft()
            self.fetched_for[p] = max(self.fetched_for.get(p, -1), at)
            if p not in self.data and p not in self.inflight and p not in chosen:
                chosen.append(p)
                numel += self.numels[p]
        if not chosen:
            return
        self.live += numel
        if len(chosen) == 1:  # a single parameter: gathered as a fetch is
            self.data[chosen[0]] = self.s.alloc(self._padded(chosen[0]) * self.pb[chosen[0]])
            return
        flat = self.s.alloc(sum(self.parts[p] * self.pb[p] for p in chosen) * u.dp)
        g = flat[0]
        self.flats[g] = (flat, set(chosen), False)
        for p in chosen:
            self.inflight[p] = g

    def _release(self, unit: int) -> None:
        """``release_sub_module`` of the module just run (position ``self.at - 1``)."""
        k = self.at - 1
        keep: set[int] = set(self.persistent)
        if self.recorded:
            keep |= {p for p in self.units[unit] if self.fetched_for.get(p, -1) > k}
            seen = 0
            for later in self.order[k + 1 :]:
                if seen >= self.u.reuse:
                    break
                for p in self.units[later]:
                    keep.add(p)
                    seen += self.numels[p]
        for p in self.units[unit]:
            if p not in keep and p in self.data:
                self.s.free(self.data.pop(p))
                self.live -= self.numels[p]

    # -- alloc_stream's hook points ------------------------------------------------------------------------------

    def forward_start(self) -> None:
        """The model's first modules: the coordinator's reset, the root's fetch (its prefetch), the embeddings'."""
        self._reset()
        if self.recorded:
            self._fetch(None)
        self._fetch(0)
        self.gathered_units = 0

    def layer_forward_start(self) -> None:
        """A layer's fetch (the unit before it released first when it is the embeddings)."""
        if self.gathered_units == 0:
            self._release(0)
        self.gathered_units += 1
        self._fetch(self.gathered_units)

    def layer_forward_end(self) -> None:
        """A layer's release."""
        self._release(self.gathered_units)

    def forward_end(self) -> None:
        """The head's fetch and post-forward: called once the logits are made (their allocation the stream's last
        event), it writes the fetch before them (after the final norm, as the head module's pre-forward runs) and
        the release after them."""
        s = self.s
        logits = s.events.pop() if s.events and s.events[-1][1] != FREE_EVENT else None
        if self.u.layers == 0:
            self._release(0)
        self._fetch(len(self.units) - 1)
        if logits is not None:
            s.events.append(logits)
        self._release(len(self.units) - 1)

    def backward_start(self, layers: int) -> None:
        """The head's pre-backward, once the logits' gradient is made."""
        self._fetch(len(self.units) - 1)

    def _grads(self, unit: int) -> list[tuple[int, list[int]]]:
        """The unit's gradients as autograd makes them (last module first), whole, in the model's dtype."""
        trained = self.u.trained
        units = [p for p in reversed(self.units[unit]) if p in trained]  # frozen ones get none
        return [(p, self.s.alloc(self.numels[p] * self.pb[p])) for p in units]

    def _recompute(self, unit: int) -> None:
        """A checkpointed layer's recompute: its forward's fetch and release, before its backward's fetch."""
        if self.u.recompute:
            self._fetch(unit)
            self._release(unit)

    def _hook(self, grads: Sequence[tuple[int, list[int]]]) -> None:
        """``reduce_independent_p_g_buckets_and_remove_grads`` on each: a reduce when it would overflow the
        bucket, then copied in and freed (one over the bucket's size waits for the next reduce)."""
        for p, h in grads:
            n = self.numels[p]
            if self.pending and sum(self.numels[q] for q in self.pending) + n > self.u.bucket:
                self._reduce()
            self.pending.append(p)
            if n > self.u.bucket:
                self.held += h
            else:
                self.s.free(h)

    def _reduce(self) -> None:
        """``__reduce_and_partition_ipg_grads``: the bucket's gradients (each padded to dp) flattened for the
        reduce-scatter and freed, but a lone gradient that divides by dp, reduce-scattered in place
        (``runtime/comm/coalesced_collectives.reduce_scatter_coalesced``); the partitions land in the gradient
        buffer."""
        alone = len(self.pending) == 1 and self.numels[self.pending[0]] % self.u.dp == 0
        if self.pending and not alone:
            s = self.s
            s.free(s.alloc(sum(self._padded(p) for p in self.pending) * self.u.model_bytes))
        self.s.free(self.held)
        self.pending, self.held = [], []

    def backward(
        self,
        a: dict[str, Sequence[Any]],
        saved: list[list[int]],
        done: list[int],
        workspaces: Sequence[int] = (),
    ) -> None:
        """A micro-batch's backward from the head down (``alloc_stream.micro_batch``'s order; ``a`` its activation
        groups, ``saved`` each layer's saved tensors, ``done`` what the head's backward frees, ``workspaces`` the
        autograd thread's cuBLAS workspaces): per unit its fetch, gradients, hooks and release; the epilogue's
        reduce last."""
        s = self.s
        last = len(self.units) - 1
        top = self._grads(last)
        head = [
            x for p, h in top if self.u.tied and p == 0 for x in h
        ]  # the tied weight's head part, summed later
        top = [(p, h) for p, h in top if not (self.u.tied and p == 0)]
        for size in workspaces:  # never freed
            s.alloc(size)
        s.free(done + s.items(a["top_backward"]))
        self._hook(top)
        self._release(last)
        for i in reversed(range(len(saved))):
            self._recompute(i + 1)
            self._fetch(i + 1)
            recomputed = s.items(a["recompute"])
            grads = self._grads(i + 1)
            transient = self._layer_backward(a, saved[i])
            s.free(transient + recomputed + saved[i])
            self._hook(grads)
            self._release(i + 1)
        if self.u.bottom_backward:
            self._fetch(0)
            bottom = self._grads(0)
            if head:  # the tied weight: its two parts summed out of place, the hook on the sum
                summed = s.alloc(self.numels[0] * self.u.model_bytes)
                s.free(head + bottom[-1][1])
                bottom[-1] = (0, summed)
            self._hook(bottom)
            self._release(0)
        self._reduce()

    def _layer_backward(self, a: dict[str, Sequence[Any]], saved: list[int]) -> list[int]:
        """A layer's backward buffers (``fsdp_stream.layer_backward_buffers``: op by op for an eager-attention
        layer, else the ``layer_backward`` items); the gradients stay this writer's, made at the layer's start."""
        from memsim_widget.engine.counters.fsdp_stream import layer_backward_buffers

        return layer_backward_buffers(self.s, a, saved)

    def zero_grad(self) -> None:
        """The gradients live in the partitions' buffer: nothing to free."""


def rest_of(first: Sequence[Any]) -> list[Any]:
    """The persistent items of ``first`` the ZeRO-3 wrap does not replace: all but the parameters, the engine's
    master weights, its reduce bucket and gradient partitions (``Zero3Writer.wrap`` writes DeepSpeed's own)."""
    from memsim_widget.engine.states.gradients import ZERO3_GRAD_PARTITIONS_ITEM, ZERO_BUCKET_ITEM
    from memsim_widget.engine.states.optimizer import MASTER_ITEM

    written = (MASTER_ITEM, ZERO_BUCKET_ITEM, ZERO3_GRAD_PARTITIONS_ITEM)
    return [i for i in first if i.category != "parameters" and i.item not in written]


def per_element(items: Sequence[Any], u: Zero3Units) -> list[float]:
    """Bytes per partition element of each tensor the pooled ``items`` hold per parameter (an optimizer's states,
    its step temporaries): their bytes over the rank's partitions."""
    trained = u.trained
    total = sum(n for p, n in enumerate(u.parts()) if p in trained)
    n_params = len(trained)
    out: list[float] = []
    for i in items:
        n = max(i.tensors, 1)
        if i.level in ALLOCATED_LEVELS and i.bytes > 0 and total and n % n_params == 0:
            k = n // n_params
            out += [i.bytes / (k * total)] * k
    return out


def zero3_units(ctx: Any, stage: Any) -> Zero3Units:
    """``Zero3Units`` of ``stage``'s rank of ``ctx`` (``states/budget.local_groups``): HF Trainer's two optimizer
    groups (the weights that decay, the norms: ``zero_stream.NO_DECAY_KIND``)."""
    from memsim_widget.engine.counters.zero_stream import NO_DECAY_KIND
    from memsim_widget.engine.frameworks import reduce_bucket_elements
    from memsim_widget.engine.states.budget import local_groups

    layers = max(stage.layers, 1)
    pre: list[tuple[int, bool]] = []
    layer: list[tuple[int, bool]] = []
    post: list[tuple[int, bool]] = []
    for lg in local_groups(ctx, stage):
        x = (lg.numel_each, lg.group.kind == NO_DECAY_KIND)
        if lg.group.scope == "layer":
            layer += [x] * max(lg.count // layers, 1)
        else:
            (pre if lg.group.scope == "pre" else post).extend([x] * lg.count)
    module = pre + layer * stage.layers + post
    groups = tuple(
        g for g in (tuple(i for i, (_, nd) in enumerate(module) if nd == k) for k in (False, True)) if g
    )
    return Zero3Units(
        tuple(n for n, _ in pre),
        tuple(n for n, _ in layer),
        tuple(n for n, _ in post),
        stage.layers,
        groups,
        ctx.par.dp,
        ctx.recipe.weight_bytes,
        reduce_bucket_elements(ctx),
        recompute=ctx.scenario.activation_checkpointing == "full",
        tied=ctx.arch.tied_embeddings and not any(lg.group.kind == "head" for lg in local_groups(ctx, stage)),
    )
