"""The loss on the last stage: the logits and their fp32 copies while the loss runs, what it saves until its
backward and the T x V buffers its backward allocates (standard, torchtune's fp32 logits, loss parallel, chunked),
and the fp32 final hidden state an autocast model's output holds meanwhile."""

from __future__ import annotations

from memsim_widget.engine.activations.budget import Term
from memsim_widget.engine.activations.layer import HFLayer
from memsim_widget.engine.frameworks import loss_compiled_apart, loss_parallel

#: Chunks of the fused linear + cross-entropy loss (torchtune / Liger style) when loss="chunked".
LOSS_CHUNKS = 8
#: The name of the term of the head's final-logit softcapping (its tanh output, saved until its backward).
SOFTCAP_SAVED = "final logit softcapping"
#: The name of the fp32 copy of the 16-bit log-softmax that nll_loss makes and saves under CUDA autocast
#: (``autocast_ce_saved``); the allocation stream frees it first in backward.
NLL_FP32_COPY = "nll_loss's fp32 copy of the log-softmax (CUDA autocast), saved by the loss"
#: The name of loss parallel's backward buffers (``loss_parallel_terms``); the allocation stream makes and frees
#: them in the kernel's order.
LOSS_PARALLEL_BACKWARD = "loss-parallel backward"
#: The name of the terms of a loss function compiled apart from the model (``compiled_apart_terms``); the
#: allocation stream finds the logits it saves and its backward buffer by it.
COMPILED_APART = "loss compiled apart"
#: The name of loss parallel's ``x - x_max`` (``loss_parallel_terms``), freed as soon as the log-softmax is made.
LOSS_PARALLEL_SHIFTED = "loss-parallel log-softmax's shifted logits (x - max)"


def V_final_fp32(arch: object) -> bool:  # noqa: N802
    """Autocast models whose final hidden state stays fp32 while the loss runs (all HF decoders)."""
    return bool(getattr(arch, "vocab_size", 0))


def final_hidden_fp32(st: HFLayer) -> None:
    """Under autocast the model output holds the fp32 final hidden state while the loss runs."""
    arch, out, Tout, h = st.arch, st.out, st.D.Tout, st.D.h
    if st.amp and V_final_fp32(arch):
        out.loss_forward.append(
            Term("final hidden states (fp32) held by the model output", 4 * Tout * h, "4 B x T x h", 1)
        )


def loss(st: HFLayer) -> None:
    """The loss's terms (none without a vocabulary); records the logits' bytes and whether the loss upcasts."""
    arch, sc, recipe, prof, out, amp = st.arch, st.sc, st.recipe, st.prof, st.out, st.amp
    T, V = st.D.T, st.D.V
    if not V:
        return
    le = 4 if recipe.fp32_compute else 2
    upcast_loss = arch.facts.output.loss_upcast
    # a loss on the logits as they are (BERT, RoBERTa, T5, ViT) under CUDA autocast: 16-bit log-softmax, then
    # nll_loss's fp32 copy of it (autocast_ce_terms)
    autocast_ce = amp and not upcast_loss and le != 4
    if sc.loss == "chunked":
        chunk = T * V / LOSS_CHUNKS
        out.loss_backward.append(
            Term(
                f"one loss chunk's logits and fp32 log-softmax (1/{LOSS_CHUNKS})",
                (le + 8) * chunk,
                f"({le} + 2 x 4) B x T x V / {LOSS_CHUNKS}",
                3,
            )
        )
        out.loss_forward.append(
            Term(
                f"one loss chunk's logits (1/{LOSS_CHUNKS})",
                (le + 4) * chunk,
                f"({le} + 4) B x T x V / {LOSS_CHUNKS}",
                2,
            )
        )
    elif upcast_loss and prof.fp32_logits_output:
        # torchtune (2024): the model returns fp32 logits (output(h).float(): the 16-bit matmul output
        # dies at once); the recipe shifts them with .contiguous() (a second fp32 T x V, which replaces
        # the first) and keeps that copy referenced through loss.backward().
        shift = " (shifted .contiguous() copy)" if prof.shift_copy else ""
        out.loss_forward.append(
            Term(
                "fp32 logits returned by the model" + shift,
                4 * T * V,
                "4 B x T x V (the copy and the original never both meet the log-softmax)"
                if prof.shift_copy
                else "4 B x T x V",
                1,
            )
        )
        out.loss_saved.append(Term("fp32 log-softmax saved by the loss", 4 * T * V, "4 B x T x V", 1))
        out.loss_backward.append(
            Term("loss backward: two fp32 T x V gradient buffers", 8 * T * V, "2 x 4 B x T x V", 2)
        )
    elif autocast_ce:
        autocast_ce_terms(st, T, V, le)
    elif upcast_loss and loss_compiled_apart(sc):
        compiled_apart_terms(st, T, V, le)
    elif upcast_loss:
        # HF causal LMs (ForCausalLMLoss): logits = lm_head(h) in the compute dtype; the loss upcasts them
        # (.float()) and log_softmax saves its fp32 output. The trainer drops the logits before backward.
        out.loss_forward.append(
            Term(
                "logits" + (" and their fp32 upcast" if le != 4 else ""),
                (le + (4 if le != 4 else 0)) * T * V,
                f"({le}{' + 4' if le != 4 else ''}) B x T x V, V={V}",
                1 if le == 4 else 2,
                shares=() if le == 4 else (le / (le + 4), 4 / (le + 4)),
            )
        )
        out.loss_saved.append(Term("fp32 log-softmax saved by the loss", 4 * T * V, "4 B x T x V", 1))
        if loss_parallel(sc):
            loss_parallel_terms(st, T, V)
        else:
            out.loss_backward.append(
                Term("loss backward: two fp32 T x V gradient buffers", 8 * T * V, "2 x 4 B x T x V", 2)
            )
    else:
        # BERT, T5, ViT: nn.CrossEntropyLoss straight on the logits, in the compute dtype
        out.loss_forward.append(Term("logits", le * T * V, f"{le} B x T x V, V={V}", 1))
        out.loss_saved.append(Term("log-softmax saved by the loss", le * T * V, f"{le} B x T x V", 1))
        out.loss_backward.append(
            Term("loss backward: two T x V gradient buffers", 2 * le * T * V, f"2 x {le} B x T x V", 2)
        )
    if sc.loss != "chunked" and not loss_parallel(sc):
        # the gradient the head's matmuls read, in the logits' dtype (an upcast loss casts it back), freed once
        # the head's backward has made its weight gradient (traced: the `mm` of lm_head's weight gradient)
        out.logits_grad.append(Term("logits' gradient (head backward)", le * T * V, f"{le} B x T x V", 1))
    cap = arch.facts.output.final_logit_softcapping
    if cap and sc.loss != "chunked":
        # Gemma 2/3: logits = tanh(logits / cap) x cap; tanh saves its output (compute dtype) until its
        # backward, right after the loss's (traced); the scalar division and product save nothing
        out.loss_saved.append(
            Term(f"{SOFTCAP_SAVED} ({cap:g}): tanh output", le * T * V, f"{le} B x T x V", 1)
        )
    st.le, st.upcast_loss = le, upcast_loss


def compiled_apart_terms(st: HFLayer, T: int, V: int, le: int) -> None:
    """The loop's loss function compiled on its own (torchtitan: ``torch.compile(cross_entropy_loss)``, which
    upcasts the model's le-byte logits and runs ``F.cross_entropy``; ``frameworks.loss_compiled_apart``), as a
    fake-tensor trace of that function through Dynamo, AOTAutograd and the min-cut partitioner shows it
    (``trace/compiled.trace_compiled_loss``, tests/trace/test_trace_compiled_loss.py): the upcast, log-softmax and
    gather run fused, so the forward makes no T x V buffer; the graph saves its input, the logits (which the loop's
    ``del pred`` then no longer frees), with each row's max and log-sum-exp (fp32) and the labels' index (int64).
    Its backward makes nll_loss's fp32 gradient (zeros scattered at the labels) and, fused, the logits' gradient in
    their dtype (``logits_grad``). Inductor's joint-graph pass ``scatter_upon_const_tensor`` fuses the fp32
    buffer away on the GPU (docs/allocator.md, "Compiled steps"): the allocated counter keeps it, as the engine's
    compiled rules keep the default trace's; the allocation stream follows Inductor."""
    st.out.loss_saved += [
        Term(f"{COMPILED_APART}: the logits it saves", le * T * V, f"{le} B x T x V, V={V}", 1),
        Term(f"{COMPILED_APART}: row max, log-sum-exp (fp32) and the labels' index (int64)", 16 * T,
             "(4 + 4 + 8) B x T", 3),
    ]  # fmt: skip
    st.out.loss_backward.append(
        Term(f"{COMPILED_APART}: backward's fp32 T x V gradient (zeros scattered at the labels)", 4 * T * V,
             "4 B x T x V", 1)
    )  # fmt: skip


def autocast_ce_terms(st: HFLayer, T: int, V: int, le: int) -> None:
    """``nn.CrossEntropyLoss`` on 16-bit logits under CUDA autocast (BERT's and RoBERTa's masked-LM loss, T5's,
    ViT's): the logits while the loss runs, what it saves (``autocast_ce_saved``) and nll_loss's fp32 gradient at
    backward's start (``autocast_ce_backward``), over all T tokens at once. Measured on an H200: roberta-base-amp
    15.48 GiB allocated."""
    out = st.out
    out.loss_forward.append(Term("logits", le * T * V, f"{le} B x T x V, V={V}", 1))
    out.loss_saved += autocast_ce_saved(T, V, le)
    out.loss_backward.append(autocast_ce_backward(T, V))


def autocast_ce_saved(T: int, V: int, le: int, calls: int = 1, what: str = "") -> list[Term]:
    """What ``F.cross_entropy`` on le-byte logits saves under CUDA autocast, over T x V logits in ``calls`` equal
    calls (litgpt's chunked_cross_entropy: one per lm_head chunk, all saved until backward). CUDA's autocast has no
    ``cross_entropy_loss`` entry (CPU's casts the logits to fp32 first), so the composite runs
    ``log_softmax(x, dtype=x.dtype)``, which keeps the 16-bit dtype it is given, and ``nll_loss``, on the fp32
    list, casts the log-probabilities to fp32 (PyTorch autocast_mode.cpp / LossNLL.cpp; sources in
    trace/cuda_autocast.py, which traces it). Both are saved: the 16-bit log-softmax by LogSoftmaxBackward, the
    fp32 copy by NllLossBackward (``NLL_FP32_COPY``, listed last: the allocation stream pairs it with the term
    before it). Nothing else of the loss outlives its call."""
    each = f" ({calls} calls)" if calls > 1 else ""
    return [
        Term(
            f"{what}log-softmax saved by the loss (logits' dtype){each}", le * T * V, f"{le} B x T x V", calls
        ),
        Term(NLL_FP32_COPY + each, 4 * T * V, "4 B x T x V", calls),
    ]


def autocast_ce_backward(rows: int, V: int, rows_formula: str = "T", what: str = "") -> Term:
    """The start of that loss's backward for the ``rows`` logits one call covers (the call autograd runs first):
    nll_loss's fp32 gradient beside everything saved. The call's fp32 copy is freed once that gradient is made, the
    gradient once cast back to 16 bits, then log-softmax's 16-bit gradient is made and its saved output freed: each
    later step, and each later call, holds less (traced: trace/cuda_autocast.py; litgpt's chunks, tests/trace)."""
    return Term(f"{what}loss backward: nll_loss's fp32 {rows_formula} x V gradient", 4 * rows * V,
                f"4 B x {rows_formula} x V", 1)  # fmt: skip


def loss_parallel_terms(st: HFLayer, T: int, V: int) -> None:
    """Loss parallel's cross-entropy on the rank's V/tp columns (``V``): the local kernels DTensor's handlers run
    (torch 2.13.0 ``distributed/tensor/parallel/loss.py``; the same kernels in its 2024 ``torch.distributed._tensor``
    version).

    ``_log_softmax`` makes ``shifted = x - x_max`` and ``torch.exp(shifted)`` (freed once summed), then
    ``result = shifted - shifted_logsumexp`` (the saved log-softmax) while ``shifted`` is alive: one fp32
    T x V/tp beyond the logits, their upcast and the result. ``_nll_loss_and_log_softmax_backward`` makes
    ``grad_input = torch.zeros_like(x)`` and returns ``(grad_input + torch.exp(x)) * grad_output``: the exp
    and the sum, then the sum and the product, with ``grad_input`` and the saved log-softmax ``x``: three fp32
    T x V/tp beyond ``x`` (traced: ``trace/tp_plan.local_loss_kernels_seen``)."""
    st.out.loss_forward.append(
        Term(f"{LOSS_PARALLEL_SHIFTED}, freed as it returns", 4 * T * V, "4 B x T x V", 1)
    )
    st.out.loss_backward += [
        Term(f"{LOSS_PARALLEL_BACKWARD}: grad_input = zeros_like(log-softmax)", 4 * T * V, "4 B x T x V", 1),
        Term(
            f"{LOSS_PARALLEL_BACKWARD}: exp(log-softmax) and grad_input + exp, then the sum and its product "
            "with the loss's gradient (the returned gradient)",
            8 * T * V,
            "2 x 4 B x T x V",
            2,
        ),
    ]
