"""ViT as ``ViTForImageClassification`` (transformers 5.24 ``models/vit/modeling_vit.py``): patch embedding, CLS
token, learned positions, a fixed sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import (
    read_bool,
    read_head_dim,
    read_int,
    read_num_labels,
    read_probability,
    read_square,
    read_str,
)
from memsim_widget.architecture.layers import activation_label, linear_params, norm_params
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.errors import ScenarioError

#: transformers 5.24 ``ViTConfig`` defaults (structural keys stay required).
VIT_DEFAULTS: dict[str, Any] = {
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "layer_norm_eps": 1e-12,
    "image_size": 224,
    "patch_size": 16,
    "num_channels": 3,
    "qkv_bias": True,
    "num_labels": 2,  # PretrainedConfig default when neither num_labels nor id2label is given
}


def _embedding_params(h: int, channels: int, patch: int, n_patches: int) -> list[ParamGroup]:
    """The CLS token, the learned positions of the patches + CLS, and the patch projection (a conv)."""
    S = "encoder"
    return [
        ParamGroup(name="vit.embeddings.cls_token", kind="embedding", shape=(1, 1, h), scope="pre", stack=S),
        ParamGroup(
            name="vit.embeddings.position_embeddings",
            kind="position",
            shape=(1, n_patches + 1, h),
            scope="pre",
            stack=S,
        ),
        ParamGroup(
            name="vit.embeddings.patch_embeddings.projection.weight",
            kind="embedding",
            shape=(h, channels, patch, patch),
            scope="pre",
            stack=S,
        ),
        ParamGroup(
            name="vit.embeddings.patch_embeddings.projection.bias",
            kind="embedding",
            shape=(h,),
            scope="pre",
            stack=S,
        ),
    ]


def _layer_params(L: int, h: int, heads: int, hd: int, inter: int, qkv_bias: bool) -> list[ParamGroup]:
    """Every layer's q/k/v/o projections, its two LayerNorms and the fc1/fc2 MLP."""
    S, p = "encoder", "vit.layers.*."
    groups: list[ParamGroup] = []
    for name in ("q_proj", "k_proj", "v_proj"):
        groups += linear_params(
            p + f"attention.{name}", "attention", heads * hd, h,
            bias=qkv_bias, parallel="col", module=name, count=L, stack=S,
        )  # fmt: skip
    groups += linear_params(
        p + "attention.o_proj",
        "attention",
        h,
        heads * hd,
        bias=True,
        parallel="row",
        module="o_proj",
        count=L,
        stack=S,
    )
    groups += norm_params(p, ("layernorm_before", "layernorm_after"), h, L, bias=True, stack=S)
    groups += linear_params(
        p + "mlp.fc1", "mlp", inter, h, bias=True, parallel="col", module="fc1", count=L, stack=S
    )
    groups += linear_params(
        p + "mlp.fc2", "mlp", h, inter, bias=True, parallel="row", module="fc2", count=L, stack=S
    )
    return groups


def _head_params(h: int, labels: int) -> list[ParamGroup]:
    """The final LayerNorm and, for ``labels`` > 0, the [labels, h] classifier."""
    S = "encoder"
    groups = norm_params("vit.", ("layernorm",), h, 1, bias=True, scope="post", stack=S)
    if labels > 0:
        groups += linear_params(
            "classifier",
            "head",
            labels,
            h,
            bias=True,
            parallel=None,
            module="classifier",
            scope="post",
            stack=S,
        )
    return groups


@register_family("vit")
def build_vit(cfg: Mapping[str, Any]) -> Architecture:
    """ViT as ``ViTForImageClassification`` (no pooler) with a [num_labels, h] classifier.

    ``num_labels`` comes from ``num_labels`` or ``id2label`` (default 2, as HF); 0 means no classifier
    (nn.Identity), i.e. the bare encoder. The sequence is fixed: (image/patch)^2 patches + CLS.
    Linear names follow transformers 5 (q_proj, k_proj, v_proj, o_proj, fc1, fc2).
    """
    d = VIT_DEFAULTS
    h = read_int(cfg, "hidden_size")
    L = read_int(cfg, "num_hidden_layers")
    heads = read_int(cfg, "num_attention_heads")
    inter = read_int(cfg, "intermediate_size")
    image = read_square(cfg, "image_size", d["image_size"])
    patch = read_square(cfg, "patch_size", d["patch_size"])
    channels = read_int(cfg, "num_channels", d["num_channels"])
    labels = read_num_labels(cfg)
    qkv_bias = read_bool(cfg, "qkv_bias", d["qkv_bias"])
    hd = read_head_dim(cfg, h, heads)
    if image % patch:
        raise ScenarioError("model.patch_size", f"{patch} does not divide image_size {image}")
    n_patches = (image // patch) ** 2
    groups = _embedding_params(h, channels, patch, n_patches)
    groups += _layer_params(L, h, heads, hd, inter, qkv_bias)
    groups += _head_params(h, labels)
    act = read_str(cfg, "hidden_act", d["hidden_act"])
    return Architecture(
        family="vit",
        model_type=str(cfg.get("model_type", "vit")),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hd,
        intermediate_size=inter,
        vocab_size=0,
        tied_embeddings=False,
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
        fixed_seq_len=n_patches + 1,
        extra={
            "hf_class": "ViTForImageClassification",
            "coverage": ("pixel_input",),
            "norms_per_layer": 2,
            "image_size": image,
            "patch_size": patch,
            "num_channels": channels,
            "num_patches": n_patches,
            "num_labels": labels,
            "qkv_bias": qkv_bias,
            "softmax_in_compute_dtype": True,
            "loss_upcast": False,
        },
    )
