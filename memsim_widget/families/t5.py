"""T5 / Flan-T5 as ``T5ForConditionalGeneration`` (transformers 5.24 ``models/t5/modeling_t5.py``): an encoder and
a decoder stack over one shared embedding, relative position biases.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_bool, read_int, read_probability, read_str
from memsim_widget.architecture.layers import embedding_param, linear_params, norm_params
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.errors import choice_error

#: transformers 5.24 ``T5Config`` defaults (structural keys stay required).
T5_DEFAULTS: dict[str, Any] = {
    "d_kv": 64,
    "num_decoder_layers": None,  # None -> num_layers
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "dropout_rate": 0.1,
    "layer_norm_epsilon": 1e-6,
    "feed_forward_proj": "relu",
    "tie_word_embeddings": True,
}
_T5_ACTS = {
    "relu": "relu",
    "gelu": "gelu",
    "gated-gelu": "geglu",
    "gated-silu": "swiglu",
    "gated-relu": "relu",
}


def _attention_params(stack: str, n: int, h: int, inner: int, attns: list[str]) -> list[ParamGroup]:
    """The q/k/v/o projections of each attention in ``attns`` (self, and the decoder's cross-attention)."""
    p = f"{stack}.block.*.layer."
    groups: list[ParamGroup] = []
    for a in attns:
        for name in ("q", "k", "v"):
            groups += linear_params(
                p + f"{a}.{name}",
                "attention",
                inner,
                h,
                bias=False,
                parallel="col",
                module=name,
                count=n,
                stack=stack,
            )
        groups += linear_params(
            p + f"{a}.o",
            "attention",
            h,
            inner,
            bias=False,
            parallel="row",
            module="o",
            count=n,
            stack=stack,
        )
    return groups


def _ff_params(stack: str, n: int, h: int, ff: int, ff_idx: int, *, gated: bool) -> list[ParamGroup]:
    """The feed-forward ``DenseReluDense``: wi (or gated wi_0/wi_1) and wo, at sub-layer ``ff_idx``."""
    p = f"{stack}.block.*.layer."
    groups: list[ParamGroup] = []
    wis = ("wi_0", "wi_1") if gated else ("wi",)
    for name in wis:
        groups += linear_params(
            p + f"{ff_idx}.DenseReluDense.{name}", "mlp", ff, h,
            bias=False, parallel="col", module=name, count=n, stack=stack,
        )  # fmt: skip
    groups += linear_params(
        p + f"{ff_idx}.DenseReluDense.wo",
        "mlp",
        h,
        ff,
        bias=False,
        parallel="row",
        module="wo",
        count=n,
        stack=stack,
    )
    return groups


def _stack_params(
    stack: str, n: int, h: int, heads: int, inner: int, ff: int, buckets: int, *, gated: bool
) -> list[ParamGroup]:
    """One stack (encoder or decoder) of ``n`` blocks: block 0's relative position bias, the attentions, the
    feed-forward, a norm per sub-layer and the stack's final norm."""
    attns = ["0.SelfAttention"] + (["1.EncDecAttention"] if stack == "decoder" else [])
    ff_idx = len(attns)
    groups = [
        ParamGroup(
            name=f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            kind="position",
            shape=(buckets, heads),
            scope="pre",
            stack=stack,
        )
    ]
    groups += _attention_params(stack, n, h, inner, attns)
    groups += _ff_params(stack, n, h, ff, ff_idx, gated=gated)
    groups += norm_params(
        f"{stack}.block.*.layer.",
        tuple(f"{i}.layer_norm" for i in range(ff_idx + 1)),
        h,
        n,
        bias=False,
        stack=stack,
    )
    groups += norm_params(f"{stack}.", ("final_layer_norm",), h, 1, bias=False, scope="post", stack=stack)
    return groups


@register_family("t5")
def build_t5(cfg: Mapping[str, Any]) -> Architecture:
    """T5 / Flan-T5 as ``T5ForConditionalGeneration``: shared embedding, encoder + decoder stacks.

    Decoder blocks add cross-attention and a third norm; block 0 of each stack owns a relative
    position bias [buckets, heads] (scope "pre", 'position'). ``feed_forward_proj: gated-gelu`` (Flan)
    gives wi_0/wi_1/wo. The lm_head is always ``shared.weight``: transformers 5's T5Config reads
    ``tie_word_embeddings: false`` (T5 v1.1, Flan-T5) only as "do not scale the decoder output by
    d_model^-0.5" and forces the tie on, so the model trained holds no separate head (the published
    Flan-T5 checkpoints, made with transformers 4, store one: 32,899,072 more parameters for flan-t5-large).
    """
    d = T5_DEFAULTS
    h = read_int(cfg, "d_model", aliases=("hidden_size",))
    enc = read_int(cfg, "num_layers", aliases=("num_hidden_layers",))
    dec = read_int(cfg, "num_decoder_layers", enc)
    heads = read_int(cfg, "num_heads", aliases=("num_attention_heads",))
    ff = read_int(cfg, "d_ff")
    vocab = read_int(cfg, "vocab_size")
    d_kv = read_int(cfg, "d_kv", d["d_kv"])
    buckets = read_int(cfg, "relative_attention_num_buckets", d["relative_attention_num_buckets"])
    proj = read_str(cfg, "feed_forward_proj", d["feed_forward_proj"])
    if proj not in _T5_ACTS:
        raise choice_error("model.feed_forward_proj", proj, _T5_ACTS)
    gated = proj.startswith("gated-")
    # transformers 5.24 T5Config.__post_init__: scale_decoder_outputs = tie_word_embeddings is not False;
    # tie_word_embeddings = True (always)
    scale_out = read_bool(cfg, "tie_word_embeddings", d["tie_word_embeddings"])
    inner = heads * d_kv

    groups: list[ParamGroup] = [embedding_param("shared.weight", vocab, h, stack="encoder")]
    for stack, n in (("encoder", enc), ("decoder", dec)):
        groups += _stack_params(stack, n, h, heads, inner, ff, buckets, gated=gated)
    return Architecture(
        family="t5",
        model_type=str(cfg.get("model_type", "t5")),
        hidden_size=h,
        num_layers=enc + dec,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=d_kv,
        intermediate_size=ff,
        vocab_size=vocab,
        tied_embeddings=True,
        params=tuple(groups),
        mlp_activation=_T5_ACTS[proj],
        norm="rmsnorm",
        position="relative",
        attention_dropout=read_probability(cfg, "dropout_rate", d["dropout_rate"]),
        hidden_dropout=read_probability(cfg, "dropout_rate", d["dropout_rate"]),
        encoder_layers=enc,
        decoder_layers=dec,
        causal=True,
        extra={
            "hf_class": "T5ForConditionalGeneration",
            "coverage": ("encoder_decoder",),
            "norms_per_layer": 2,
            "decoder_norms_per_layer": 3,
            "feed_forward_proj": proj,
            "relative_attention_num_buckets": buckets,
            "relative_attention_max_distance": cfg.get(
                "relative_attention_max_distance", d["relative_attention_max_distance"]
            ),
            "encoder_causal": False,
            "scale_decoder_outputs": scale_out,
            "loss_upcast": False,
            # eager_attention_forward: softmax in the scores' dtype (no fp32 upcast in transformers 5.x)
            "softmax_in_compute_dtype": True,
        },
    )
