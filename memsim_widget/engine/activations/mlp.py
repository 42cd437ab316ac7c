"""The MLP and MoE: what each activation function keeps for backward (per T x I element), a dense MLP's saved
tensors, a Mixtral-style MoE layer's router and routed token copies, and the layers whose MLP is made of parts
(dense first layers, MoE every n-th layer, shared experts: ``arch.facts.mlp.parts``)."""

from __future__ import annotations

from memsim_widget.architecture import Architecture
from memsim_widget.engine.activations.layer import HFLayer
from memsim_widget.engine.activations.linears import ATTN_IN, ATTN_OUT, MLP_IN, MLP_OUT


def gelu_tanh_autocast(ec: int, kf: str, I: int) -> tuple[int, str]:
    """Bytes per element and formula of gelu_new's saved chain under CUDA autocast.

    CUDA autocast runs ``pow`` in fp32 (torch.amp docs, CUDA fp32 op list), so ``pow(x, 3)`` saves an fp32
    copy of x and the rest of the chain is promoted: the fp32 tanh output and ``1 + tanh``, beside the
    16-bit ``0.5 x`` -- 12 + e bytes per element where a 16-bit chain keeps 4 x e. Measured on an H200
    (docs/accuracy.md, GPT-2 medium under amp-bf16: 6 B per T x I element per layer more than the 16-bit
    chain); traced with trace/cuda_autocast.py. gelu_fast and gelu_pytorch_tanh have no pow: over-predicted.
    """
    return 12 + ec, f"(3 x 4 B + {ec} B) x {kf}, I={I} (fp32 pow chain under CUDA autocast)"


#: Tensors an activation function keeps for backward, in units of T x I (GPT-2's gelu_new is a chain of
#: pointwise ops: x, 0.5x, tanh(.), 1 + tanh(.); SwiGLU/GeGLU keep gate, up and act(gate)).
ACT_SAVED = {"swiglu": 3, "geglu": 3, "gelu_tanh": 4, "gelu": 1, "relu": 1, "quick_gelu": 2}
#: GPT-OSS experts' clamped SwiGLU ``(clamp(up) + 1) * clamp(gate) * sigmoid(alpha * clamp(gate))`` on the
#: interleaved gate_up output: that output (2 I), sigmoid, clamp(gate), clamp(up) + 1 and the glu (traced)
ACT_SAVED_PART = {"clamped-swiglu": 6}


def fused_gate_up(act: str, n_act: int) -> tuple[int, tuple[float, ...]]:
    """The tensors and their shares a routed expert's activation saves per ``k x T x I``: transformers 5.24.0
    holds a layer's experts' gate and up projections as one ``gate_up_proj`` (``integrations/moe.py``
    ``grouped_mm_experts_forward``, ``models/qwen3_moe/modeling_qwen3_moe.py`` ``Qwen3MoeExperts``), so a gated
    activation's gate and up are two views of one [rows, 2 I] output, saved beside act(gate) [rows, I]: two
    tensors of 2/3 and 1/3 (traced on Qwen3-MoE and Mixtral, full and LoRA); other activations as ``n_act``
    equal tensors."""
    if act in ("swiglu", "geglu") and n_act == 3:
        return 2, (2 / 3, 1 / 3)
    return n_act, ()


def _shares(pieces: list[float]) -> tuple[int, tuple[float, ...]]:
    """The tensors of a term made of ``pieces`` (bytes each; empty ones left out) and their shares."""
    kept = [x for x in pieces if x > 0]
    total = sum(kept)
    return len(kept), tuple(x / total for x in kept)


def grouped_mm_book(full: bool) -> int:
    """Bytes per routed row of grouped_mm's bookkeeping that a MoE layer keeps for backward (transformers 5.24.0
    ``integrations/moe.py``): the top-k indices, the sort permutation, the token index (perm // k), the inverse
    permutation and routing-weight copies, 40 B in all (traced on Qwen3-MoE and Mixtral); frozen experts (LoRA)
    one int64 index less, 32 B (traced on GPT-OSS; Qwen3-MoE and Mixtral keep 40 there too, not yet followed)."""
    return 40 if full else 32


def router_pieces(kind: str, ec: int, T: int, E: int, k: int, fp32_in: int) -> list[int]:
    """The tensors a router of ``kind`` saves (``mlp_parts``' router bytes, one entry per tensor): softmax its
    fp32 probabilities (its 16-bit logits are not kept: transformers 5.24.0 ``Qwen3MoeTopKRouter`` and
    ``MixtralTopKRouter``, traced full and LoRA), sigmoid the fp32 input copy, the fp32 sigmoid and the group mask,
    softmax-fp32 the fp32 input copy and the probabilities, topk-softmax the softmax over the k top logits and
    its gathered copy, topk-sigmoid the fp32 sigmoid over E and the top-k indices."""
    return {
        "softmax": [4 * T * E],
        "sigmoid": [fp32_in, 4 * T * E, T * E],
        "softmax-fp32": [fp32_in, 4 * T * E],
        "topk-softmax": [ec * T * k, ec * T * k],
        "topk-sigmoid": [4 * T * E, 8 * T * k],
    }[kind]


def expert_lora(st: HFLayer, frac: float = 1.0, share: str = "") -> tuple[bool, bool]:
    """LoRA on the fused routed experts and the router (peft 0.21.2 ``ParamWrapper``, ``tuners/lora/layer.py``):
    each forward folds the adapter into the parameter under ``parametrize.cached()``, the experts' as
    ``baddbmm(W, B, A)`` (``_LoraFactorsProxy``), the router's as ``W + B A`` (``_LoraParameterProxy``), and the
    matmul saves that merged weight for backward, beside the experts' adapter factors cast to the weight's dtype
    where they differ (fp32 adapters on a 16-bit model). The merged weight needs a gradient, so the matmul also
    saves its input: grouped_mm its gathered rows (gate_up) or the activation product (down), the router the
    norm's output (traced on Qwen3-MoE, Mixtral and DeepSeek-V3). Adds those terms; returns (gate_up adapted,
    down adapted), whose inputs the caller counts."""
    ads = st.expert_adapters
    if not ads:
        return False, False
    wb, ec, T, h = st.recipe.weight_bytes, st.ec, st.D.T, st.D.h
    E = st.arch.num_experts
    routed = [ad for name, ad in ads.items() if name != "gate.weight"]
    casts, router = st.ab != wb, "gate.weight" in ads
    # a tensor each: the merged weights, each factor's cast, the merged router and its input
    pieces: list[float] = [wb * E * ad.in_features * ad.out_features / st.D.etp for ad in routed]
    if casts:
        pieces += [wb * E * ad.rank * n for ad in routed for n in (ad.in_features, ad.out_features)]
    if router:
        pieces += [wb * E * h, ec * T * h]
    tensors, shares = _shares(pieces)
    st.add(
        f"LoRA on the fused experts: merged weights W + B A ({' + '.join(sorted(ads))})"
        + (", adapters cast" if casts else "")
        + (", the router's input" if router else ""),
        frac * sum(pieces),
        (f"{share} x " if share else "")
        + f"({wb} B x E x out x in per adapted expert parameter, E={E}"
        + (f" + {wb} B x E x r' x (in + out) adapter casts" if casts else "")
        + (f" + {wb} B x E x h router + {ec} B x T x h its input" if router else "")
        + ")",
        tensors,
        shares=shares,
    )
    return "gate_up_proj" in ads, "down_proj" in ads


def parallel_mlp(arch: Architecture) -> bool:
    """The MLP reads a norm of the layer input, beside attention (Phi; GPT-NeoX's parallel residual)."""
    f = arch.facts
    return f.mlp.parallel_attn_mlp or f.norm.inputs < f.norm.per_layer


def mlp(st: HFLayer) -> None:
    """The layer's MLP terms; records the rows and width of its (largest) part and which terms are the MLP's."""
    arch, D, add, consumers = st.arch, st.D, st.add, st.consumers
    T, h, I, ec, r, amp, full = D.T, D.h, D.I, st.ec, st.r, st.amp, st.full
    frozen_first, targets, modules, L = st.frozen_first, st.targets, st.modules, st.L
    mlp_from = len(L)
    moe = arch.is_moe
    parts = arch.facts.mlp.parts  # dense + MoE layers, shared experts (architecture/moe.py)
    if parts:
        Tm, I = mlp_parts(arch, D, parts, add, consumers, full, ec, r, st)
    else:
        if moe:  # every MLP is an expert's
            I = arch.intermediate_size // D.etp
        k = arch.experts_per_token if moe else 1
        Tm = T * k
        n_act = ACT_SAVED.get(arch.mlp_activation, 3)
        kf = f"k x T x I, k={k}" if moe else "T x I"
        # a parallel MLP (NeoX, Phi) reads the norm of the layer input: gradient-free in layer 0 under LoRA
        # unless an MLP-input Linear carries an adapter
        mlp_free0 = frozen_first and parallel_mlp(arch) and not (MLP_IN & modules & targets)
        # Falcon's Linear adds its bias after the matmul: under autocast the fp32 bias promotes the output, so the
        # activation works on (and saves) fp32 (traced)
        ab_ = 4 if amp and arch.facts.linear.unfused_bias else ec
        per_elem, formula = n_act * ab_, f"{n_act} x {ab_} B x {kf}, I={I}"
        if amp and arch.mlp_activation == "gelu_tanh" and ab_ == ec:
            per_elem, formula = gelu_tanh_autocast(ec, kf, I)
        tensors, shares = fused_gate_up(arch.mlp_activation, n_act) if moe else (n_act, ())
        add(
            f"MLP activation internals ({arch.mlp_activation})",
            per_elem * Tm * I,
            formula + ("; none in layer 0 (frozen embeddings)" if mlp_free0 else ""),
            tensors,
            first_bytes=per_elem * Tm * I if mlp_free0 else 0,
            shares=shares,
        )
        consumers(MLP_OUT, I, Tm, ec, "MLP down-projection input", upstream=ATTN_IN | ATTN_OUT | MLP_IN)
    if moe and not parts:
        E = arch.num_experts
        up_lora, down_lora = expert_lora(st)
        if down_lora:  # the merged down weight's gradient reads its input
            add(
                "routed experts: down-projection input (LoRA on the experts)",
                ec * Tm * I,
                f"{ec} B x k x T x I",
            )
        # the router's fp32 probabilities (no logits: ``router_pieces``), the routed copies (the gathered input rows
        # and the down output; frozen experts under LoRA: the down output alone, traced on Mixtral) and grouped_mm's
        # int64 indices (``grouped_mm_book``), a tensor each
        cp, book = (2 if full or up_lora else 1), grouped_mm_book(full)
        pieces = [*router_pieces("softmax", ec, T, E, arch.experts_per_token, 0), *[ec * Tm * h] * cp]
        tensors, shares = _shares([*pieces, *[8 * Tm] * (book // 8)])
        add(
            "MoE router probabilities, routed token copies and indices",
            4 * T * E + cp * ec * Tm * h + book * Tm,
            f"4 B x T x E + {cp} x {ec} B x k x T x h + {book} B x k x T, E={E}",
            tensors,
            shares=shares,
        )
    mlp_to = len(L)
    st.Tm, st.I, st.mlp_from, st.mlp_to = Tm, I, mlp_from, mlp_to


def mlp_parts(arch, D, parts, add, consumers, full, ec, r=None, st=None):  # noqa: ANN001, ANN201
    """MLP terms of families whose layers run different MLPs (dense first layers, MoE every n-th layer) or
    a shared expert beside the routed ones (``arch.facts.mlp.parts``, architecture/moe.py). Per-layer bytes
    are the average over the layers; returns (rows, width) of the largest part for the backward transients.

    A routed part runs transformers 5's default ``grouped_mm`` experts (the eager per-expert loop saves
    alike): the gathered input rows, the gate_up output, act(gate) and the product (saved by down_proj),
    and the down output kept by the routing-weight multiply -- k rows per token in all (frozen experts under
    LoRA: no gathered rows, no down_proj input). A part's ``activation`` (GPT-OSS ``"clamped-swiglu"``)
    overrides the model's for its internals. Its router saves, for ``"softmax"`` (Qwen3-MoE) the fp32
    probabilities over E; for ``"sigmoid"`` (DeepSeek-V3) the fp32 copy of its
    input, the fp32 logits' sigmoid and the group mask; for ``"softmax-fp32"`` (DeepSeek-V2) the fp32 input
    copy and the fp32 probabilities; for ``"topk-softmax"`` (GPT-OSS) the softmax over its k top logits
    and the gathered copy; for ``"topk-sigmoid"`` (Llama 4) the fp32 sigmoid over all E (non-chosen logits set
    to -inf) and the top-k indices. A ``dispatch: "dense"`` part (Llama 4: ``rows`` = E, every expert runs every
    token with ``torch.bmm``) keeps the repeated input, its score-scaled copy and the score column instead of
    grouped_mm's gathered rows and int64 bookkeeping (traced)."""
    T, h = D.T, D.h
    layers = max(arch.num_layers, 1)
    worst = (T, 0)
    for part in parts:
        frac = part.layers / layers
        rows = T * part.rows
        width = part.width // (D.etp if part.experts else D.tp)
        name, share = part.name, f"{part.layers}/{layers} layers"
        act = arch.mlp_activation if part.activation is None else part.activation
        n_act = ACT_SAVED_PART.get(act, ACT_SAVED.get(act, 3))
        tensors, shares = fused_gate_up(act, n_act) if part.experts else (n_act, ())
        add(
            f"{name}: activation internals ({act})",
            frac * n_act * ec * rows * width,
            f"{share} x {n_act} x {ec} B x {part.rows} x T x {width}",
            tensors,
            shares=shares,
        )
        if rows * width > worst[0] * worst[1]:
            worst = (rows, width)
        E = part.experts
        if not E:
            consumers(MLP_OUT, width, rows * frac, ec, f"{name}: down-projection input")
            continue
        up_lora, down_lora = expert_lora(st, frac, share) if st is not None else (False, False)
        if full or down_lora:
            add(
                f"{name}: down-projection input",
                frac * ec * rows * width,
                f"{share} x {ec} B x k x T x {width}",
            )
        kind = part.router
        # grouped_mm keeps per routed row the gathered input and the down output (2 copies), plus its
        # bookkeeping (``grouped_mm_book``); frozen experts (LoRA) keep no gathered input. Llama 4 (``dispatch: dense``)
        # keeps the repeated input (residual dtype: fp32 under autocast, where bmm saves a 16-bit cast of the
        # scaled copy), the score-scaled copy (none when the experts are frozen) and the score column.
        dense = part.dispatch == "dense"
        copies = 2 if full or up_lora else 1
        rb = (r or ec) if dense else ec
        book = ec if dense else grouped_mm_book(full)
        routed = (rb + (copies - 1) * ec) * rows * h + book * rows
        k = part.rows if part.top_k is None else part.top_k
        # DeepSeek's fp32 router keeps its fp32 input copy only for its own weight's gradient (none under LoRA)
        fp32_in = 4 * T * h if full else 0
        # a tensor each: the router's (``router_pieces``), the routed copies and grouped_mm's bookkeeping (its
        # int64 index tensors, 8 B per row each; Llama 4: the score column)
        saved = router_pieces(kind, ec, T, E, k, fp32_in)
        router = sum(saved)
        pieces = [*saved, rb * rows * h, *[ec * rows * h] * (copies - 1)]
        pieces += [book * rows] if dense else [8 * rows] * (book // 8)
        tensors, shares = _shares(pieces)
        add(
            f"{name}: router ({kind}) and routed token copies",
            frac * (router + routed),
            f"{share} x (router over E={E} + ({rb}"
            + (f" + {ec}" if copies > 1 else "")
            + ") B x k x T x h + "
            + (f"{ec} B x E x T scores)" if dense else f"{book} B x k x T indices)"),
            tensors,
            shares=shares,
        )
    return worst
