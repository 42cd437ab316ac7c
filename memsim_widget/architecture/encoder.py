"""The shared builder of post-norm BERT-shaped encoders with a masked-LM head (bert, roberta and its aliases)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import (
    REQUIRED_KEYS,
    read_bool,
    read_int,
    read_probability,
    read_str,
)
from memsim_widget.architecture.layers import activation_label, embedding_param, linear_params, norm_params
from memsim_widget.architecture.types import Architecture, ParamGroup
from memsim_widget.errors import ScenarioError
from memsim_widget.fast_dataclass import dataclass

#: How a BERT-style encoder's forward differs from a pre-norm decoder's (engine/activations/ reads these): the
#: Linear reading the attention block's norm, post-norm blocks, the embeddings' LayerNorm, the MLM head's dense ->
#: gelu -> LayerNorm, a softmax in the compute dtype under eager attention, and a cross-entropy on the logits as they
#: are (no fp32 upcast outside autocast).
MLM_ENCODER_RULES: dict[str, Any] = {
    "mlp_input_modules": ("dense",),  # intermediate.dense reads the attention block's LayerNorm output
    "first_norm_after_attention": True,  # post-norm: a layer's first LayerNorm reads attention output + input
    "embedding_norm": True,
    "mlm_head": True,
    "softmax_in_compute_dtype": True,
    "loss_upcast": False,
}


@dataclass(frozen=True)
class MaskedLMNames:
    """Where a BERT-shaped ``*ForMaskedLM`` keeps its tensors: the encoder prefix and the MLM head's names."""

    encoder: str  # "bert." / "roberta."
    head_dense: str  # the head's transform Linear
    head_norm: str  # its LayerNorm, as "<prefix>.<name>"
    decoder: str  # the vocab projection (tied to the word embeddings by default)
    head_bias: str  # the [vocab] output bias


def _embedding_params(e: str, vocab: int, h: int, n_pos: int, n_types: int) -> list[ParamGroup]:
    """Word, position and token-type embeddings and their LayerNorm (``e``: the encoder prefix)."""
    S = "encoder"
    groups: list[ParamGroup] = [
        embedding_param(f"{e}embeddings.word_embeddings.weight", vocab, h, stack=S),
        ParamGroup(
            name=f"{e}embeddings.position_embeddings.weight",
            kind="position",
            shape=(n_pos, h),
            scope="pre",
            stack=S,
        ),
        ParamGroup(
            name=f"{e}embeddings.token_type_embeddings.weight",
            kind="embedding",
            shape=(n_types, h),
            scope="pre",
            stack=S,
        ),
    ]
    groups += norm_params(f"{e}embeddings.", ("LayerNorm",), h, 1, bias=True, scope="pre", stack=S)
    return groups


def _layer_params(e: str, h: int, inter: int, L: int) -> list[ParamGroup]:
    """Every layer's biased query/key/value/dense and intermediate/output Linears with their two LayerNorms."""
    S, p = "encoder", f"{e}encoder.layer.*."
    groups: list[ParamGroup] = []
    for name in ("query", "key", "value"):
        groups += linear_params(
            p + f"attention.self.{name}",
            "attention",
            h,
            h,
            bias=True,
            parallel="col",
            module=name,
            count=L,
            stack=S,
        )
    groups += linear_params(
        p + "attention.output.dense",
        "attention",
        h,
        h,
        bias=True,
        parallel="row",
        module="dense",
        count=L,
        stack=S,
    )
    groups += norm_params(p + "attention.output.", ("LayerNorm",), h, L, bias=True, stack=S)
    groups += linear_params(
        p + "intermediate.dense", "mlp", inter, h, bias=True, parallel="col", module="dense", count=L, stack=S
    )
    groups += linear_params(
        p + "output.dense", "mlp", h, inter, bias=True, parallel="row", module="dense", count=L, stack=S
    )
    groups += norm_params(p + "output.", ("LayerNorm",), h, L, bias=True, stack=S)
    return groups


def _mlm_head_params(names: MaskedLMNames, h: int, vocab: int, tied: bool) -> list[ParamGroup]:
    """The MLM head: dense + LayerNorm, an untied decoder (weight and bias) unless ``tied``, the [vocab] bias."""
    S = "encoder"
    groups = linear_params(
        names.head_dense, "head", h, h, bias=True, parallel=None, module="dense", scope="post", stack=S
    )
    norm_prefix, norm_name = names.head_norm.rsplit(".", 1)
    groups += norm_params(f"{norm_prefix}.", (norm_name,), h, 1, bias=True, scope="post", stack=S)
    if not tied:  # transformers 5 then ties neither: the decoder keeps its own weight and bias
        groups.append(
            ParamGroup(
                name=f"{names.decoder}.weight",
                kind="head",
                shape=(vocab, h),
                scope="post",
                tp_dim=0,
                module="decoder",
                stack=S,
            )
        )
        groups.append(
            ParamGroup(
                name=f"{names.decoder}.bias", kind="head", shape=(vocab,), scope="post", tp_dim=0, stack=S
            )
        )
    groups.append(
        ParamGroup(name=names.head_bias, kind="head", shape=(vocab,), scope="post", tp_dim=0, stack=S)
    )
    return groups


def bert_encoder(
    cfg: Mapping[str, Any],
    *,
    family: str,
    hf_class: str,
    names: MaskedLMNames,
    defaults: Mapping[str, Any],
    position_offset: int = 0,
    extra: Mapping[str, Any] | None = None,
) -> Architecture:
    """A post-norm BERT encoder with its masked-LM head (BERT, RoBERTa): word, position and token-type
    embeddings + LayerNorm; per layer biased query/key/value/dense and intermediate/output Linears with two
    LayerNorms; the head's dense + LayerNorm, its decoder tied to the word embeddings unless
    ``tie_word_embeddings`` is false, and a [vocab] bias. ``position_offset`` rows of the position table
    are never indexed (RoBERTa: positions start after ``pad_token_id``)."""
    d = defaults
    h, L, heads, inter, vocab = (read_int(cfg, k) for k in REQUIRED_KEYS)
    if h % heads:
        raise ScenarioError("model.num_attention_heads", f"hidden_size {h} is not divisible by {heads} heads")
    if read_bool(cfg, "add_cross_attention", d["add_cross_attention"]):
        raise ScenarioError("model.add_cross_attention", f"{hf_class} with cross-attention is not supported")
    n_pos = read_int(cfg, "max_position_embeddings", d["max_position_embeddings"])
    if n_pos <= position_offset:
        raise ScenarioError(
            "model.max_position_embeddings",
            f"{n_pos} leaves no position after the {position_offset} offset rows (pad_token_id + 1)",
        )
    n_types = read_int(cfg, "type_vocab_size", d["type_vocab_size"])
    tied = read_bool(cfg, "tie_word_embeddings", d["tie_word_embeddings"])
    groups = _embedding_params(names.encoder, vocab, h, n_pos, n_types)
    groups += _layer_params(names.encoder, h, inter, L)
    groups += _mlm_head_params(names, h, vocab, tied)
    act = read_str(cfg, "hidden_act", d["hidden_act"])
    return Architecture(
        family=family,
        model_type=str(cfg.get("model_type", family)),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=h // heads,
        intermediate_size=inter,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=activation_label("hidden_act", act, gated=False),
        norm="layernorm",
        position="learned",
        attention_dropout=read_probability(
            cfg, "attention_probs_dropout_prob", d["attention_probs_dropout_prob"]
        ),
        hidden_dropout=read_probability(cfg, "hidden_dropout_prob", d["hidden_dropout_prob"]),
        encoder_layers=L,
        causal=False,
        max_seq_len=n_pos - position_offset,
        extra={
            "hf_class": hf_class,
            "norms_per_layer": 2,
            "max_position_embeddings": n_pos,
            "type_vocab_size": n_types,
            "objective": "masked_lm",
            **MLM_ENCODER_RULES,
            **(extra or {}),
        },
    )
