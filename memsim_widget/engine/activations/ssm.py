"""State-space layers (Mamba, Mamba-2): what the mixer saves per layer and holds in its backward, on
mamba-ssm's fused kernels or transformers' pure-PyTorch path (``ssm_kernel``)."""

from __future__ import annotations

from memsim_widget.engine.activations.budget import Term
from memsim_widget.engine.activations.layer import HFLayer
from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import uses_autocast


def ssm_layer(st: HFLayer) -> None:
    """Mamba: no attention, no MLP; the mixer's own tensors replace them (families/mamba.py)."""
    del st.L[st.ssm_from :]
    ssm_mixer(st.ctx, st.D, st.ssm, st.add, st.consumers, st.ec)
    st.mlp_from = st.ao_from = st.ao_to = st.mlp_to = len(st.L)


def ssm_kernel(ctx: Context) -> str:
    """The scan a state-space layer runs: the scenario's ``ssm_kernel``, by default ``cuda`` (mamba-ssm)."""
    return ctx.scenario.ssm_kernel or "cuda"


def softplus_bytes(ctx: Context, ec: int) -> int:
    """Bytes per element of the torch scans' dt + bias and softplus(dt): under autocast softplus runs in fp32 (it
    is on CUDA autocast's fp32 list, torch.amp docs "CUDA Ops that can autocast to float32"), so it saves an fp32
    copy of its 16-bit input and returns fp32 (transformers 5.24 ``mamba_selective_scan``; traced with the trace's
    CUDA-like autocast, trace/cuda_autocast.py)."""
    return 4 if uses_autocast(ctx) else ec


#: mamba-ssm's selective_scan_cuda keeps its fp32 (a, b) scan pairs once per chunk of this many steps
#: (csrc/selective_scan/selective_scan_fwd_kernel.cuh: kChunkSize = kNThreads x kNItems = 2048)
SCAN_CHUNK = 2048


def ssm_mixer(ctx, D, ssm, add, consumers, ec):  # noqa: ANN001, ANN201
    """A Mamba (v1) mixer's saved tensors, per layer (``MambaMixer``, transformers 5.24); T tokens, I inner
    channels, N state size, R time-step rank, K conv kernel.

    ``ssm_kernel: "torch"`` (traced, docs/fidelity.md): transformers' ``slow_forward`` path. in_proj's output
    (b, 2I, s) stays alive through the views the conv and the gate read; the depthwise conv's padded output
    (b, I, s + K - 1), read by SiLU; x_proj's input (a contiguous copy of the transposed SiLU output) and output
    (dt, B, C are views of it); dt + bias and softplus(dt); the discretised A = exp(A dt) and B dt, each
    (b, I, s, N) fp32, with u.float() and B.float(); then the sequential scan keeps every step's state: an fp32
    (b, I, N) saved by the next step's multiply and its compute-dtype copy saved by the matmul with C. These
    s x b x I x N x (4 + e) bytes are what makes this path large.

    ``ssm_kernel: "cuda"`` (formula from mamba-ssm's saved tensors, not traced): ``MambaInnerFn.forward``
    (state-spaces/mamba, mamba_ssm/ops/selective_scan_interface.py, checkpoint_lvl=1) calls
    ``ctx.save_for_backward(xz, conv1d_weight, conv1d_bias, x_dbl, x_proj_weight, delta_proj_weight,
    out_proj_weight, conv1d_out=None, delta=None, A, B, C, D, delta_bias, scan_intermediates, out, ...)``: xz is
    the contiguous copy of in_proj's transposed output (b, 2I, s), x_dbl = x_proj's output (T, R + 2N), B and C
    contiguous (b, 1, N, s) copies, ``out`` (b, I, s) in the compute dtype, and ``scan_intermediates`` from
    ``selective_scan_cuda.fwd``: fp32 (b, I, ceil(s / 2048), 2N), one scan pair per 2048-step chunk. The conv
    output and delta are recomputed in backward. The kernel computes the states in SRAM and keeps none."""
    T, b, s, h = D.T, D.b, D.s, D.h
    inner = ssm["inner"] // D.tp
    N, R, K = ssm["state_size"], ssm["time_step_rank"], ssm["conv_kernel"]
    frac = ssm["layers"] / max(ctx.arch.num_layers, 1)
    kernel = ssm_kernel(ctx)
    consumers(frozenset({"in_proj"}), h, T, ec, "in_proj input")
    share = "" if frac == 1 else f"{ssm['layers']}/{ctx.arch.num_layers} layers x "

    def put(name: str, nbytes: float, formula: str, tensors: int = 1) -> None:
        add(name, frac * nbytes, share + formula, tensors)

    if ssm["version"] == 2:
        _mamba2_mixer(D, ssm, put, ec, kernel, frozen=not ctx.full_training, amp=uses_autocast(ctx))
        return

    if kernel == "cuda":
        chunks = -(-s // SCAN_CHUNK)
        put(
            "Mamba kernel (mamba-ssm MambaInnerFn): xz, x_dbl, B, C, out",
            ec * T * (2 * inner + R + 2 * N + 2 * N + inner),
            f"{ec} B x T x (2I + R + 2N + 2N + I), I={inner} N={N} R={R}",
            5,
        )
        put(
            "Mamba kernel: fp32 scan intermediates (one per 2048-step chunk)",
            4 * b * inner * chunks * 2 * N,
            f"4 B x b x I x ceil(s/{SCAN_CHUNK}) x 2N, chunks={chunks}",
        )
        put("Mamba kernel: A (fp32)", 4 * inner * N, f"4 B x I x N, I={inner} N={N}")
        return
    dtb = softplus_bytes(ctx, ec)
    # LoRA (frozen weights): a frozen matmul keeps no input, so x_proj's input copy is not kept (an adapter on
    # x_proj keeps its own cast copy, as on any Linear), nor the D skip's u or out_proj's input, and A =
    # -exp(A_log) once (its exp output is for A_log's gradient) -- MambaMixer's slow path, transformers 5.24;
    # traced (docs/fidelity.md)
    frozen = not ctx.full_training
    xin = 0 if frozen else 1
    if frozen:
        consumers(frozenset({"x_proj"}), inner, T, ec, "x_proj input")
    put(
        "Mamba torch path: in_proj output, conv output, " + ("x_proj input copy and " if xin else "x_proj ")
        + "output, dt (+ bias, softplus)",
        ec * (T * 2 * inner + b * inner * (s + K - 1) + xin * T * inner + T * (R + 2 * N)) + dtb * 2 * T * inner,
        f"{ec} B x (T x 2I + b x I x (s + K - 1)" + (" + T x I" if xin else "") + " + T x (R + 2N)) + "
        f"{dtb} B x 2 x T x I, I={inner} N={N} R={R}",
        6,
    )  # fmt: skip
    put(
        "Mamba torch path: discretised A and B (fp32), u and B upcasts",
        2 * 4 * T * inner * N + 4 * T * inner + 4 * T * N,
        f"2 x 4 B x T x I x N + 4 B x T x I + 4 B x T x N, N={N}",
        4,
    )
    # counted with saved-tensor hooks: the step multiply saves the previous state (s - 1 fp32 states and the zero
    # initial state in the compute dtype), the matmul with C each state's compute-dtype copy (s of them); in fp32
    # the copy is the state itself, so the last state is saved too
    bin_ = b * inner * N
    if ec == 4:
        states, fs = 4 * bin_ * (s + 1), "4 B x b x I x N x (s + 1)"
    else:
        states, fs = bin_ * (4 * (s - 1) + ec * (s + 1)), f"b x I x N x (4 B x (s - 1) + {ec} B x (s + 1))"
    put("Mamba torch path: per-step scan states (fp32" + (f", {ec} B copies" if ec != 4 else "") + ")",
        states, fs, 2 * s)  # fmt: skip
    side = 1 if frozen else 3
    put(
        "Mamba torch path: scan output side ("
        + (
            "silu(z), the fp32 gated sum"
            if frozen
            else "u for D, silu(z), the fp32 gated sum, out_proj input"
        )
        + ")",
        (side * ec + 4) * T * inner,
        f"({side} x {ec} + 4) B x T x I, I={inner}",
        2 if frozen else 4,
    )
    na = 1 if frozen else 2
    put(
        "Mamba torch path: A = -exp(A_log), D (fp32)",
        na * 4 * inner * N + 4 * inner,
        f"4 B x I x ({na}N + 1), I={inner}",
        na + 1,
    )  # fmt: skip


def _mamba2_mixer(D, ssm, put, ec, kernel, frozen=False, amp=False):  # noqa: ANN001, ANN202
    """A Mamba-2 mixer's saved tensors, per layer (``Mamba2Mixer``, transformers 5.24); I = H x P inner channels,
    H heads of P, G groups, N state, l = chunk_size, c = ceil(s / l) chunks, s' = c x l (padded), K conv kernel.

    ``ssm_kernel: "cuda"`` (formula from mamba-ssm's saved tensors, not traced): transformers calls
    ``mamba_split_conv1d_scan_combined`` (state-spaces/mamba, mamba_ssm/ops/triton/ssd_combined.py), whose
    ``MambaSplitConv1dScanCombinedFn.forward`` runs ``ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias,
    out_x, A, D, dt_bias, initial_states, seq_idx, rmsnorm_weight, rstd, outproj_weight, outproj_bias)``:
    zxbcdt is in_proj's output (T x (2I + 2GN + H)), out_x the scan output (T x I) in the compute dtype, rstd the
    gated RMSNorm's fp32 (T x G); the conv output, the chunk states and the norm output are recomputed in backward.

    ``ssm_kernel: "torch"`` (counted with saved-tensor hooks over chunk sizes, paddings and dtypes, then traced):
    ``mamba2_chunk_scan``'s SSD in fp32 -- per chunk the (l x l) decay L = exp(segsum(A dt)), the C.B scores G and
    M = G x L (b x H x s' x l each), B and C repeated to the H heads and their einsum copies (5 x b x s' x H x N),
    x dt and its einsum layouts (b x s' x I, several), the chunk states (b x (c + 1) x I x N and b x c x I x N),
    plus in_proj's output, the conv's padded output, dt, and the gated RMSNorm's fp32 chain (4 x 4 B x T x I).
    Under LoRA (``frozen``: adapters on in_proj, the only Linear peft wraps here) what only the frozen weights'
    gradients read is not saved (counted with saved-tensor hooks, then traced): the D skip's fp32 x (4 B x T x I),
    one fp32 dt (dt_bias, 4 B x T x H), the norm's fp32 normalised tensor (4 B x T x I), out_proj's input and A.
    Under autocast (``amp``; saved-tensor hooks bf16 vs amp, then traced) the SSD's five einsums run their bmm in
    bf16: every operand copy they keep (C and B for G, M and x for Y_diag, B_decay and x for the states, the
    chunk states and their decay for the recurrence, C and the states for C_times_states) and G are 2 B, where
    L, B (kept by B x decay) and x's fp32 copy stay fp32. The conv keeps a bf16 copy of its input (b x (I + 2GN)
    x s: the torch fallback's ``.to(weight.dtype)`` to the fp32 weight, cast back by autocast) rather than
    in_proj's whole output."""
    T, b, s = D.T, D.b, D.s
    inner, N, K = ssm["inner"], ssm["state_size"], ssm["conv_kernel"]
    H, G, l = ssm["heads"], ssm["groups"], ssm["chunk_size"]
    proj = 2 * inner + 2 * G * N + H
    if kernel == "cuda":
        put(
            "Mamba-2 kernel (mamba-ssm MambaSplitConv1dScanCombinedFn): zxbcdt, out_x, rstd",
            ec * T * (proj + inner) + 4 * T * G,
            f"{ec} B x T x ((2I + 2GN + H) + I) + 4 B x T x G, I={inner} G={G} N={N} H={H}",
            3,
        )
        put("Mamba-2 kernel: A (fp32)", 4 * H, f"4 B x H, H={H}")
        return
    c = -(-s // l)
    sp = c * l
    fp32 = ec == 4
    # under autocast the conv's torch fallback casts its input to the fp32 weight's dtype and autocast casts it
    # back (``causal_conv1d_fn``: ``hidden_states.to(weight.dtype)``): the conv keeps that (b, I + 2GN, s) copy,
    # and nothing keeps in_proj's whole output (the gate is read through an fp32 copy)
    conv_in, fin = (T * (inner + 2 * G * N), "T x (I + 2GN)") if amp else (T * proj, "T x (2I + 2GN + H)")
    put(
        "Mamba-2 torch path: " + ("conv input copy" if amp else "in_proj output") + ", conv output, dt (+ bias, "
        "softplus)",
        ec * (conv_in + b * (inner + 2 * G * N) * (s + K - 1) + 2 * T * H),
        f"{ec} B x ({fin} + b x (I + 2GN) x (s + K - 1) + 2 x T x H), I={inner} G={G} N={N} H={H}",
        4,
    )  # fmt: skip
    # fp32: x.float() is the conv's SiLU output itself (b x s x (I + 2GN)); dt.float() is dt (one tensor fewer)
    xf = 4 * T * (inner + 2 * G * N) if fp32 else 4 * b * sp * inner
    dts = (1 if fp32 else 2) - frozen  # dt_bias frozen: one fp32 dt fewer
    put(
        "Mamba-2 torch path: x (fp32, padded), x dt, dt (fp32)" + (" (frozen: no D-skip copy)" if frozen else ""),
        xf + (0 if frozen else 4 * b * sp * inner) + dts * 4 * T * H,
        ("4 B x T x (I + 2GN)" if fp32 else "4 B x b x s' x I") + ("" if frozen else " + 4 B x b x s' x I")
        + f" + {dts} x 4 B x T x H, s'={sp}",
        4,
    )  # fmt: skip
    # a single chunk: the states slice is a view, not a copy (and at some shapes one B/C einsum layout too, which
    # is still counted: up to 4 B x b x s' x H x N high when s <= chunk_size)
    one = c == 1
    # e: the einsums' operand copies (bmm inputs) and G, an einsum output: fp32, or 16-bit under autocast, which
    # runs einsum's bmm in bf16 (the operands cast, the output bf16); L and B (kept by elementwise products) stay
    e = 2 if amp else 4
    hn = (4 + 4 * e) * b * sp * H * N + (0 if one else e * b * c * inner * N)
    put(
        "Mamba-2 torch path: SSD chunk tensors" + (" (einsum operands and G in bf16 under autocast)" if amp else
        " (fp32)") + ": L, G, M (b x H x s' x l), B/C per head, x layouts, states",
        (4 + 2 * e) * b * H * sp * l + 2 * 4 * b * H * sp + hn + 3 * e * b * sp * inner
        + e * b * (c + 1) * inner * N + e * b * H * (c + 1) ** 2 + 2 * l * l + 2 * (c + 1) ** 2,
        f"(4 + 2 x {e}) B x b x H x s' x l + (4 + 4 x {e}) B x b x s' x H x N + 3 x {e} B x b x s' x I"
        + ("" if one else f" + {e} B x b x c x I x N") + f" + {e} B x b x (c + 1) x I x N + ..., l={l} c={c}",
        14,
    )  # fmt: skip
    chain = (4 if fp32 else 5) - frozen  # the norm weight frozen: no fp32 normalised tensor
    put(
        "Mamba-2 torch path: gated RMSNorm (fp32 chain, rstd)" + ("" if frozen else " and out_proj input"),
        chain * 4 * T * inner + (0 if frozen else ec * T * inner) + 4 * T * G,
        f"{chain} x 4 B x T x I" + ("" if frozen else f" + {ec} B x T x I") + f" + 4 B x T x G, I={inner}",
        7,
    )
    put(
        "Mamba-2 torch path: A (fp32)",
        (1 if frozen else 2) * 4 * H,
        f"{1 if frozen else 2} x 4 B x H, H={H}",
        2,
    )


def _mamba2_backward(ctx, D, ssm, ec, r):  # noqa: ANN001, ANN202
    """Transients of one Mamba-2 layer's backward (see ssm_backward): the larger of the gated norm's backward and,
    under full checkpointing with autocast, the recomputed layer's SSD output (``_mamba2_recomputed_ssd``)."""
    T, inner, G, N, H = D.T, ssm["inner"], ssm["groups"], ssm["state_size"], ssm["heads"]
    proj = 2 * inner + 2 * G * N + H
    if ssm_kernel(ctx) == "cuda":
        return Term(
            "Mamba-2 kernel backward: dzxbcdt, recomputed conv output and its gradient, residual gradient",
            ec * T * (proj + 2 * (inner + 2 * G * N)) + r * T * D.h,
            f"{ec} B x T x ((2I + 2GN + H) + 2 x (I + 2GN)) + {r} B x T x h, I={inner}",
            4,
        )
    # traced (full checkpointing, bf16 b2 s512, fp32 b2 s256, LoRA on in_proj; the peak is inside the recomputed
    # top layer's gated RMSNorm backward, the V64 row's too): five fp32 T x I gradients of the norm's chain live
    # at once. By then what only the weight gradients read is freed once they are made (trained weights only:
    # out_proj's input, e B x T x I, and the norm's fp32 normalised tensor, 4 B x T x I), and rstd (4 B x T x G)
    # always; out_proj's and the norm's weight gradients are live; the residual gradient is fp32 when
    # ``residual_in_fp32`` (the block adds ``residual.float()``)
    full = ctx.full_training
    rg = 4 if ctx.arch.extra.get("residual_in_fp32", False) else r
    grads = ec * (D.h * inner + inner) if full else 0
    freed = (ec + 4) * T * inner if full else 0
    norm = Term(
        "Mamba-2 torch path backward: gated RMSNorm's five fp32 gradients"
        + (" (net of out_proj's input and the normalised tensor, freed), out_proj and norm weight gradients"
           if full else "") + ", residual gradient",
        5 * 4 * T * inner - freed - 4 * T * G + grads + rg * T * D.h,
        "5 x 4 B x T x I" + (f" - ({ec} + 4) B x T x I" if full else "") + " - 4 B x T x G"
        + (f" + {ec} B x (h x I + I)" if full else "") + f" + {rg} B x T x h, I={inner} G={G}",
        8 if full else 6,
    )  # fmt: skip
    if not (uses_autocast(ctx) and ctx.scenario.activation_checkpointing == "full"):
        return norm
    ssd = _mamba2_recomputed_ssd(D, ssm, ec, rg, full)
    return ssd if ssd.bytes > norm.bytes else norm


def _mamba2_recomputed_ssd(D, ssm, ec, rg, full):  # noqa: ANN001, ANN202
    """The recomputed Mamba-2 layer at its SSD output, under autocast and full checkpointing (traced, amp-bf16
    b2 s512: the peak is the ``.contiguous()`` copy of ``Y_diag + Y_off`` in ``mamba2_chunk_scan``, in the bottom
    layer's recompute for full training, the top layer's under LoRA), as a transient beside the layer's saved set.

    Live there and freed before the recompute ends (Python locals of ``Mamba2Block``, ``Mamba2Mixer`` and
    ``mamba2_chunk_scan``, transformers 5.24): the block norm's fp32 output (4 B x T x h), in_proj's output and
    the conv's SiLU output (e B x T x (2I + 2GN + H) and e B x T x (I + 2GN)), the D skip and the padded x dt
    (2 x 4 B x b x s' x I), the padded A dt and its cumsum (2 x 4 B x b x s' x H), the padded C and B x decay
    (2 x 4 B x b x s' x H x N), M = G x L in fp32 (4 B x b x H x s' x l), Y_diag, the zero initial state and the
    recurrence's output in bf16 (e B x b x s' x I, e B x b x I x N, e B x b x (c + 1) x I x N), and Y_off, the
    fp32 sum and its contiguous copy (3 x 4 B x b x s' x I). Not made yet: the gated norm's saved chain (the
    saved-set term ``gated RMSNorm``) and, trained, out_proj's 16-bit weight copy (e B x h x I); under LoRA the
    frozen in_proj's 16-bit weight copy is live (the saved set does not count frozen copies under checkpointing).
    The gradient coming in: the fp32 residual gradient and its 16-bit cast for the mixer's output."""
    T, b, s, h = D.T, D.b, D.s, D.h
    inner, N, H, G, l = ssm["inner"], ssm["state_size"], ssm["heads"], ssm["groups"], ssm["chunk_size"]
    proj, conv = 2 * inner + 2 * G * N + H, inner + 2 * G * N
    c = -(-s // l)
    sp = c * l
    live = (
        4 * T * h + ec * T * (proj + conv) + 4 * b * sp * (2 * inner + 2 * H + 2 * H * N + H * l)
        + ec * b * (sp * inner + inner * N + (c + 1) * inner * N) + 3 * 4 * b * sp * inner
    )  # fmt: skip
    chain = 5 - (not full)  # the gated norm's saved set (see _mamba2_mixer, not fp32)
    later = (
        chain * 4 * T * inner + (ec * T * inner if full else 0) + 4 * T * G + (ec * h * inner if full else 0)
    )
    copy = 0 if full else ec * h * proj
    return Term(
        "Mamba-2 torch path: the recomputed layer at its SSD output (autocast): block norm output, in_proj and "
        "conv outputs, the SSD's fp32 locals and output copies, net of the gated norm's saved set not yet made"
        + ("" if full else ", frozen in_proj's 16-bit weight copy") + ", residual gradient and its 16-bit cast",
        live - later + copy + (rg + ec) * T * h,
        f"4 B x T x h + {ec} B x T x ((2I + 2GN + H) + (I + 2GN)) + 4 B x b x s' x (2I + 2H + 2HN + Hl) + "
        f"{ec} B x b x (s' x I + I x N + (c + 1) x I x N) + 3 x 4 B x b x s' x I - ({chain} x 4 B x T x I"
        + (f" + {ec} B x T x I" if full else "") + " + 4 B x T x G"
        + (f" + {ec} B x h x I" if full else "") + ")" + ("" if full else f" + {ec} B x h x (2I + 2GN + H)")
        + f" + ({rg} + {ec}) B x T x h, I={inner} G={G} N={N} H={H} l={l} c={c} s'={sp}",
        18,
    )  # fmt: skip


def ssm_checkpointed_inputs(st: HFLayer) -> None:
    """What each checkpointed ``MambaBlock`` or ``Mamba2Block`` keeps under full checkpointing: its input, the
    block's ``hidden_states`` argument. HF wraps every block (a ``GradientCheckpointingLayer``, transformers 5.24
    ``modeling_layers.py``, ``modeling_mamba.py``/``modeling_mamba2.py``) in torch.utils.checkpoint, which keeps
    only the arguments. With ``residual_in_fp32`` (the default) both blocks return ``residual.float() +
    mixer(...)``, an fp32 tensor, so the inputs of layers 1..L-1 are 4 B x T x h and layer 0's is the embedding's
    output in the compute dtype (traced: Mamba-2 bf16 b2 s512, 3 fp32 and 1 bf16 input live in the top layer's
    backward; Mamba bf16 LoRA b2 s64 -0.51% -> -0.00%). The term is per layer, so it holds the mean of the L
    inputs: exact with all L alive (the backward's top), high by (4 - e) B x T x h at its end. Not Jamba, whose
    blocks keep the compute dtype."""
    ssm, sc, arch = st.ssm, st.sc, st.arch
    if not ssm or arch.facts.hybrid is not None or sc.activation_checkpointing != "full":
        return
    if st.r == 4:
        _norm_input_kept_once(st)
        return
    if not arch.extra.get("residual_in_fp32", False):
        return
    L, T, h, e = max(arch.num_layers, 1), st.D.Tout, st.D.h, st.r
    st.out.checkpointed_layer = [
        Term(
            "checkpointed layer inputs (fp32 block outputs; layer 0's the embedding's)",
            (e + (L - 1) * 4) * T * h / L,
            f"({e} B + {L - 1} x 4 B) / {L} x T x h per layer",
            1,
        )
    ]


def _norm_input_kept_once(st: HFLayer) -> None:
    """An fp32 residual stream (fp32, autocast) under full checkpointing: the recomputed block's RMSNorm saves its
    fp32 input as is, and that input is the checkpointed one. The recomputed layer then adds the rsqrt only, the
    input counted once among the kept ones (every layer's at the top of backward, layer 0's at its bottom): traced,
    LoRA on in_proj, whose peak is the top layer's backward, fp32 b2 s256 +1.52% -> -0.04% and amp-bf16 b2 s512
    with its SSD output (``_mamba2_recomputed_ssd``) -1.50% -> -0.08%; the bottom's figure does not move."""
    out, T = st.out, st.D.Tout
    rsqrt = Term("RMSNorm rsqrt (its fp32 input is the checkpointed input, kept once)", 4 * T, "4 B x T", 1)
    out.ckpt_input_shared = False
    out.recomputed_layer = [rsqrt if t.name == "RMSNorm fp32 inputs and rsqrt" else t for t in out.per_layer]


def ssm_backward(ctx, D, ssm, ec, r):  # noqa: ANN001, ANN201
    """Transients while one Mamba layer runs backward: torch path, the gradients of the (b, I, s, N) fp32
    discretised tensors (select_backward buffers of the scan and their sum, traced); kernel path, the
    recomputed conv output and delta, dxz and the out-projection gradient (mamba-ssm's backward, not traced)."""
    T, inner, N = D.T, ssm["inner"] // D.tp, ssm["state_size"]
    if ssm["version"] == 2:
        return _mamba2_backward(ctx, D, ssm, ec, r)
    if ssm_kernel(ctx) == "cuda":
        return Term(
            "Mamba kernel backward: recomputed conv output and delta, dxz, dout_y, residual gradient",
            ec * T * 6 * inner + r * T * D.h,
            f"{ec} B x T x 6I + {r} B x T x h, I={inner}",
            5,
        )
    return Term(
        "Mamba torch path backward: fp32 gradients of the (b, I, s, N) scan tensors, residual gradient",
        4 * 4 * T * inner * N + r * T * D.h,
        f"4 x 4 B x T x I x N + {r} B x T x h, I={inner} N={N}",
        5,
    )
