"""What a compiled backward holds beyond a layer's saved tensors where its residual gradient is summed at the bottom
(the stream's layer steps keep buffers there, ``KEEP``: the autocast Llama layout's ``compiled_amp_steps``, OLMo 2's
and Gemma 3's), for the engine's moments, read from the steps the allocation stream writes (``compiled_steps.
writer``) so the two agree.

The compiled autocast traces (trace/compiled.py under ``inductor_passes``; ``python benchmarks/
allocator_replay_compiled.py --inductor-passes -k amp``) peak in the backward of the top layer (Qwen3: RoPE's fp32
backward at q's width; the 64-token Llama: the MLP's backward), where three things the eager moments do not hold
are alive:

- the layer's own backward buffers (``layer_backward``: the peak, over the layer's steps, of its buffers, the
  gradients of its parameters made so far, the buffers it keeps to the bottom and RoPE's shared zero buffers, less
  the saved tensors and KV-cache zero gradients it has freed; the bottom layer's in ``bottom_layer_backward``,
  its steps starting with the shared buffers made at the top);
- every layer's zero gradients of the returned KV cache (``cache_tangent_layer``: AOTAutograd makes them at the
  loss's backward, each layer's backward frees its own);
- what the top of the backward keeps until the bottom (``kept_top_backward``: ``compiled_steps.kept_top``'s; under
  autocast the head's 16-bit input gradient, the final norm's row sum, the last layer's fp32 output and the final
  norm's rsqrt).

At the bottom layer's backward each layer above has left what it keeps to the bottom (``kept_backward``: its input
gradients, row sums and saved tensors the kernel at the bottom reads: the ``KEEP`` and ``KEEP_SAVED`` steps), and
the layer's own zero gradients are still alive. A layer's gradients made before its peak are counted in its term
(the moments' state side holds none of them at the top, nor the bottom layer's at the bottom); under gradient
accumulation they are also among the carried gradients (over by at most one layer's gradients).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.compiled_backward import CONSTANT, FREE_SAVED, GRADS, RELEASE, TANGENT
from memsim_widget.engine.activations.compiled_olmo2_steps import KEEP, KEEP_SAVED
from memsim_widget.engine.activations.compiled_steps import writer
from memsim_widget.engine.activations.forward import Step
from memsim_widget.engine.activations.tangents import CACHE_TANGENTS


def saved_tensor_bytes(terms: Sequence[Term]) -> list[float]:
    """Each saved tensor's bytes of a layer's ``terms`` in order (a term's ``shares`` where it has them, else
    equal parts): the places ``FREE_SAVED`` and ``KEEP_SAVED`` name."""
    out: list[float] = []
    for t in terms:
        n = max(t.tensors, 1)
        out += [t.bytes * s for s in t.shares] if len(t.shares) == n else [t.bytes / n] * n
    return out


def layer_grad_bytes(ctx: Any) -> list[int]:
    """Each of the layer's parameter gradients' bytes, in ``GRADS``' order (the layer's parameters)."""
    b = ctx.recipe.grad_bytes
    out = []
    for g in (x for x in ctx.arch.params if x.scope == "layer"):
        n = 1
        for d in g.shape:
            n *= d
        out.append(n * b)
    return out


def backward_peak(
    steps: Sequence[Step],
    saved: Sequence[float],
    grads: Sequence[int],
    tangents: Sequence[float],
    constants: dict[str, int] | None = None,
) -> float:
    """The peak, over a compiled layer's backward ``steps``, of the bytes made less the bytes freed since the layer
    began: its buffers, its gradients (``grads`` by place, at their ``GRADS`` step), the buffers kept to the bottom
    (``KEEP``) and the ``CONSTANT`` buffers (``constants``: those made before the layer, by step name, alive from
    its start: the bottom layer's), less its ``saved`` tensors freed (``FREE_SAVED``), its KV-cache zero gradients freed (``TANGENT``,
    ``tangents`` in the order the steps free them) and the constants released (``RELEASE``)."""
    made: dict[str, int] = dict(constants or {})
    live: dict[str, int] = {}
    kept = dict(enumerate(saved))
    own, done = list(tangents), set()
    cur = peak = float(sum(made.values()))  # the constants already made are alive from the start
    for name, size in steps:
        if name == TANGENT:
            cur -= own.pop(0) if own else 0
        elif name.startswith(GRADS):
            i = int(name[len(GRADS) :])
            if i not in done and i < len(grads):
                done.add(i)
                cur += grads[i]
        elif name.startswith(FREE_SAVED):
            cur -= kept.pop(int(name[len(FREE_SAVED) :]), 0)
        elif name.startswith(RELEASE):
            cur -= made.pop(name[len(RELEASE) :], 0)
        elif name.startswith(CONSTANT):
            if name not in made:
                made[name] = size
                cur += size
        elif name.startswith(KEEP_SAVED):
            kept.pop(int(name[len(KEEP_SAVED) :].split()[0]), None)  # not freed by the layer: kept
        elif name.startswith(KEEP) or size > 0:
            live[name] = size if not name.startswith(KEEP) else 0
            cur += size
        else:
            cur -= live.pop(name, 0)
        peak = max(peak, cur)
    return peak


def kept_to_bottom(steps: Sequence[Step], saved: Sequence[float]) -> float:
    """The bytes a layer's backward ``steps`` keep until the bottom: its ``KEEP`` buffers and the ``saved``
    tensors its ``KEEP_SAVED`` steps name."""
    out = 0.0
    for name, size in steps:
        if name.startswith(KEEP_SAVED):
            out += saved[int(name[len(KEEP_SAVED) :].split()[0])]
        elif name.startswith(KEEP):
            out += size
    return out


def _constants(steps: Sequence[Step]) -> dict[str, int]:
    """The ``CONSTANT`` buffers ``steps`` make, by step name (alive from the top layer to the bottom one)."""
    return {n: s for n, s in steps if n.startswith(CONSTANT)}


def _tangents(ctx: Any, out: ActivationBudget) -> tuple[float, ...]:
    """One layer's KV-cache zero gradients, v's then k's (the order the steps free them), from the loss's backward
    term that makes every layer's (``compiled._loss_backward``: its shares v, k; none: equal halves)."""
    t = next((t for t in out.loss_backward if CACHE_TANGENTS in t.name), None)
    if t is None:
        return ()
    per = t.bytes / max(ctx.arch.num_layers, 1)
    return tuple(per * x for x in t.shares[:2]) if len(t.shares) >= 2 else (per / 2, per / 2)


def compiled_backward_kept(ctx: Any, out: ActivationBudget) -> None:
    """Set the backward terms of ``out`` (the module docstring): ``layer_backward``, ``bottom_layer_backward``,
    ``cache_tangent_layer``, ``kept_backward`` and ``kept_top_backward``, where the compiled layout's stream steps
    keep buffers to the bottom (``KEEP``: autocast's, ``compiled_amp_steps``); nothing elsewhere."""
    w = writer(ctx)
    if not w.applies(ctx):
        return
    steps, bottom = w.backward(ctx), w.bottom(ctx) or w.backward(ctx)
    if not any(n.startswith(KEEP) for n, _ in steps):
        return
    saved = saved_tensor_bytes(out.per_layer)
    grads = layer_grad_bytes(ctx)
    tangents = _tangents(ctx, out)
    top = backward_peak(steps, saved, grads, tangents)
    low = backward_peak(bottom, saved, grads, tangents, _constants(steps))
    kept = kept_to_bottom(steps, saved)
    out.layer_backward[:] = [
        Term("compiled: a layer's backward (its buffers, gradients made and kept, RoPE's shared zero buffers made, "
             "less what it frees)", top, "peak over the stream's layer backward steps", 1),
    ]  # fmt: skip
    out.bottom_layer_backward[:] = [
        Term("compiled: the bottom layer's backward (RoPE's shared zero buffers from the top, its buffers, "
             "gradients made and kept, less what it frees)", low, "peak over the stream's bottom layer steps", 1),
    ]  # fmt: skip
    out.cache_tangent_layer[:] = [
        Term(f"compiled: one layer's zero gradients of the {CACHE_TANGENTS}", sum(tangents),
             "its v's and k's (the loss backward's term / layers)", len(tangents)),
    ] if tangents else []  # fmt: skip
    out.kept_backward[:] = [
        Term("compiled: kept to the bottom by a layer's backward (input gradients, row sums, the inputs and "
             "residuals the bottom's kernel reads)", kept, "KEEP and KEEP_SAVED steps",
             sum(1 for n, _ in steps if n.startswith(KEEP))),
    ]  # fmt: skip
    ends = saved_tensor_bytes([*out.top_backward, *out.post])  # the stream's order (alloc_stream KEPT_TOP)
    out.kept_top_backward[:] = [
        Term("compiled: kept from the top to the bottom (compiled_steps.kept_top: autocast's the head's input "
             "gradient, the final norm's row sum, the last layer's fp32 output, the final norm's rsqrt)",
             sum(ends[i] for i in w.kept_top), "the top_backward and post tensors kept_top names", len(w.kept_top)),
    ] if w.kept_top else []  # fmt: skip
