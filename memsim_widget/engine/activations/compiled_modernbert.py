"""``compile: true`` for ModernBERT (``ModernBertForMaskedLM``), traced in bf16 full training, SDPA, one GPU.

What Inductor's min-cut partitioner saves (trace/compiled.py; ``benchmarks/compiled_saved.py "modernbert bf16
sdpa b2 s512"``), with e the dtype's bytes, T tokens, h hidden, I the MLP width (Wi makes 2 I: input and gate):

- per layer the residual stream after attention and at the layer's output (2 e T h: the inputs of the next
  LayerNorms; layer 0's input is the embedding norm's output, which its Wqkv reads);
- each LayerNorm's output as Wqkv and Wi read it (2 e T h) and its 16-bit mean and rstd (2 x e T; layer 0's
  ``attn_norm`` is ``nn.Identity``: one norm's statistics there);
- q and k after RoPE, cast back to 16 bits (2 e T h: RoPE runs in fp32 and is recomputed), Wqkv's whole
  [q | k | v] output (3 e T h: SDPA saves v, a view of it, as eager does), SDPA's output (e T h; the kernel lays it
  out (b, s, heads, d), as CUDA's flash, cuDNN and memory-efficient kernels do, so Wo reads its transpose without a
  copy) and its fp32 logsumexp (4 T a);
- Wi's output and the GeGLU's product that Wo reads (3 e T I), the GeLU recomputed.

Eager saves one converted sliding-window mask per local layer; the compiled graph builds the additive mask once and
the local layers share it (e b s^2, saved once, where the half window is shorter than the sequence).
Before the layers the token embedding (the embedding norm's input) and that norm's statistics; after them the
final norm's statistics and output (head.dense's input), head.dense's output (its GeLU recomputed), the head
norm's statistics and output (the decoder's input). The loss (HF's ``ForMaskedLMLoss`` upcasts the logits to
fp32) keeps the e-byte logits and an fp32 row max and log-sum-exp (8 T); the top of backward holds one fp32
T x V gradient buffer and the zero gradient AOTAutograd makes for the logits. The layers' backward transients
stay eager's. Other precisions, LoRA and checkpointing keep the untraced formula (compiled.compiled_formula).
"""

from __future__ import annotations

from memsim_widget.architecture import Architecture
from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.dims import Dims
from memsim_widget.engine.activations.tangents import LOGITS_TANGENT, LOSS_GRADIENT
from memsim_widget.engine.context import Context
from memsim_widget.scenario import Scenario


def modernbert_rule_applies(sc: Scenario, arch: Architecture) -> bool:
    """A compiled ModernBERT step as traced: bf16 full training, SDPA, no checkpointing, the standard loss in HF's
    loop, one GPU's layout (tp = cp = ep = 1); ModernBERT has no dropout (families/modernbert.py refuses it)."""
    p = sc.parallel
    return bool(
        sc.compile
        and arch.family == "modernbert"
        and sc.precision == "bf16"
        and sc.method == "full"
        and sc.activation_checkpointing == "none"
        and sc.attention == "sdpa"
        and sc.loss == "standard"
        and sc.framework == "hf"
        and sc.objective_name == "sft"
        and p.tp == p.cp == p.ep == 1
    )


def modernbert_activations(ctx: Context, out: ActivationBudget) -> None:
    """Replace the eager terms of ``out`` by the compiled ModernBERT step's (module docstring)."""
    D = Dims(ctx)
    T, h, I, a, V, b, s = D.T, D.h, D.I, D.a, D.V, D.b, D.s
    e = ctx.recipe.act_bytes
    out.per_layer[:] = [
        Term("compiled: residual stream after attention and at the layer's output", 2 * e * T * h,
             f"2 x {e} B x T x h (h={h})", 2),
        Term("compiled: LayerNorm outputs as Wqkv and Wi read them", 2 * e * T * h, f"2 x {e} B x T x h", 2),
        Term("compiled: q and k after RoPE, Wqkv's whole output (kept by v's view), SDPA's output", 6 * e * T * h,
             f"6 x {e} B x T x h", 4),
        Term("compiled: SDPA logsumexp (fp32)", 4 * T * a, f"4 B x T x heads, heads={a}", 1),
        Term("compiled: Wi's output (input and gate) and the GeGLU product", 3 * e * T * I,
             f"3 x {e} B x T x I, I={I}", 2),
        Term("compiled: LayerNorm statistics (layer 0's attn_norm is an identity)", 2 * 2 * e * T,
             f"2 x 2 x {e} B x T", 4, skip_first=True, first_bytes=2 * e * T),
    ]  # fmt: skip
    out.checkpointed_layer[:] = []
    out.recomputed_layer[:] = []
    out.cache_per_layer[:] = []
    af = ctx.arch.facts.attention
    masked = af.sliding_layers and D.s_full >= (af.sliding_window or 0)
    out.pre[:] = [
        Term("compiled: token embedding (the embedding norm's input) and the norm's statistics",
             e * T * h + 2 * e * T, f"{e} B x T x h + 2 x {e} B x T", 3),
        *([Term("compiled: sliding-window attention mask (additive, shared by the local layers)",
                e * b * s * D.s_full, f"{e} B x b x s x s", 1)] if masked else []),
    ]  # fmt: skip
    out.post[:] = [
        Term("compiled: final norm output and statistics, head.dense's output, head norm output and statistics",
             3 * e * T * h + 4 * e * T, f"3 x {e} B x T x h + 4 x {e} B x T", 7),
    ]  # fmt: skip
    out.top_backward[:] = []
    out.loss_forward[:] = []
    out.loss_saved[:] = [
        Term("compiled loss: logits", e * T * V, f"{e} B x T x V, V={V}", 1),
        Term("compiled loss: row max, log-sum-exp (fp32)", 8 * T, "8 B x T", 2),
    ]
    out.loss_backward[:] = [
        Term(f"compiled loss backward: one fp32 {LOSS_GRADIENT}", 4 * T * V, "4 B x T x V", 1),
        Term(f"zero gradients AOTAutograd makes for the {LOGITS_TANGENT}", e * T * V, f"{e} B x T x V", 1),
    ]
