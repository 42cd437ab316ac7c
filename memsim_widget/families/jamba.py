"""Jamba (``model_type: jamba``) as transformers 5.24's ``JambaForCausalLM``: Mamba (v1) and attention layers
interleaved, MoE and dense MLPs interleaved (Lieber et al. 2024, arXiv 2403.19887).

Layer i is an attention layer when ``i % attn_layer_period == attn_layer_offset`` (else a Mamba layer) and runs
``num_experts`` routed experts when ``i % expert_layer_period == expert_layer_offset`` and ``num_experts > 1``
(else a dense SwiGLU MLP of ``intermediate_size``), as JambaConfig's ``layers_block_type`` /
``layers_num_experts`` compute them. Parameter tensors (``model.layers.*.``; I = mamba_expand x h,
N = mamba_d_state, R = mamba_dt_rank, ``"auto"`` = ceil(h / 16), K = mamba_d_conv):

- ``model.embed_tokens.weight`` [V, h]; ``lm_head.weight`` [V, h] unless ``tie_word_embeddings`` (default
  false); ``model.final_layernorm.weight`` [h]; ``input_layernorm`` and ``pre_ff_layernorm`` [h] per layer
- attention layers: ``self_attn.{q,k,v,o}_proj`` without biases, no positions (Jamba has no RoPE)
- Mamba layers: MambaMixer's tensors under ``mamba.`` (families/mamba.py ``mamba_mixer_groups``: in_proj and
  out_proj + bias when ``mamba_proj_bias``, conv1d + bias when ``mamba_conv_bias``) plus three weight-only
  RMSNorms on x_proj's outputs: ``dt_layernorm`` [R], ``b_layernorm`` and ``c_layernorm`` [N]
- MoE layers: ``feed_forward.router.weight`` [E, h], ``feed_forward.experts.gate_up_proj`` [E, 2 I_mlp, h] and
  ``down_proj`` [E, h, I_mlp]; dense layers: ``feed_forward.{gate,up,down}_proj``

What the layers save is engine/activations/hybrid.py's (the attention layers and MLPs by the HF rules, the Mamba mixer with
its three norms by the state-space terms, ``ssm_kernel`` choosing the scan).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import (
    read_bool,
    read_int,
    read_kv_heads,
    read_positive,
    read_probability,
)
from memsim_widget.architecture.layers import (
    activation_label,
    attention_params,
    embedding_param,
    final_norm_and_head,
    norm_params,
)
from memsim_widget.architecture.moe import check_top_k, dense_mlp, mlp_parts, routed_experts, router
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.errors import ScenarioError
from memsim_widget.families.mamba import check_act, mamba_mixer_groups

#: JambaConfig defaults (transformers 5.24.0, configuration_jamba.py: Jamba-v0.1's shape).
JAMBA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 65536,
    "tie_word_embeddings": False,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "use_cache": True,
    "max_position_embeddings": 262144,
    "attention_dropout": 0.0,
    "num_experts_per_tok": 2,
    "num_experts": 16,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": "auto",
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "router_aux_loss_coef": 0.001,
}


def read_period(cfg: Mapping[str, Any], what: str) -> tuple[int, int]:
    """``<what>_layer_period`` and ``<what>_layer_offset``; JambaConfig refuses an offset >= the period."""
    d_ = JAMBA_DEFAULTS
    period = read_int(cfg, f"{what}_layer_period", d_[f"{what}_layer_period"])
    offset = read_int(cfg, f"{what}_layer_offset", d_[f"{what}_layer_offset"], minimum=0)
    if offset >= period:
        raise ScenarioError(
            f"model.{what}_layer_offset", f"{offset} must be smaller than {what}_layer_period {period}"
        )
    return period, offset


def layer_plan(cfg: Mapping[str, Any], L: int, E: int) -> tuple[list[bool], list[bool]]:
    """Per layer: is it an attention layer (else Mamba), does it run routed experts (else a dense MLP)."""
    a_period, a_offset = read_period(cfg, "attn")
    e_period, e_offset = read_period(cfg, "expert")
    attn = [i % a_period == a_offset for i in range(L)]
    moe = [E > 1 and i % e_period == e_offset for i in range(L)]
    return attn, moe


def block_period(cfg: Mapping[str, Any]) -> int:
    """Layers after which the attention/Mamba and MoE/dense pattern repeats (the periods' least common multiple)."""
    return math.lcm(read_period(cfg, "attn")[0], read_period(cfg, "expert")[0])


def _dt_rank(cfg: Mapping[str, Any], h: int) -> int:
    """``mamba_dt_rank``: an integer or ``"auto"`` = ceil(h / 16), as JambaConfig reads it."""
    value = cfg.get("mamba_dt_rank", "auto")
    if value is None or value == "auto":
        return -(-h // 16)
    return read_int(cfg, "mamba_dt_rank")


@register_family("jamba")
def build_jamba(cfg: Mapping[str, Any]) -> Architecture:
    """AI21 Jamba / Jamba 1.5 as ``JambaForCausalLM``; see the module docstring."""
    d_ = JAMBA_DEFAULTS
    h = read_int(cfg, "hidden_size", d_["hidden_size"])
    L = read_int(cfg, "num_hidden_layers", d_["num_hidden_layers"])
    heads = read_int(cfg, "num_attention_heads", d_["num_attention_heads"])
    vocab = read_int(cfg, "vocab_size", d_["vocab_size"])
    kv = read_kv_heads(cfg, heads, d_["num_key_value_heads"])
    if h % heads:
        raise ScenarioError("model.num_attention_heads", f"{heads} does not divide hidden_size {h}")
    d = h // heads
    inter = read_int(cfg, "intermediate_size", d_["intermediate_size"])
    E = read_int(cfg, "num_experts", d_["num_experts"], aliases=("num_local_experts",))
    top_k = read_int(cfg, "num_experts_per_tok", d_["num_experts_per_tok"])
    attn, moe = layer_plan(cfg, L, E)
    n_attn, n_moe = sum(attn), sum(moe)
    n_mamba, n_dense = L - n_attn, L - n_moe
    if n_moe:
        check_top_k(top_k, E)
    N = read_int(cfg, "mamba_d_state", d_["mamba_d_state"])
    K = read_int(cfg, "mamba_d_conv", d_["mamba_d_conv"])
    inner = read_int(cfg, "mamba_expand", d_["mamba_expand"]) * h
    R = _dt_rank(cfg, h)
    proj_bias = read_bool(cfg, "mamba_proj_bias", d_["mamba_proj_bias"])
    conv_bias = read_bool(cfg, "mamba_conv_bias", d_["mamba_conv_bias"])
    tied = read_bool(cfg, "tie_word_embeddings", d_["tie_word_embeddings"])
    act = check_act(cfg, d_["hidden_act"])  # one hidden_act for the mixer and the MLPs: SiLU only

    p = "model.layers.*."
    groups: list[ParamGroup] = [embedding_param("model.embed_tokens.weight", vocab, h)]
    groups += attention_params(p, n_attn, h, heads, kv, d, bias=False) if n_attn else []
    if n_mamba:
        groups += mamba_mixer_groups(
            p + "mamba.", n_mamba, h, inner, N, R, K, bias=proj_bias, conv_bias=conv_bias
        )
        for name, width in (("dt_layernorm", R), ("b_layernorm", N), ("c_layernorm", N)):
            groups.append(
                ParamGroup(name=f"{p}mamba.{name}.weight", kind="ssm", shape=(width,), count=n_mamba)
            )
    groups += router(p + "feed_forward.router", n_moe, E, h)
    groups += routed_experts(p + "feed_forward.experts.", n_moe, E, inter, h)
    groups += dense_mlp(p + "feed_forward.", n_dense, inter, h)
    groups += norm_params(p, ("input_layernorm", "pre_ff_layernorm"), h, L, bias=False, stack="decoder")
    groups += final_norm_and_head("model.", "final_layernorm", h, vocab, tied=tied, bias=False)

    ssm = {
        "version": 1,
        "layers": n_mamba,
        "inner": inner,
        "state_size": N,
        "time_step_rank": R,
        "conv_kernel": K,
        "heads": inner,
        "groups": 1,
        "bcdt_norms": True,  # Jamba: RMSNorms on dt, B and C between x_proj and the scan
    }
    return Architecture(
        family="jamba",
        model_type=str(cfg.get("model_type", "jamba")),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=d,
        intermediate_size=inter,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=activation_label("hidden_act", act, gated=True),
        norm="rmsnorm",
        position="none",
        num_experts=E if n_moe else 0,
        experts_per_token=top_k if n_moe else 0,
        attention_dropout=read_probability(cfg, "attention_dropout", d_["attention_dropout"]),
        decoder_layers=L,
        causal=True,
        extra={
            "hf_class": "JambaForCausalLM",
            # engine/activations/hybrid.py: attention and Mamba layers averaged over the stack
            "hybrid": "jamba",
            "ssm": ssm,
            "attention_layers": n_attn,
            "block_period": block_period(cfg),
            "layer_block_types": tuple("attention" if a else "mamba" for a in attn),
            "moe_layer_indices": [i for i, m in enumerate(moe) if m],
            "max_position_embeddings": read_int(
                cfg, "max_position_embeddings", d_["max_position_embeddings"]
            ),
            "rms_norm_eps": read_positive(cfg, "rms_norm_eps", d_["rms_norm_eps"]),
            "norms_per_layer": 2,
            "mlp_parts": mlp_parts(n_dense, inter, n_moe, top_k, inter, E),
            "moe_layers": n_moe,
            "dense_intermediate_size": inter,
            "moe_intermediate_size": inter,
            "use_cache": read_bool(cfg, "use_cache", d_["use_cache"]),
            "router_aux_loss_coef": cfg.get("router_aux_loss_coef", d_["router_aux_loss_coef"]),
        },
    )
