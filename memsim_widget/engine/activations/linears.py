"""What the Linears of a layer keep beyond their inputs: the leaf names by the tensor they read (peft matches
LoRA targets by leaf name), autocast's 16-bit weight copies and the LoRA adapters' own saved tensors."""

from __future__ import annotations

from memsim_widget.architecture import ParamGroup
from memsim_widget.engine.activations.layer import HFLayer
from memsim_widget.engine.frameworks import quantises_module
from memsim_widget.units import fmt_int

#: Leaf Linear names by the tensor they read, across families (peft matches targets by leaf name).
ATTN_IN = frozenset(
    {"q_proj", "k_proj", "v_proj", "c_attn", "qkv_proj", "query", "key", "value", "q", "k", "v"}
    | {"query_key_value"}
    | {"q_a_proj", "kv_a_proj_with_mqa"}  # DeepSeek MLA: the projections reading the layer's normed input
    | {"Wqkv"}  # ModernBERT
)
ATTN_OUT = frozenset({"o_proj", "c_proj", "out_proj", "o", "Wo"})  # + arch.facts.attention.output_modules
MLP_IN = frozenset(
    {
        "gate_proj",
        "up_proj",
        "c_fc",
        "gate_up_proj",
        "fc1",
        "wi",
        "wi_0",
        "wi_1",
        "w1",
        "w3",
        "dense_h_to_4h",
        "Wi",
    }
)
MLP_OUT = frozenset({"down_proj", "c_proj", "fc2", "wo", "w2", "dense_4h_to_h", "Wo"})  # ModernBERT: Wo twice


def before_attention_core(g: ParamGroup) -> bool:
    """Whether a layer's weight runs its backward before the attention core's in a sequential block: the MLP's
    (routed experts aside) and the output projection's (split along its input, ``tp_dim`` 1). torch 2.13.0 runs a
    layer's backward in reverse of its forward (``torch/csrc/autograd/engine.cpp``)."""
    return (g.kind == "mlp" and not g.expert) or (g.kind == "attention" and g.tp_dim == 1)


def autocast_weight_copies(st: HFLayer) -> None:
    """Autocast's 16-bit copies of the layer's Linear weights: every trained weight's (cached until the forward
    and the loss end), and under LoRA the copy each frozen Linear's matmul keeps for its input's gradient."""
    arch, sc, ctx, D = st.arch, st.sc, st.ctx, st.D
    amp, full, add = st.amp, st.full, st.add
    frozen_first = st.frozen_first
    if amp and full:
        # Llama 4's bmm experts and nn.Linear router are autocast too: their 16-bit copies are cached alike
        bmm_experts = arch.facts.linear.autocast_expert_copies
        wl = sum(
            g.numel
            for g in ctx.arch.params
            if g.scope == "layer" and (g.module or (bmm_experts and (g.expert or g.kind == "router")))
        ) // max(arch.num_layers, 1)
        wl //= D.tp
        add("autocast 16-bit weight copies", 2 * wl, f"2 B x {fmt_int(wl)} Linear weights per layer", 7)
        # the MLP's and the output projection's (split along its input, ``tp_dim`` 1) copies: their Linears'
        # backward releases them before the attention's (backward.attention_backward)
        late = sum(
            g.numel for g in arch.params if g.scope == "layer" and g.module and before_attention_core(g)
        )
        st.late_copies = 2 * (late // max(arch.num_layers, 1) // D.tp)
    elif amp and sc.activation_checkpointing != "full":
        # A frozen Linear gets no autocast cache entry (only trained fp32 leaves are cached), but the matmul
        # it runs keeps the 16-bit weight it was given for the input's gradient: one copy per frozen Linear
        # whose input needs a gradient (torch autocast_mode cached_cast; checked with saved-tensor hooks and
        # against fake-tensor traces, docs/fidelity.md). NF4 Linears dequantise inside bitsandbytes' own
        # autograd Function, which saves the packed weight only. Layer 0's attention input needs no gradient
        # without checkpointing (frozen embeddings), so q, k and v keep no copy there. Under full checkpointing
        # the copies exist only while the recomputed layer's backward runs, freed Linear by Linear; the
        # layer-backward moment already bounds that (traces of amp LoRA with checkpointing agree without them).
        frozen_w = [
            g
            for g in arch.params
            if g.scope == "layer"
            and g.module
            and not (sc.method == "qlora" and quantises_module(ctx, g.module))
        ]
        layers = max(arch.num_layers, 1)
        wl = sum(g.numel for g in frozen_w) // layers // D.tp
        w0 = sum(g.numel for g in frozen_w if g.module in ATTN_IN) // layers // D.tp if frozen_first else 0
        add(
            "autocast 16-bit copies of frozen Linear weights",
            2 * wl,
            f"2 B x {fmt_int(wl)} frozen Linear weights per layer"
            + ("; none for layer 0's attention input" if w0 else ""),
            sum(g.count for g in frozen_w) // layers,
            first_bytes=2 * w0,
        )


def lora_internals(st: HFLayer) -> None:
    """Each adapter's A output, saved by its B (per layer, averaged over the layers)."""
    arch, ctx, ab, Tout, add, full = st.arch, st.ctx, st.ab, st.D.Tout, st.add, st.full
    if not full:
        # (an adapter on fused experts or the router folds into the weight: no A output per token,
        # ``mlp.expert_lora``)
        per_layer = [
            ad
            for ad in ctx.adapters
            if ad.base.scope == "layer" and ad.base.kind not in ("experts", "router")
        ]
        layers = max(arch.num_layers, 1)
        mid = sum(ad.rank * ad.base.count for ad in per_layer) / layers
        add(
            "LoRA A outputs (saved by B)",
            ab * Tout * mid,
            f"{ab} B x T x sum(rank)={fmt_int(mid)}",
            len(per_layer),
        )
