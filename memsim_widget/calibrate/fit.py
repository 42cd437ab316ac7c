"""Per-layer saved bytes fitted from tiny fake-tensor traces of a shrunk copy of the model.

Each trace runs one real HF training step (``trace.hf.trace_hf``) of the model cut to 2 or 3 blocks, at a small
micro-batch b and sequence s, and reads four non-state amounts (everything live that is not a parameter, buffer,
gradient or optimizer state): ``saved`` at the start of backward, ``forward`` the forward's peak, ``backward``
the loss's backward peak (before the first parameter gradient), ``blocks`` / ``attention`` the peaks while the blocks run backward
(at the attention's ops and at the others) and ``bottom`` the peak during the embedding's backward (its weight-sized buffers meet every gradient there). A block's saved bytes are ``saved(3 blocks) - saved(2 blocks)``; the rest (embeddings, final
norm, the loss's saved tensors, inputs, the first block's difference) is ``saved(2 blocks)`` less two blocks. Each amount is fitted by least
squares on the basis ``1, s, b*s, b*s^2, s^2`` (activations are linear in b; eager attention adds an exact b*s^2
term; RoPE tables and masks shared by the batch grow with s or s^2 alone), and checked on a held-out (b, s).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: (b, s) points the coefficients are fitted on, and the held-out point the fit is checked on.
FIT_POINTS = ((1, 128), (2, 128), (1, 256), (2, 384), (3, 256), (1, 448))
#: Beyond the fit points' tokens: a peak that moves to another instant as T grows shows up as a residual.
HELD_OUT = (4, 512)
#: Block counts of the shrunk copies fitted (a block's bytes are their difference; the first block, which differs
#: under LoRA, is in both) and of the held-out copy (so the per-block extrapolation is checked too).
FIT_BLOCKS = (2, 3)
HELD_OUT_BLOCKS = 4
#: Basis of every fitted amount, as (label, f(b, s)).
BASIS = (
    ("", lambda b, s: 1),
    ("s", lambda b, s: s),
    ("b*s", lambda b, s: b * s),
    ("b*s^2", lambda b, s: b * s * s),
    ("s^2", lambda b, s: s * s),
)
#: Largest relative residual of the held-out point accepted (else the model type is refused).
MAX_RESIDUAL = 0.02

#: Ops of the attention's backward (SDPA kernels' backward, eager's softmax backward and batched matmuls).
_ATTENTION_OPS = re.compile(r"attention|softmax|bmm")
_STATE_ROLES = ("parameter", "buffer", "gradient", "optimizer_state", "unsharded_parameter")


def nonstate_profile(config: Mapping[str, Any], b: int, s: int, **trace_kw: Any) -> dict[str, float]:
    """Trace one step; the non-state bytes live at the start of backward and at the forward's and backward's peaks."""
    from memsim_widget.trace.hf import trace_hf

    res = trace_hf(dict(config), micro_batch_size=b, seq_len=s, steps=1, progress=False, timeline_points=10,
                   top_n=0, **trace_kw)  # fmt: skip
    tr = res.tracker
    marks = {m["phase"]: m["seq"] for m in tr.marks if m["step"] == 1}
    events: list[tuple[int, int]] = []
    alloc_op: dict[int, str] = {}
    for r in tr.records:
        if r.step != 1 or not r.nbytes or tr.final_role(r) in _STATE_ROLES:
            continue
        events.append((r.alloc_seq, r.nbytes))
        alloc_op[r.alloc_seq] = r.op
        if r.free_seq is not None:
            events.append((r.free_seq, -r.nbytes))
    events.sort()
    bwd, opt = marks["backward"], marks.get("optimizer_step", 1 << 62)
    # the bottom of backward: the embedding's backward (its weight-sized gradient buffers) starts it
    bottom = min(
        (r.alloc_seq for r in tr.records if r.step == 1 and r.phase == "backward" and "embedding" in r.op),
        default=opt,
    )
    # the loss's backward ends where the first parameter gradient is made (the head's, or the last block's)
    first_grad = min(
        (
            r.alloc_seq
            for r in tr.records
            if r.step == 1 and bwd <= r.alloc_seq < bottom and tr.final_role(r) == "gradient"
        ),
        default=bottom,
    )
    live = fwd_peak = bwd_peak = blocks_peak = attn_peak = bottom_peak = saved = 0
    i = 0
    while i < len(events):
        seq = events[i][0]
        while i < len(events) and events[i][0] == seq:
            live += events[i][1]
            i += 1
        if seq < bwd:
            fwd_peak = max(fwd_peak, live)
            saved = live
        elif seq < first_grad:
            bwd_peak = max(bwd_peak, live)
        elif seq < bottom:
            # two instants of a block's backward, each its own smooth function of (b, s): the attention's
            # (eager: s x s gradients) and the rest (the MLP's T x I gradients); their maximum is not smooth
            if seq not in alloc_op:
                pass  # frees only: never a peak
            elif _ATTENTION_OPS.search(alloc_op[seq]):
                attn_peak = max(attn_peak, live)
            else:
                blocks_peak = max(blocks_peak, live)
        elif seq < opt:
            bottom_peak = max(bottom_peak, live)
    return {
        "saved": saved,
        "forward": fwd_peak,
        "backward": bwd_peak,
        "blocks": blocks_peak,
        "attention": attn_peak,
        "bottom": bottom_peak,
        "seconds": res.seconds,
    }


def lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least-squares coefficients (normal equations, Gaussian elimination; a handful of unknowns)."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    y = [sum(r[i] * v for r, v in zip(rows, ys, strict=True)) for i in range(n)]
    for c in range(n):
        piv = max(range(c, n), key=lambda k: abs(a[k][c]))
        a[c], a[piv], y[c], y[piv] = a[piv], a[c], y[piv], y[c]
        if abs(a[c][c]) < 1e-12:
            continue
        for k in range(n):
            if k != c and a[k][c]:
                f = a[k][c] / a[c][c]
                a[k] = [x - f * z for x, z in zip(a[k], a[c], strict=True)]
                y[k] -= f * y[c]
    return [y[i] / a[i][i] if abs(a[i][i]) >= 1e-12 else 0.0 for i in range(n)]


def evaluate(coef: list[float] | tuple[float, ...], b: int, s: int) -> float:
    """A fitted amount at (b, s)."""
    return sum(c * f(b, s) for c, (_, f) in zip(coef, BASIS, strict=True))
