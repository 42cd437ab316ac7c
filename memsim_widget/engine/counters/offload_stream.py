"""The single-GPU memory savers in the allocation stream (``engine/counters/alloc_stream.py``): the optimizer step
in backward and activation offloading, as torchtune runs them and as the engine counts them.

Optimizer in backward (torchtune ``training/memory.py``, ``register_optim_in_bwd_hooks`` at tag v0.6.1: one
optimizer per parameter, ``{p: optimizer([p])}``, stepped and zeroed by the parameter's post-accumulate-grad hook).
``AccumulateGrad`` runs the hook once the parameter's gradient is complete (a tied weight's once its two parts are
summed), right after the backward node that made it; the hook's ``step()`` makes the parameter's optimizer states
at the first step (Adam's ``_init_group``: ``exp_avg``, then ``exp_avg_sq``) and the step's temporaries for that one
parameter (a foreach AdamW's ``_foreach_sqrt`` of ``exp_avg_sq``: one buffer of the parameter's size), freed as it
returns; ``zero_grad(set_to_none=True)`` then drops the gradient. So no two gradients are ever alive, there is no
optimizer step after backward and nothing for the loop's ``zero_grad`` to free. Traced on CPU
(``trace/torchtune_memory.OptimizerInBackward``): per parameter the gradient, its step's buffer, the buffer
freed, the gradient freed (and two 4-byte scalars, left out).

Activation offloading (torchtune ``training/_activation_offloading.py``, ``OffloadActivations`` with
``use_streams=True``, tag v0.6.1; the engine's rule is ``step/timeline.OFFLOAD_LAYERS_ON_GPU``: one layer's
saved activations on the GPU). In forward each saved tensor of at least 1024 B is copied to pinned host memory on
the copy stream ``s1`` and its GPU original kept in a stash until five more tensors have been packed, so a layer's
saved tensors leave the GPU as the layer runs (written: freed when the layer's forward ends). In backward
``unpack_tensor_with_streams`` brings each one back with ``.to("cuda")`` under ``torch.cuda.stream(self.s1)``: the
copy is allocated on the copy stream, so its block comes from, and returns to, that stream's pool (the caching
allocator keeps a pool per stream; a block freed there serves only the copy stream again); it stays in the backward
stash until the next node that brings a tensor back has run (written: freed when the layer's backward ends). The
pinned host buffers are host memory (``step/timeline.offloaded_activations``), not the allocator's. A checkpointed
layer saves only its input, so only that is offloaded and brought back; the recomputed layer is made on the compute
stream as without offloading. Unsloth's offloaded gradient checkpointing (``Unsloth_Offloaded_Gradient_Checkpointer``,
as vendored in tdrussell/qlora-pipe ``unsloth_utils.py``) brings the layer input back with
``hidden_states.to("cuda", non_blocking=True)`` on the current stream: the compute stream's pool. Not written:
torchtune's ``record_stream(s0)`` when a node's output is a view of a tensor it brought back, the final norm's
saved tensors offloaded too (the stream keeps them on the GPU: an over-count of a few T x h tensors), the first
and last few tensors of a layer overlapping the next (the five-tensor stash).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memsim_widget.engine.items import ALLOCATED_LEVELS

#: The stream number the copies torchtune's ``OffloadActivations`` brings back are allocated on (its ``s1``);
#: past ``fsdp_stream.FSDP_STREAMS``' numbers so no replay mixes the two.
TORCHTUNE_COPY_STREAM = 8
#: Item levels the caching allocator serves (``items.ALLOCATED_LEVELS``, as ``alloc_stream._POOLED``).
_POOLED = ALLOCATED_LEVELS


def savers_replayable(ctx: Any) -> bool:
    """Whether the stream writes the scenario's single-GPU memory savers: none on, or on one GPU activation
    offloading (``offload_replayable``; 0 layers offloaded is none) and the optimizer in backward
    (``in_backward_replayable``) as they are on."""
    sc, p = ctx.scenario, ctx.par
    offloading = sc.offloads_activations
    if not (offloading or sc.optimizer_in_backward):
        return True
    return (
        p.dp * p.tp * p.pp * p.cp * p.ep == 1
        and (not offloading or offload_replayable(ctx))
        and (not sc.optimizer_in_backward or in_backward_replayable(ctx))
    )


def savers_note(ctx: Any) -> str:
    """What the replay's formula says of the savers it wrote (empty: none on)."""
    sc = ctx.scenario
    out = []
    if sc.optimizer_in_backward:
        out.append("each parameter stepped in its post-accumulate-grad hook, its gradient freed after it")
    if sc.offloads_activations:
        where = "the compute stream" if copy_stream(ctx) == 0 else "torchtune's copy stream"
        out.append(f"each layer's saved tensors offloaded after its forward, brought back on {where}")
    unsloth = copy_stream(ctx) == 0 and len(out) == 1 and not sc.optimizer_in_backward
    source = "Unsloth's checkpointer as read, untraced" if unsloth else "torchtune v0.6.1, traced on CPU"
    return f" ({'; '.join(out)}: {source})" if out else ""


def offload_replayable(ctx: Any) -> bool:
    """Whether the stream writes the scenario's activation offloading: every layer offloaded (torchtune's
    ``OffloadActivations``, Unsloth's offloaded checkpointing; ``activation_offloading_layers`` unset or all
    of them), one GPU. The first N layers only (TransformerEngine's schedule, ``partial_resident``) is not written."""
    sc = ctx.scenario
    n = sc.activation_offloading_layers
    return n is None or n >= ctx.arch.num_layers


def copy_stream(ctx: Any) -> int:
    """The stream offloaded tensors are brought back on: torchtune's copy stream, the compute stream (0) under
    Unsloth's checkpointer."""
    return 0 if ctx.scenario.framework == "unsloth" else TORCHTUNE_COPY_STREAM


def in_backward_replayable(ctx: Any) -> bool:
    """Whether the stream writes the scenario's optimizer in backward: one micro-batch a step (torchtune refuses
    gradient accumulation with it), an optimizer that steps, full training or LoRA alike."""
    sc = ctx.scenario
    return sc.grad_accum_steps == 1 and sc.optimizer != "none"


class Offloader:
    """Writes activation offloading into a stream (``alloc_stream.StreamWriter``): ``away`` frees a layer's saved
    tensors once its forward ends (their host copies are not the allocator's) and keeps their sizes, ``back``
    allocates them again on the copy stream when the layer's backward begins."""

    def __init__(self, s: Any, stream: int) -> None:
        self.s, self.stream = s, stream
        self.sizes: list[list[int]] = []  # per layer written in forward, bottom first

    def start(self) -> int:
        """A micro-batch's forward begins: no layer offloaded yet. The share of the saved items each layer makes:
        all of them (the engine's saved group is the one layer it keeps on the GPU)."""
        self.sizes = []
        return 1

    def away(self, kept: list[int]) -> list[int]:
        """Free ``kept`` (a layer's saved tensors, offloaded) and keep their sizes; what stays on the GPU: none."""
        self.sizes.append([self.s.size(h) for h in kept])
        self.s.free(kept)
        return []

    def back(self, layer: int) -> list[int]:
        """Layer ``layer``'s saved tensors brought back on the copy stream (a layer the stream copied rather than
        wrote has the last written layer's sizes): their handles."""
        if not self.sizes:
            return []
        return [
            h for x in self.sizes[min(layer, len(self.sizes) - 1)] for h in self.s.alloc(x, 1, self.stream)
        ]


class InBackwardGrads:
    """How backward writes the gradients when each parameter's optimizer steps in its post-accumulate-grad hook
    (``alloc_stream._Grads``' interface): per parameter tensor in backward order its gradient, at the first step
    its optimizer states, its step's temporaries made and freed, the gradient freed; none is kept. ``sg``: the
    state groups (the gradient item is the largest parameter's, the step temporaries the largest parameter's
    step: both scaled to each parameter by its elements), ``states`` the optimizer states (made by the first
    step), ``params`` every parameter tensor's elements (the states' split)."""

    by_tensor = True
    in_backward = True
    zero: Any = None  # one GPU only (``savers_replayable``): never a ZeRO rank's hooks

    def __init__(
        self, s: Any, sg: dict[str, Sequence[Any]], order: Any, states: Sequence[Any], params: tuple[int, ...]
    ) -> None:
        self.s, self.sg, self.order = s, sg, order
        self.states, self.params = list(states), params
        largest = max(params, default=1) or 1
        grads = [i for i in sg["grads"] if i.level in _POOLED and i.bytes > 0]
        temps = [i for i in sg["step_temps"] if i.level in _POOLED and i.bytes > 0]
        #: bytes per element of the gradient and of each step temporary
        self.per = sum(i.bytes for i in grads) / largest
        self.temps = [i.bytes / largest for i in temps]
        self.new = False  # set by step_stream like _Grads'; every gradient is stepped and dropped anyway
        self.first = True  # the first step: the states are made

    def made(self, part: tuple[int, ...], share: int, hold: bool = False) -> list[int]:
        """The gradients of ``part`` (parameter tensors' elements), each stepped and freed: none returned. ``hold``:
        made and returned, not stepped (a tied weight's head part waits for its embedding part)."""
        s = self.s
        if hold:
            return [h for x in part for h in s.alloc(self._grad(x))]
        for x in part:
            self.step(s.alloc(self._grad(x)), x)
        return []

    def step(self, grad: list[int], x: int) -> None:
        """The hook of a parameter of ``x`` elements whose gradient ``grad`` is complete (``hook``), then the
        gradient dropped (``zero_grad(set_to_none=True)``)."""
        self.hook((x,))
        self.s.free(grad)

    def hook(self, part: tuple[int, ...]) -> bool:
        """The optimizer steps of the parameters of ``part`` (elements each) in turn, their gradients complete: at
        the first step their states, each step's temporaries made and freed. True: the caller drops the
        gradients (a tied weight's summed gradient)."""
        s = self.s
        for x in part:
            if self.first and self.states:
                s.per_param(self.states, (x,), self.params)
            temps = [h for b in self.temps for h in s.alloc(max(int(x * b), 1))]
            s.free(temps[::-1])
        return True

    def _grad(self, x: int) -> int:
        return max(int(x * self.per), 1)
