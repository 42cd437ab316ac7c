"""The HF rules assembled: one micro-batch's saved and transient tensors for HF transformers modules trained with
the usual loop, a layer built block by block (norms, attention, MLP, and what replaces them in Mamba and T5), then
the model-level terms, the loss, what the loop's output holds and the backward transients."""

from __future__ import annotations

from memsim_widget.engine.activations.attention import attention
from memsim_widget.engine.activations.backward import backward_transients
from memsim_widget.engine.activations.budget import ActivationBudget
from memsim_widget.engine.activations.checkpointing import checkpointing
from memsim_widget.engine.activations.embeddings import embeddings
from memsim_widget.engine.activations.head import head
from memsim_widget.engine.activations.layer import HFLayer
from memsim_widget.engine.activations.linears import autocast_weight_copies, lora_internals
from memsim_widget.engine.activations.loss import final_hidden_fp32, loss
from memsim_widget.engine.activations.mlp import mlp
from memsim_widget.engine.activations.norms import final_norms, layer_norms, qk_norms
from memsim_widget.engine.activations.output import loop_output, training_kv_cache
from memsim_widget.engine.activations.ssm import ssm_checkpointed_inputs, ssm_layer
from memsim_widget.engine.activations.t5 import t5_layer
from memsim_widget.engine.context import Context


def hf_activations(ctx: Context) -> ActivationBudget:
    """HF transformers modules trained with the usual loop (torchtune/torchtitan modules save alike).

    Rules (each checked against a fake-tensor trace, see docs/fidelity.md): a Linear saves its input only
    if its weight is trained or it carries a LoRA adapter (the adapter saves its own cast copy when the
    adapter dtype differs); under autocast every trained Linear saves its own 16-bit input copy and a
    16-bit copy of its weight; HF RMSNorm saves its fp32 input, rsqrt and (if its weight is trained) the
    normalised tensor; SDPA saves q, k, v (k, v at kv width), the output and an fp32 logsumexp.
    """
    st = HFLayer(ctx)
    # one layer, block by block (each rule appends to the layer's terms in the order the forward saves them)
    layer_norms(st)
    qk_norms(st)
    attention(st)
    mlp(st)
    if st.ssm:
        ssm_layer(st)
    _residual_dropout(st)
    if (
        st.arch.facts.coverage.encoder_decoder
    ):  # encoder-decoder blocks: their own rules replace the decoder-only ones above
        t5_layer(st)
    autocast_weight_copies(st)
    lora_internals(st)
    # what the model output holds in the forward, and the checkpointed layer
    training_kv_cache(st)
    final_hidden_fp32(st)
    checkpointing(st)
    ssm_checkpointed_inputs(st)  # fp32 block outputs kept (engine/activations/ssm.py)
    # model-level terms
    embeddings(st)
    final_norms(st)
    head(st)
    loss(st)
    loop_output(st)
    backward_transients(st)
    return st.out


def _residual_dropout(st: HFLayer) -> None:
    """Dropout on the residual stream keeps a 1-byte mask per element, one per sub-layer by default."""
    arch, Tout, h = st.arch, st.D.Tout, st.D.h
    if arch.hidden_dropout > 0:
        nm = arch.facts.dropout.residual_masks
        st.add("residual dropout masks", nm * Tout * h, f"{nm} x 1 B x T x h", nm)
