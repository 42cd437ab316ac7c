"""The buffers a compiled Llama-layout layer with peft's LoRA on q_proj and v_proj makes and frees, forward and
backward, in the order the compiled fake-tensor trace makes them (trace/compiled.py under ``inductor_passes``;
read op by op on ``llama bf16 lora qv b2 s512 compiled`` of tests/data/fidelity_cases.py; ``python
benchmarks/allocator_replay_compiled.py --inductor-passes -k lora``).

None is saved, so they do not enter the engine's allocated figures, but they cut the caching allocator's segments,
so the allocation stream (``engine/counters/alloc_stream``) replays them. The frozen base weights need no
gradient, so the backward makes only input gradients and the four adapters' weight gradients. With e the
activations' bytes, T tokens, fp32 adapters (peft casts the adapter's input to their dtype, ``tuners/lora/layer.py``
``Linear.forward``) of rank r, per layer:

- forward: the attention norm's fp32 mean of squares and its 16-bit output (read by q_proj, k_proj, v_proj and,
  cast to fp32, by the two lora_A), q_proj's base output and its fp32 lora_B output (summed into q by the fused
  RoPE), k_proj's and v_proj's base outputs, v's fp32 lora_B output, o_proj's output (summed into the residual),
  the MLP norm's mean of squares and output, down_proj's input (the SwiGLU product: down_proj's weight is frozen, so
  the product is not saved) and output; the saved tensors go in between where ``SAVED`` steps say
  (``compiled._lora_qv_activations`` lists them in this order);
- backward, the MLP: as the full step's (engine/activations/compiled_backward.py) without weight gradients, the
  layer's output (the final norm's or the layer above's input) freed first;
- backward, the attention: o_proj's input gradient, SDPA's dq, dk, dv, RoPE's backward for k then q (into the
  shared zero buffers), then v: dv with its tangent (16-bit), dv times the LoRA scaling in fp32, lora_B's and
  lora_A's weight gradients, lora_A's output gradient (fp32 T x r), its input gradient (fp32 T x h) and v_proj's
  (e T h); k: dk as a contiguous copy and k_proj's input gradient; q as v, lora_A's input now the saved fp32 cast of
  the norm's output, freed there; the input norm's row sum and the residual gradient.
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.compiled_backward import FREE_SAVED, GRADS, _rope_backward
from memsim_widget.engine.activations.forward import SAVED, Step


def compiled_lora_applies(ctx: Any) -> bool:
    """Whether these steps describe the layers of ``ctx``: a compiled step of the traced rule
    (``compiled.compiled_rule_applies``: peft's default LoRA on q and v, fp32 adapters, a bf16 model) with the
    Llama layout's norms (two RMSNorms a layer, no q/k norms, no post-norms: Llama, Mistral, Qwen2, Gemma), no
    checkpointing."""
    from memsim_widget.engine.activations.compiled import compiled_rule_applies
    from memsim_widget.engine.activations.compiled_layernorm import layernorm_rule_applies

    a, sc = ctx.arch, ctx.scenario
    nf = a.facts.norm
    return (
        sc.method == "lora"
        and compiled_rule_applies(sc, a)
        and not layernorm_rule_applies(sc, a)
        and a.norm == "rmsnorm"
        and sc.activation_checkpointing == "none"
        and (nf.per_layer, nf.post_norms, nf.qk) == (2, False, None)
    )


def _saved(n: int) -> Step:
    """Make the next ``n`` of the layer's saved terms (``SAVED``)."""
    return (SAVED, n)


def _free(i: int) -> Step:
    """Free the layer's saved tensor ``i`` (``FREE_SAVED``; the terms' tensors in order: 0 the input norm's rsqrt,
    1 its output cast to fp32, 2 and 3 lora_A's outputs of q and v, 4 v, 5 q, 6 k, 7 the attention output, 8 the
    logsumexp, 9 the residual after attention, 10 the MLP norm's rsqrt, 11 and 12 gate's and up's outputs, 13 the
    residual stream the layer outputs: freed as its backward starts, as the trace frees it in the final norm's or
    the layer above's backward)."""
    return (f"{FREE_SAVED}{i}", 0)


def compiled_lora_forward(ctx: Any) -> tuple[Step, ...]:
    """One compiled LoRA layer's forward buffers and saved terms in order (``forward.Step``)."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, I, e = D.T, D.h, D.I, ctx.recipe.act_bytes
    q, kv = e * T * D.hq, e * T * D.hkv
    return (
        ("mean", 4 * T), _saved(1), ("mean", 0), ("n", e * T * h), ("qb", q), _saved(2), ("qB", 4 * T * D.hq),
        ("kb", kv), ("vb", kv), ("n", 0), _saved(1), ("vB", 4 * T * D.hkv), _saved(1), ("vb", 0), ("vB", 0),
        _saved(1), ("qb", 0), ("qB", 0), _saved(1), ("kb", 0), _saved(1), ("o", e * T * h), _saved(1), ("o", 0),
        ("mean", 4 * T), _saved(1), ("mean", 0), ("mn", e * T * h), _saved(1), ("mn", 0),
        ("dm", e * T * I), ("dn", e * T * h), ("dm", 0), _saved(1), ("dn", 0),
    )  # fmt: skip


def compiled_lora_backward(ctx: Any, bottom: bool = False) -> tuple[Step, ...]:
    """One compiled LoRA layer's backward buffers in order (``compiled_backward``'s steps; the adapters' gradients
    made at the first ``GRADS`` step). ``bottom``: layer 0, whose input is the frozen embedding's output, so no
    gradient flows below it (the trace's layer 0): the residual gradient is dropped once o_proj's input gradient
    is made, dk at once (k_proj is frozen: no RoPE backward for k), and no input gradient of q_proj, v_proj or
    lora_A is made (nor dv's 16-bit copy)."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, I, e, r = D.T, D.h, D.I, ctx.recipe.act_bytes, ctx.scenario.lora.rank
    q, kv = e * T * D.hq, e * T * D.hkv
    mlp: tuple[Step, ...] = (
        ("g", e * T * h), _free(13), ("di", e * T * I), ("dm", e * T * I), ("du", e * T * h), ("dm", 0), ("dg", e * T * I),
        ("di", 0), _free(11), _free(12), ("dx", e * T * h), ("dg", 0),
        ("s", 4 * T), ("g2", e * T * h), _free(9), _free(10), ("g", 0), ("du", 0), ("dx", 0), ("s", 0),
    )  # fmt: skip
    attn: tuple[Step, ...] = (
        ("do", q), ("dq", q), ("dk", kv), ("dv", kv), *(_free(i) for i in (4, 5, 6, 7, 8)), ("do", 0),
        *_rope_backward("k", kv), *_rope_backward("q", q),
        ("cv", kv), ("mv", 4 * T * D.hkv), ("dv", 0), (f"{GRADS}0", 0), _free(3), ("av", 4 * T * r), ("mv", 0),
        ("xav", 4 * T * h), ("av", 0), ("xv", e * T * h), ("cv", 0),
        ("ck", kv), ("dk", 0), ("k1", 0), ("k2", 0), ("xk", e * T * h), ("ck", 0),
        ("cq", q), ("mq", 4 * T * D.hq), ("dq", 0), ("q1", 0), ("q2", 0), _free(2), ("aq", 4 * T * r), ("mq", 0),
        _free(1), ("xaq", 4 * T * h), ("aq", 0), ("xq", e * T * h), ("cq", 0),
    )  # fmt: skip
    if bottom:
        return mlp + (
            ("do", q), ("g2", 0), ("dq", q), ("dk", kv), ("dv", kv), *(_free(i) for i in (4, 5, 6, 7, 8)),
            ("do", 0), ("dk", 0), *_rope_backward("q", q),
            ("mv", 4 * T * D.hkv), ("dv", 0), (f"{GRADS}0", 0), _free(3), ("av", 4 * T * r), ("mv", 0), ("av", 0),
            ("mq", 4 * T * D.hq), ("dq", 0), ("q1", 0), ("q2", 0), _free(2), ("aq", 4 * T * r), ("mq", 0),
            _free(1), ("aq", 0),
        )  # fmt: skip
    end: tuple[Step, ...] = (
        ("s", 4 * T), ("g3", e * T * h), _free(0), ("g2", 0), ("xav", 0), ("xv", 0), ("xk", 0),
        ("xaq", 0), ("xq", 0), ("s", 0), ("g3", 0),
    )  # fmt: skip
    return mlp + attn + end
