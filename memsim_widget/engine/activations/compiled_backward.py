"""The buffers a compiled Llama-layout layer's backward makes and frees, in the order the compiled fake-tensor trace
makes them (trace/compiled.py under ``inductor_passes``; ``python benchmarks/allocator_replay_compiled.py
--inductor-passes``; read op by op on the small Llama and Qwen3 compiled cases of tests/data/fidelity_cases.py).

None of them is saved, so they do not enter the engine's allocated figures (the eager layer's backward terms
stay the budget's), but they cut the caching allocator's segments, so the allocation stream
(``engine/counters/alloc_stream``) replays them. Per layer, from the top, e the dtype's bytes, T tokens:

- the MLP: the gradient arriving from the layer above (e T h), down_proj's input gradient (e T I), the SwiGLU's
  product gradient (e T I), up_proj's input gradient (e T h), the gate's pre-activation gradient (e T I),
  gate_proj's input gradient (e T h), the norm's fp32 row sum (4 T) and the residual gradient it leaves (e T h);
- the attention: o_proj's input gradient (e T h), SDPA's backward outputs dq, dk, dv (e T (a d + 2 kv d));
  RoPE's backward (``rotate_half``'s: a product, the negated half and two ``slice_scatter`` outputs for k, then
  for q); dv, dk and dq as contiguous copies (``clone``) read by v_proj's, k_proj's and q_proj's weight
  gradients, each projection's input gradient (e T h) made after it; with Qwen3's per-head norms each norm's
  fp32 row sum (4 T heads) before its copy; the input norm's fp32 row sum and the residual gradient (e T h).

The two zero tensors RoPE's ``slice_scatter`` writes into (e T kv d for k, e T a d for q) are one buffer each for
the whole backward (constants of the partitioned graph): made in the top layer, freed after the bottom one
(``CONSTANT`` steps).
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.forward import Step, compiled_applies

#: The prefix of the step that makes one of the layer's parameter gradients, by the parameter's place in the
#: layer (``states``' layer groups in order: q_proj 0, k_proj 1, v_proj 2, o_proj 3, gate_proj 4, up_proj 5,
#: down_proj 6, the input norm 7, the norm after attention 8, Qwen3's q_norm 9 and k_norm 10); where gradients
#: are not written tensor by tensor the first such step makes the layer's share.
GRADS = "grad "
#: The key of a layer's backward steps in the stream's activation groups (``alloc_stream.layer_steps``; absent or
#: empty: the ``layer_backward`` items), read by the stream and the ZeRO-3 writer (``zero3_stream``).
LAYER_BACKWARD = "layer_backward_steps"
#: The key of a fully checkpointed layer's recompute steps (``activations/eager_core_steps.recompute_steps``: its
#: saved tensors at their places; absent or empty: the ``recompute`` items), read by the stream's forward (where
#: they are, the checkpointed forward is its own steps: no ``recompute`` items) and FSDP2's writer.
LAYER_RECOMPUTE = "layer_recompute_steps"
#: The prefix of a step that frees one of the layer's saved tensors, by its place among them (``compiled.
#: compiled_activations``' per-layer terms in order, each term's tensors in turn): 0 and 1 the residual stream at
#: the input and after attention, 2 and 3 the norms' outputs, 4 and 5 their rsqrts, 6 q after RoPE, 7 the
#: attention output, 8 k after RoPE, 9 v, 10 SDPA's logsumexp, 11 to 13 gate's, up's and their product, then
#: Qwen3's q and k norm inputs and rsqrts (14 to 17: q, its rsqrt, k, its rsqrt).
FREE_SAVED = "saved "
#: The step that frees the layer's next zero gradient of the returned KV cache (its v's, then its k's: the
#: trace frees each once the copy of dv or dk its weight gradient reads is made); those not named are freed when
#: the layer is done.
TANGENT = "tangent"
#: The prefix of a step that frees a ``CONSTANT`` buffer (by its step's name) where the bottom layer last reads it.
RELEASE = "release "
#: The prefix of a step that allocates a buffer shared by every layer's backward: made where the top layer first
#: reaches it, freed once the bottom layer is done.
CONSTANT = "constant "


def _rope_backward(name: str, n: int) -> tuple[Step, ...]:
    """``rotate_half``'s backward on a tensor of ``n`` bytes: the product, the negated half, the two scatters."""
    return (
        (f"{name}m", n), (f"{name}n", n // 2), (f"{CONSTANT}{name}", n), (f"{name}1", n), (f"{name}n", 0),
        (f"{name}2", n), (f"{name}m", 0),
    )  # fmt: skip


def _grad(i: int) -> Step:
    """The step that makes the gradient of the layer's parameter ``i`` (``GRADS``)."""
    return (f"{GRADS}{i}", 0)


def _saved(i: int) -> Step:
    """The step that frees the layer's saved tensor ``i`` (``FREE_SAVED``)."""
    return (f"{FREE_SAVED}{i}", 0)


def compiled_layer_backward_transients(ctx: Any) -> tuple[Step, ...]:
    """One compiled layer's backward buffers in order (``Step``: bytes > 0 allocates the name, 0 frees it;
    ``GRADS``: a parameter's gradient; ``FREE_SAVED``: a saved tensor freed; ``CONSTANT``: a buffer all layers share); empty where ``forward.compiled_applies`` is false."""
    if not compiled_applies(ctx):
        return ()
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, I, e = D.T, D.h, D.I, ctx.recipe.act_bytes
    q, kv = e * T * D.hq, e * T * D.hkv
    head = ctx.arch.facts.norm.qk == "head"
    mlp: tuple[Step, ...] = (
        ("g", e * T * h), _grad(6), _saved(13),
        ("di", e * T * I), ("dm", e * T * I), _grad(5), ("du", e * T * h), ("dm", 0),
        ("dg", e * T * I), ("di", 0), _saved(11), _saved(12), _grad(4), _saved(3), ("dx", e * T * h), ("dg", 0),
        _grad(8), ("s", 4 * T), ("g2", e * T * h), _saved(1), _saved(5), ("g", 0), ("du", 0), ("dx", 0), ("s", 0),
    )  # fmt: skip
    attn: tuple[Step, ...] = (
        _grad(3), ("do", q), ("dq", q), ("dk", kv), ("dv", kv),
        *(_saved(i) for i in (9, 6, 8, 7, 10)), ("do", 0),
        *_rope_backward("k", kv), *_rope_backward("q", q),
        ("cv", kv), ("dv", 0), _grad(2), ("xv", e * T * h), ("cv", 0),
    )  # fmt: skip
    for name, n, heads, at, param, norm_param in (("k", kv, D.kv, 16, 1, 10), ("q", q, D.a, 14, 0, 9)):
        norm: tuple[Step, ...] = (_grad(norm_param), (f"s{name}", 4 * T * heads)) if head else ()
        done: tuple[Step, ...] = (_saved(at + 1), _saved(at), (f"s{name}", 0)) if head else ()
        last: tuple[Step, ...] = (_saved(2),) if name == "q" else ()
        attn += (
            *norm, (f"c{name}", n), (f"d{name}", 0), (f"{name}1", 0), (f"{name}2", 0),
            *done, _grad(param), *last, (f"x{name}", e * T * h), (f"c{name}", 0),
        )  # fmt: skip
    end: tuple[Step, ...] = (
        _grad(7), ("s", 4 * T), ("g3", e * T * h), _saved(0), _saved(4), ("g2", 0), ("xv", 0), ("xk", 0),
        ("xq", 0), ("s", 0), ("g3", 0),
    )  # fmt: skip
    return mlp + attn + end
