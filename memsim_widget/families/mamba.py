"""Mamba (``model_type: mamba``) as transformers 5.24's ``MambaForCausalLM`` (selective state-space layers).

Parameter tensors (``backbone.layers.*.`` per layer; I = int(expand x h), N = state_size, R = time_step_rank,
``"auto"`` = ceil(h / 16), K = conv_kernel):

- ``backbone.embeddings.weight`` [V, h]; ``lm_head.weight`` [V, h] unless ``tie_word_embeddings`` (default true)
- ``mixer.in_proj`` [2 I, h] (+ bias when ``use_bias``); ``mixer.conv1d.weight`` [I, 1, K] (depthwise) +
  ``conv1d.bias`` [I] when ``use_conv_bias``; ``mixer.x_proj`` [R + 2 N, I]; ``mixer.dt_proj`` [I, R] + bias [I];
  ``mixer.A_log`` [I, N]; ``mixer.D`` [I]; ``mixer.out_proj`` [h, I] (+ bias when ``use_bias``)
- ``norm.weight`` [h] per layer; ``backbone.norm_f.weight`` [h]

MambaConfig always sets ``intermediate_size = int(expand x hidden_size)`` (a config's own ``intermediate_size``
is overwritten), as read here. No attention and no MLP: each block is RMSNorm -> mixer -> residual, the residual
kept in fp32 when ``residual_in_fp32`` (default). What the mixer saves depends on the kernel (``ssm_kernel``,
engine/activations/ssm.py ``ssm_mixer``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_bool, read_int, read_positive, read_str
from memsim_widget.architecture.layers import embedding_param, final_norm_and_head, linear_params, norm_params
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.errors import ScenarioError

#: MambaConfig defaults (transformers 5.24.0, configuration_mamba.py).
MAMBA_DEFAULTS: dict[str, Any] = {
    "state_size": 16,
    "expand": 2,
    "conv_kernel": 4,
    "use_bias": False,
    "use_conv_bias": True,
    "hidden_act": "silu",
    "residual_in_fp32": True,
    "time_step_rank": "auto",
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": True,
}


def time_step_rank(cfg: Mapping[str, Any], h: int) -> int:
    """``time_step_rank``: an integer, or ``"auto"`` (the default) = ceil(h / 16), as MambaConfig reads it."""
    value = cfg.get("time_step_rank", "auto")
    if value is None or value == "auto":
        return math.ceil(h / 16)
    return read_int(cfg, "time_step_rank")


def check_act(cfg: Mapping[str, Any], default: str) -> str:
    """The mixer's activation (conv output and gate): only SiLU is modelled (the kernels hard-code it)."""
    act = read_str(cfg, "hidden_act", default)
    if act not in ("silu", "swish"):
        raise ScenarioError(
            "model.hidden_act", f"{act!r} is not modelled for state-space layers (only 'silu')"
        )
    return act


def mamba_mixer_groups(
    p: str, L: int, h: int, inner: int, N: int, R: int, K: int, *, bias: bool, conv_bias: bool
) -> list[ParamGroup]:
    """One Mamba (v1) mixer's parameters in ``L`` layers (``p`` ends with the mixer's name and a dot). Tensor
    parallelism splits the inner channels (in_proj rows, conv, x_proj columns, dt_proj rows, A_log, D)."""
    groups = linear_params(
        p + "in_proj", "ssm", 2 * inner, h, bias=bias, parallel="col", module="in_proj", count=L
    )
    groups.append(ParamGroup(name=p + "conv1d.weight", kind="ssm", shape=(inner, 1, K), count=L, tp_dim=0))
    if conv_bias:
        groups.append(ParamGroup(name=p + "conv1d.bias", kind="ssm", shape=(inner,), count=L, tp_dim=0))
    groups += linear_params(
        p + "x_proj", "ssm", R + 2 * N, inner, bias=False, parallel="row", module="x_proj", count=L
    )
    groups += linear_params(
        p + "dt_proj", "ssm", inner, R, bias=True, parallel="col", module="dt_proj", count=L
    )
    groups.append(ParamGroup(name=p + "A_log", kind="ssm", shape=(inner, N), count=L, tp_dim=0))
    groups.append(ParamGroup(name=p + "D", kind="ssm", shape=(inner,), count=L, tp_dim=0))
    groups += linear_params(
        p + "out_proj", "ssm", h, inner, bias=bias, parallel="row", module="out_proj", count=L
    )
    return groups


@register_family("mamba")
def build_mamba(cfg: Mapping[str, Any]) -> Architecture:
    """state-spaces/mamba-*-hf as ``MambaForCausalLM``; see the module docstring."""
    d_ = MAMBA_DEFAULTS
    h = read_int(cfg, "hidden_size", aliases=("d_model",))
    L = read_int(cfg, "num_hidden_layers", aliases=("n_layer",))
    vocab = read_int(cfg, "vocab_size")
    N = read_int(cfg, "state_size", d_["state_size"])
    expand = read_int(cfg, "expand", d_["expand"])
    K = read_int(cfg, "conv_kernel", d_["conv_kernel"])
    inner = expand * h
    R = time_step_rank(cfg, h)
    bias = read_bool(cfg, "use_bias", d_["use_bias"])
    conv_bias = read_bool(cfg, "use_conv_bias", d_["use_conv_bias"])
    tied = read_bool(cfg, "tie_word_embeddings", d_["tie_word_embeddings"])
    check_act(cfg, d_["hidden_act"])

    groups: list[ParamGroup] = [embedding_param("backbone.embeddings.weight", vocab, h)]
    groups += mamba_mixer_groups(
        "backbone.layers.*.mixer.", L, h, inner, N, R, K, bias=bias, conv_bias=conv_bias
    )
    groups += norm_params("backbone.layers.*.", ("norm",), h, L, bias=False, stack="decoder")
    groups += final_norm_and_head("backbone.", "norm_f", h, vocab, tied=tied, bias=False)
    ssm = {
        "version": 1,
        "layers": L,
        "inner": inner,
        "state_size": N,
        "time_step_rank": R,
        "conv_kernel": K,
        "heads": inner,  # v1: one scalar decay per channel
        "groups": 1,
    }
    return _ssm_architecture(
        cfg,
        d_,
        "mamba",
        "MambaForCausalLM",
        hidden=h,
        layers=L,
        inner=inner,
        vocab=vocab,
        tied=tied,
        groups=groups,
        ssm=ssm,
    )


def _ssm_architecture(
    cfg: Mapping[str, Any],
    d_: Mapping[str, Any],
    family: str,
    hf_class: str,
    *,
    hidden: int,
    layers: int,
    inner: int,
    vocab: int,
    tied: bool,
    groups: list[ParamGroup],
    ssm: dict[str, Any],
) -> Architecture:
    """The Architecture of an attention-free Mamba stack (both versions): one norm per block, no MLP, no positions;
    ``use_cache`` is off (MambaModel's training default)."""
    return Architecture(
        family=family,
        model_type=str(cfg.get("model_type", family)),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=1,
        num_kv_heads=1,
        head_dim=hidden,
        intermediate_size=inner,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation="swiglu",  # unused: no MLP
        norm="rmsnorm",
        position="none",
        decoder_layers=layers,
        causal=True,
        extra={
            "hf_class": hf_class,
            "ssm": ssm,
            "attention_layers": 0,
            "norms_per_layer": 1,
            "residual_in_fp32": read_bool(cfg, "residual_in_fp32", d_["residual_in_fp32"]),
            "rms_norm_eps": read_positive(cfg, "layer_norm_epsilon", d_["layer_norm_epsilon"]),
            "use_cache": False,
            # MambaForCausalLM and Mamba2ForCausalLM return ``lm_head(h).float()``: a loop that keeps the model
            # output keeps fp32 logits (transformers 5.24 modeling_mamba.py / modeling_mamba2.py; traced)
            "fp32_logits": True,
        },
    )


# ----------------------------------------------------------------------------- Mamba-2

#: Mamba2Config defaults (transformers 5.24.0, configuration_mamba2.py: Mamba-Codestral-7B's shape).
MAMBA2_DEFAULTS: dict[str, Any] = {
    "num_heads": 128,
    "head_dim": 64,
    "state_size": 128,
    "expand": 2,
    "conv_kernel": 4,
    "n_groups": 8,
    "use_bias": False,
    "use_conv_bias": True,
    "hidden_act": "silu",
    "residual_in_fp32": True,
    "layer_norm_epsilon": 1e-5,
    "chunk_size": 256,
    "tie_word_embeddings": False,
}


@register_family("mamba2")
def build_mamba2(cfg: Mapping[str, Any]) -> Architecture:
    """Mamba-2 as transformers 5.24's ``Mamba2ForCausalLM`` (state-space duality, Dao & Gu 2024).

    Per layer (``backbone.layers.*.``; I = int(expand x h), H heads of head_dim P with H x P = I, G groups, N state):
    ``mixer.in_proj`` [2 I + 2 G N + H, h] (z, x, B, C, dt in one projection; + bias when ``use_bias``);
    ``mixer.conv1d.weight`` [I + 2 G N, 1, K] (+ bias) over x, B and C; ``mixer.dt_bias``, ``A_log``, ``D`` [H];
    ``mixer.norm.weight`` [I] (the gated RMSNorm, per group of I / G channels); ``mixer.out_proj`` [h, I];
    ``norm.weight`` [h]. Plus ``backbone.embeddings`` [V, h], ``backbone.norm_f`` [h] and ``lm_head`` [V, h]
    unless ``tie_word_embeddings`` (default false). Mamba2Config refuses expand x h != num_heads x head_dim."""
    d_ = MAMBA2_DEFAULTS
    h = read_int(cfg, "hidden_size")
    L = read_int(cfg, "num_hidden_layers")
    vocab = read_int(cfg, "vocab_size")
    H = read_int(cfg, "num_heads", d_["num_heads"])
    P = read_int(cfg, "head_dim", d_["head_dim"])
    N = read_int(cfg, "state_size", d_["state_size"])
    G = read_int(cfg, "n_groups", d_["n_groups"])
    expand = read_int(cfg, "expand", d_["expand"])
    K = read_int(cfg, "conv_kernel", d_["conv_kernel"])
    chunk = read_int(cfg, "chunk_size", d_["chunk_size"])
    inner = expand * h
    if inner != H * P:
        raise ScenarioError(
            "model.num_heads",
            f"hidden_size x expand ({inner}) must equal num_heads x head_dim ({H} x {P} = {H * P})",
        )
    if H % G or inner % G:
        raise ScenarioError("model.n_groups", f"{G} does not divide num_heads {H}")
    bias = read_bool(cfg, "use_bias", d_["use_bias"])
    conv_bias = read_bool(cfg, "use_conv_bias", d_["use_conv_bias"])
    tied = read_bool(cfg, "tie_word_embeddings", d_["tie_word_embeddings"])
    check_act(cfg, d_["hidden_act"])
    conv_dim = inner + 2 * G * N

    p = "backbone.layers.*.mixer."
    groups: list[ParamGroup] = [embedding_param("backbone.embeddings.weight", vocab, h)]
    groups += linear_params(
        p + "in_proj",
        "ssm",
        2 * inner + 2 * G * N + H,
        h,
        bias=bias,
        parallel=None,
        module="in_proj",
        count=L,
    )
    groups.append(ParamGroup(name=p + "conv1d.weight", kind="ssm", shape=(conv_dim, 1, K), count=L))
    if conv_bias:
        groups.append(ParamGroup(name=p + "conv1d.bias", kind="ssm", shape=(conv_dim,), count=L))
    for name in ("dt_bias", "A_log", "D"):
        groups.append(ParamGroup(name=p + name, kind="ssm", shape=(H,), count=L))
    groups.append(ParamGroup(name=p + "norm.weight", kind="ssm", shape=(inner,), count=L))
    groups += linear_params(
        p + "out_proj", "ssm", h, inner, bias=bias, parallel=None, module="out_proj", count=L
    )
    groups += norm_params("backbone.layers.*.", ("norm",), h, L, bias=False, stack="decoder")
    groups += final_norm_and_head("backbone.", "norm_f", h, vocab, tied=tied, bias=False)
    ssm = {
        "version": 2,
        "layers": L,
        "inner": inner,
        "state_size": N,
        "heads": H,
        "head_dim": P,
        "groups": G,
        "conv_kernel": K,
        "chunk_size": chunk,
        "time_step_rank": 0,
    }
    return _ssm_architecture(
        cfg,
        d_,
        "mamba2",
        "Mamba2ForCausalLM",
        hidden=h,
        layers=L,
        inner=inner,
        vocab=vocab,
        tied=tied,
        groups=groups,
        ssm=ssm,
    )
