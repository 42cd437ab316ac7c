"""Hybrid stacks (Jamba): attention layers and Mamba layers in one model, each with its norms and MLP.

The layers are averaged over the stack, as the MoE parts are (engine/activations/mlp.py): the norms and
the MLPs of every layer come from the HF rules run on the model seen without its state-space layers (every layer an
attention layer, ``arch.facts.mlp.parts`` weighing dense and MoE MLPs); the attention terms are then scaled by
the share of attention layers, and the Mamba mixer's own terms are added for the share of Mamba layers. The sum over
the layers is exact when each layer kind saves the same at every depth (under LoRA: when layer 0 carries an adapter,
so no layer below the first adapter keeps nothing; engine/activations/refusals.py refuses the rest). Under LoRA the
mixer is ``_frozen_jamba_mixer``'s. Under full checkpointing the layer recomputed for its backward is a whole
Mamba layer (traced, docs/fidelity.md).

Jamba's mixer (``JambaMambaMixer``, transformers 5.24) is Mamba v1's with three weight-only RMSNorms on x_proj's
outputs (dt, B, C) and dt_proj applied as ``dt_proj.weight @ dt`` (the bias goes into the scan); it calls
``causal_conv1d_fn`` and ``selective_scan_fn`` (the causal-conv1d and mamba-ssm kernels when installed, else
transformers' torch fallbacks), never ``mamba_inner_fn``. ``ssm_kernel`` chooses which runs: ``torch`` is held to a
fake-tensor trace (docs/fidelity.md), ``cuda`` is a formula from the kernels' ``save_for_backward`` (not traced).

Backward: the peak falls inside the highest Mamba layer's scan backward (traced), when the layers above it and its
own MLP have made their weight gradients and released what they saved (``above_the_scan``); when an MLP's backward
transients are larger (no such case seen), those are taken instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from memsim_widget.architecture.facts import HybridFacts, SsmFacts
from memsim_widget.architecture.types import Architecture
from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.ssm import SCAN_CHUNK, softplus_bytes, ssm_kernel
from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import uses_autocast

#: Per-layer terms of the attention block (names the HF rules give them): scaled by the share of attention layers.
ATTENTION_TERMS = ("attention ", "KV cache")


def _scaled(t: Term, share: float, label: str) -> Term:
    """``t`` for ``share`` of the layers (the formula says which)."""
    return dataclasses.replace(
        t, bytes=t.bytes * share, formula=f"{label} x ({t.formula})", first_bytes=t.first_bytes * share
    )


def stack_context(ctx: Context) -> Context:
    """``ctx`` seen without the state-space layers: the same model, every layer an attention layer."""
    arch = ctx.arch
    return ctx.seen_as(arch.with_facts(ssm=None, hybrid=None))


def hybrid_activations(ctx: Context, hf: Callable[[Context], ActivationBudget]) -> ActivationBudget:
    """A hybrid stack's saved and transient activations, one micro-batch (see the module docstring)."""
    arch = ctx.arch
    ssm, n_attn = arch.facts.ssm, arch.facts.attention.layers
    assert ssm is not None and n_attn is not None  # a hybrid declares both (families/jamba.py)
    L = max(arch.num_layers, 1)
    out = hf(stack_context(ctx))
    label = f"{n_attn}/{L} attention layers"
    fa = n_attn / L
    for terms in (out.per_layer, out.cache_per_layer, out.output_cache, out.output_cache_extra):
        terms[:] = [_scaled(t, fa, label) if t.name.startswith(ATTENTION_TERMS) else t for t in terms]
    mixer, backward = jamba_mixer(ctx, ssm)
    share = ssm.layers / L
    what = f"{ssm.layers}/{L} Mamba layers"
    if ctx.scenario.activation_checkpointing == "full":
        # the layer recomputed for its backward is a whole Mamba layer (the lowest and the highest layers are
        # Mamba layers in every Jamba preset): its mixer unscaled, no attention, the stack's average MLP
        out.recomputed_layer = [t for t in out.per_layer if not t.name.startswith(ATTENTION_TERMS)] + mixer
    out.per_layer += [_scaled(t, share, what) for t in mixer]
    if backward.bytes > sum(t.bytes for t in out.layer_backward):
        out.layer_backward[:] = [backward, *above_the_scan(ctx, out.per_layer)]
    return out


def _hybrid(arch: Architecture) -> tuple[HybridFacts, SsmFacts, int]:
    """A hybrid's layer kinds, its state-space sizes and its attention layer count (families/jamba.py)."""
    f = arch.facts
    assert f.hybrid is not None and f.ssm is not None and f.attention.layers is not None
    return f.hybrid, f.ssm, f.attention.layers


def _layer_numel(arch: Architecture, j: int, parts: tuple[str, ...]) -> int:
    """Parameters of layer ``j`` in ``parts`` (``mlp``, ``attention``, ``out_proj``, ``norms``)."""
    hy, ssm, n_attn = _hybrid(arch)
    moe = j in hy.moe_layer_indices
    n_moe = max(len(hy.moe_layer_indices), 1)
    n_dense = max(arch.num_layers - len(hy.moe_layer_indices), 1)
    numel = 0
    for g in arch.params:
        if g.scope != "layer":
            continue
        if "mlp" in parts and ".feed_forward." in g.name and (g.kind in ("experts", "router")) == moe:
            numel += g.numel // (n_moe if moe else n_dense)
        elif "attention" in parts and ".self_attn." in g.name:
            numel += g.numel // max(n_attn, 1)
        elif "out_proj" in parts and ".mamba.out_proj." in g.name:
            numel += g.numel // max(ssm.layers, 1)
        elif "norms" in parts and g.kind == "norm":
            numel += g.numel // arch.num_layers
    return numel


def _layer_saved(arch: Architecture, j: int, per_layer: list[Term], whole: bool) -> float:
    """What layer ``j`` saved of its MLP, MLP input and norms (``whole``: both norms and its attention too)."""
    (hy, _, n_attn), L = _hybrid(arch), arch.num_layers
    moe = j in hy.moe_layer_indices
    part = next(p for p in arch.facts.mlp.parts or () if bool(p.experts) == moe)
    nbytes = sum(t.bytes * L / part.layers for t in per_layer if t.name.startswith(part.name + ":"))
    nbytes += sum(t.bytes for t in per_layer if t.name.startswith("MLP input"))
    norms = sum(t.bytes for t in per_layer if t.name.startswith("RMSNorm"))
    nbytes += norms if whole else norms / arch.facts.norm.per_layer
    if whole:
        nbytes += sum(t.bytes * L / max(n_attn, 1) for t in per_layer if t.name.startswith(ATTENTION_TERMS))
    return nbytes


def above_the_scan(ctx: Context, per_layer: list[Term]) -> list[Term]:
    """The instant of the highest Mamba layer's scan backward (the peak, traced): the layers above it (attention
    layers) and its own MLP and out_proj have run backward, so their weight gradients exist and what they saved is
    released (the moment counts every layer's saved tensors: a negative term)."""
    arch = ctx.arch
    kinds = _hybrid(arch)[0].layer_block_types
    m = max(i for i, k in enumerate(kinds) if k == "mamba")
    above = range(m + 1, arch.num_layers)
    numel = _layer_numel(arch, m, ("mlp", "out_proj"))
    numel += sum(_layer_numel(arch, j, ("mlp", "attention", "norms")) for j in above)
    if not ctx.full_training:  # LoRA: those weights are frozen (their adapters' gradients are not counted)
        numel = 0
    freed = _layer_saved(arch, m, per_layer, whole=False) + sum(
        _layer_saved(arch, j, per_layer, True) for j in above
    )
    gb = ctx.recipe.grad_bytes
    where = f"layer {m}" + (f" and the {len(above)} attention layer(s) above it" if above else "")
    return [
        Term(f"weight gradients made before the scan's backward ({where}: MLP, out_proj)", gb * numel,
             f"{gb} B x {numel:,} params", 3),
        Term(f"tensors released before the scan's backward ({where})", -freed, f"-{freed:,.0f} B", 0),
    ]  # fmt: skip


def jamba_mixer(ctx: Context, ssm: SsmFacts | Mapping[str, Any]) -> tuple[list[Term], Term]:
    """One Jamba mixer's saved tensors (T tokens, I inner channels, N state, R dt rank, K conv kernel) and the
    transients of its backward, for the scan ``ssm_kernel`` picks."""
    sc = ctx.scenario
    ec = ctx.recipe.act_bytes
    b, s = sc.micro_batch_size, ctx.seq_len
    T, h = b * s, ctx.arch.hidden_size
    inner, N, R, K = ssm["inner"], ssm["state_size"], ssm["time_step_rank"], ssm["conv_kernel"]
    terms = [Term("in_proj input: Linear input", ec * T * h, f"{ec} B x T x h", 1)]
    # the three RMSNorms on x_proj's (T, R + 2N) output: fp32 inputs (in fp32 the output's views themselves), rsqrt,
    # the normalised tensor the weight multiply saves, and the dt norm's output saved by dt_proj's matmul
    norms = 4 * T * (R + 2 * N) + 3 * 4 * T + ec * T * (R + 2 * N) + ec * T * R
    nf = f"4 B x T x (R + 2N) + 3 x 4 B x T + {ec} B x T x (R + 2N) + {ec} B x T x R"
    if ssm_kernel(ctx) == "cuda":
        chunks = -(-s // SCAN_CHUNK)
        terms += [
            Term("Jamba mixer: dt, B, C RMSNorms (fp32 inputs, rsqrt, normalised) and dt_proj's input",
                 norms, nf + f", R={R} N={N}", 8),
            # causal_conv1d keeps its input (a view: in_proj's whole output); SelectiveScanFn.forward keeps u, delta,
            # contiguous B, C and z copies, out; x_proj and out_proj keep contiguous copies of their inputs
            Term("Jamba mixer kernels (causal-conv1d, mamba-ssm SelectiveScanFn): in_proj output, conv output and "
                 "x_proj's copy, z, delta, B, C, out, out_proj input",
                 ec * T * (8 * inner + 2 * N), f"{ec} B x T x (8I + 2N), I={inner} N={N}", 9),
            Term("Jamba mixer kernel: fp32 scan intermediates (one per 2048-step chunk)",
                 4 * b * inner * chunks * 2 * N, f"4 B x b x I x ceil(s/{SCAN_CHUNK}) x 2N, chunks={chunks}", 1),
            Term("Jamba mixer: A = -exp(A_log) (fp32, two tensors), D and dt bias (fp32)",
                 8 * inner * N + 8 * inner, f"4 B x I x (2N + 2), I={inner}", 4),
        ]  # fmt: skip
        backward = Term(
            "Jamba mixer kernel backward: du, ddelta, dz, dout, recomputed out, residual gradient",
            ec * T * 6 * inner + ec * T * h,
            f"{ec} B x T x 6I + {ec} B x T x h, I={inner}",
            5,
        )
        return terms, backward
    # transformers' torch path (traced): as Mamba's (engine/activations/ssm.py) less x_proj's output (read
    # through the norms' fp32 copies, and in fp32 counted as their inputs), plus the norms; the C norm's output is
    # kept by the scan's per-step matmuls, the B norm's by its fp32 upcast (the same tensor in fp32: counted there)
    norms += ec * T * N
    dtb = softplus_bytes(ctx, ec)
    bin_ = b * inner * N
    if ec == 4:
        states, fs = 4 * bin_ * (s + 1), "4 B x b x I x N x (s + 1)"
    else:
        states, fs = bin_ * (4 * (s - 1) + ec * (s + 1)), f"b x I x N x (4 B x (s - 1) + {ec} B x (s + 1))"
    if not ctx.full_training:
        return _frozen_jamba_mixer(ctx, ssm, states, fs, dtb)
    terms += [
        Term("Jamba mixer: dt, B, C RMSNorms (fp32 inputs, rsqrt, normalised), dt_proj's input, C",
             norms, nf + f" + {ec} B x T x N, R={R} N={N}", 9),
        Term("Jamba torch path: in_proj output, conv output, x_proj input copy, dt (+ bias, softplus)",
             ec * (T * 2 * inner + b * inner * (s + K - 1) + T * inner) + dtb * 2 * T * inner,
             f"{ec} B x (T x 2I + b x I x (s + K - 1) + T x I) + {dtb} B x 2 x T x I, I={inner}", 5),
        Term("Jamba torch path: discretised A and B (fp32), u and B upcasts",
             2 * 4 * T * inner * N + 4 * T * inner + 4 * T * N,
             f"2 x 4 B x T x I x N + 4 B x T x I + 4 B x T x N, N={N}", 4),
        Term("Jamba torch path: per-step scan states (fp32" + (f", {ec} B copies" if ec != 4 else "") + ")",
             states, fs, 2 * s),
        Term("Jamba torch path: scan output side (u for D, silu(z), the fp32 gated sum, out_proj input)",
             (3 * ec + 4) * T * inner, f"(3 x {ec} + 4) B x T x I, I={inner}", 4),
        Term("Jamba torch path: A = -exp(A_log), D (fp32)", 2 * 4 * inner * N + 4 * inner,
             f"4 B x I x (2N + 1), I={inner}", 3),
    ]  # fmt: skip
    return terms, _torch_scan_backward(T, inner, N, ec, h)


def _torch_scan_backward(T: int, inner: int, N: int, ec: int, h: int) -> Term:
    """The torch-path Jamba mixer's backward transient, trained or frozen alike: the fp32 gradients of the four
    (b, I, s, N) scan tensors and the residual stream's gradient."""
    return Term(
        "Jamba torch path backward: fp32 gradients of the (b, I, s, N) scan tensors, residual gradient",
        4 * 4 * T * inner * N + ec * T * h,
        f"4 x 4 B x T x I x N + {ec} B x T x h, I={inner} N={N}",
        5,
    )


def _frozen_jamba_mixer(
    ctx: Context, ssm: SsmFacts | Mapping[str, Any], states: float, fs: str, dtb: int
) -> tuple[list[Term], Term]:
    """A Jamba mixer under LoRA, torch path: as the trained one less what only its frozen weights' gradients read
    (as Mamba's, engine/activations/ssm.py): no input of a frozen matmul (x_proj's input copy, dt_proj's input,
    the D skip's u, out_proj's input), no normalised tensor of the frozen dt/B/C norms, A once; an adapted
    in_proj or x_proj keeps its adapter's copy of its input."""
    sc, amp = ctx.scenario, uses_autocast(ctx)
    ec, ab = ctx.recipe.act_bytes, ctx.adapter_bytes
    b, s = sc.micro_batch_size, ctx.seq_len
    T, h = b * s, ctx.arch.hidden_size
    inner, N, R, K = ssm["inner"], ssm["state_size"], ssm["time_step_rank"], ssm["conv_kernel"]
    targets = {ad.base.module for ad in ctx.adapters}
    cb = 2 if amp else ab  # the adapter's copy of its input (autocast's 16-bit one, or the adapter dtype's)
    terms = [
        Term(f"{m} input: LoRA input copy", cb * T * w, f"{cb} B x T x {w}", 1)
        for m, w in (("in_proj", h), ("x_proj", inner))
        if m in targets
    ]
    terms += [
        Term("Jamba mixer: dt, B, C RMSNorms (fp32 inputs, rsqrt; weights frozen), C",
             4 * T * (R + 2 * N) + 3 * 4 * T + ec * T * N, f"4 B x T x (R + 2N) + 3 x 4 B x T + {ec} B x T x N", 6),
        Term("Jamba torch path: in_proj output, conv output, dt (+ bias, softplus)",
             ec * (T * 2 * inner + b * inner * (s + K - 1)) + dtb * 2 * T * inner,
             f"{ec} B x (T x 2I + b x I x (s + K - 1)) + {dtb} B x 2 x T x I, I={inner}", 4),
        Term("Jamba torch path: discretised A and B (fp32), u and B upcasts",
             2 * 4 * T * inner * N + 4 * T * inner + 4 * T * N,
             f"2 x 4 B x T x I x N + 4 B x T x I + 4 B x T x N, N={N}", 4),
        Term("Jamba torch path: per-step scan states (fp32" + (f", {ec} B copies" if ec != 4 else "") + ")",
             states, fs, 2 * s),
        Term("Jamba torch path: scan output side (silu(z), the fp32 gated sum)", (ec + 4) * T * inner,
             f"({ec} + 4) B x T x I, I={inner}", 2),
        Term("Jamba torch path: A = -exp(A_log), D (fp32)", 4 * inner * N + 4 * inner,
             f"4 B x I x (N + 1), I={inner}", 2),
    ]  # fmt: skip
    return terms, _torch_scan_backward(T, inner, N, ec, h)
