"""DeepSeek-V2 and V3 (``deepseek_v2``, ``deepseek_v3``) as transformers 5.24's ``DeepseekV2ForCausalLM`` /
``DeepseekV3ForCausalLM``: multi-head latent attention (MLA), routed + shared experts, dense first layers.

Parameter tensors (``model.layers.*.``):

- ``model.embed_tokens.weight`` [V, h]; ``lm_head.weight`` [V, h] unless tied; ``model.norm.weight`` [h]
- MLA: with ``q_lora_rank`` r_q: ``self_attn.q_a_proj`` [r_q, h] (+ bias if ``attention_bias``),
  ``q_a_layernorm`` [r_q], ``q_b_proj`` [a (d_nope + d_rope), r_q]; without it ``q_proj`` [a (d_nope + d_rope), h];
  ``kv_a_proj_with_mqa`` [r_kv + d_rope, h] (+ bias), ``kv_a_layernorm`` [r_kv],
  ``kv_b_proj`` [a (d_nope + d_v), r_kv], ``o_proj`` [h, a d_v] (+ bias)
- the first ``first_k_dense_replace`` layers: ``mlp.gate_proj`` / ``up_proj`` [I, h], ``down_proj`` [h, I]
  (V2: + biases when ``mlp_bias``)
- the other layers: ``mlp.gate.weight`` [E, h] (fp32: ``_keep_in_fp32_modules_strict``; V3 also holds the
  ``e_score_correction_bias`` buffer), ``mlp.experts.gate_up_proj`` [E, 2 I_moe, h],
  ``mlp.experts.down_proj`` [E, h, I_moe], ``mlp.shared_experts.{gate,up,down}_proj`` of width
  I_moe x ``n_shared_experts``
- ``input_layernorm`` / ``post_attention_layernorm`` [h]

The multi-token-prediction layer of DeepSeek-V3 (``num_nextn_predict_layers`` / ``num_mtp_layers``) is not
built by ``DeepseekV3ForCausalLM`` (its checkpoint weights, ``model.layers.61.*``, are ignored on load), so it
is not counted. V3 routes with a sigmoid and the n_group / topk_group group limit, V2 with a softmax
(``topk_method`` greedy or group_limited_greedy); both run the router in fp32 on an fp32 copy of the input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import (
    read_bool,
    read_int,
    read_positive,
    read_probability,
    read_rope_theta,
    read_str,
)
from memsim_widget.architecture.layers import (
    activation_label,
    embedding_param,
    final_norm_and_head,
    linear_params,
    norm_params,
)
from memsim_widget.architecture.moe import (
    check_top_k,
    dense_mlp,
    routed_experts,
    router,
)
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.errors import ScenarioError
from memsim_widget.fast_dataclass import dataclass

#: DeepseekV3Config defaults (transformers 5.24.0, configuration_deepseek_v3.py).
DEEPSEEK_V3_DEFAULTS: dict[str, Any] = {
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "n_group": 8,
    "topk_group": 4,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "mlp_bias": False,  # V3 has no mlp_bias key: its MLPs never carry biases
    "attention_dropout": 0.0,
    "topk_method": "noaux_tc",
}
#: DeepseekV2Config defaults (transformers 5.24.0, configuration_deepseek_v2.py).
DEEPSEEK_V2_DEFAULTS: dict[str, Any] = {
    **DEEPSEEK_V3_DEFAULTS,
    "intermediate_size": 11008,
    "moe_intermediate_size": 1407,
    "n_shared_experts": 2,
    "n_routed_experts": 64,
    "n_group": None,
    "topk_group": None,
    "num_experts_per_tok": None,  # required for a MoE layer (HF's None would fail in topk)
    "first_k_dense_replace": 0,
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
    "max_position_embeddings": 2048,
    "topk_method": "greedy",
}


def _optional_rank(cfg: Mapping[str, Any], key: str, default: int | None) -> int | None:
    """``q_lora_rank``: null (or absent with a null default) means no q compression."""
    if key in cfg and cfg[key] is None:
        return None
    if default is None and key not in cfg:
        return None
    return read_int(cfg, key, default)


@dataclass(frozen=True)
class _Mla:
    """The latent attention's ranks and head widths (``q_lora_rank`` None: no q compression)."""

    q_rank: int | None
    kv_rank: int
    rope: int
    nope: int
    v: int


@dataclass(frozen=True)
class _Moe:
    """The MLP stack: dense first layers of width ``inter``, then routed + shared experts of width ``i_moe``."""

    inter: int
    i_moe: int
    experts: int
    shared: int
    first_dense: int
    n_moe: int
    top_k: int
    topk_method: str
    n_group: Any
    topk_group: Any


def _read_mla(cfg: Mapping[str, Any], d_: Mapping[str, Any]) -> _Mla:
    """The MLA ranks and head widths of ``cfg``."""
    return _Mla(
        q_rank=_optional_rank(cfg, "q_lora_rank", d_["q_lora_rank"]),
        kv_rank=read_int(cfg, "kv_lora_rank", d_["kv_lora_rank"]),
        rope=read_int(cfg, "qk_rope_head_dim", d_["qk_rope_head_dim"]),
        nope=read_int(cfg, "qk_nope_head_dim", d_["qk_nope_head_dim"]),
        v=read_int(cfg, "v_head_dim", d_["v_head_dim"]),
    )


def _read_moe(cfg: Mapping[str, Any], d_: Mapping[str, Any], L: int, *, v3: bool) -> _Moe:
    """The MLP stack of ``cfg``, checking top-k and the expert groups (V3, or V2's group_limited_greedy)."""
    inter = read_int(cfg, "intermediate_size", d_["intermediate_size"])
    i_moe = read_int(cfg, "moe_intermediate_size", d_["moe_intermediate_size"])
    E = read_int(
        cfg, "n_routed_experts", d_["n_routed_experts"], aliases=("num_local_experts", "num_experts")
    )
    n_shared = read_int(cfg, "n_shared_experts", d_["n_shared_experts"], minimum=0)
    first_dense = min(read_int(cfg, "first_k_dense_replace", d_["first_k_dense_replace"], minimum=0), L)
    n_moe = L - first_dense
    top_k = read_int(cfg, "num_experts_per_tok", d_["num_experts_per_tok"]) if n_moe else 0
    check_top_k(top_k, E)
    topk_method = read_str(cfg, "topk_method", d_["topk_method"])
    n_group = cfg.get("n_group", d_["n_group"])
    topk_group = cfg.get("topk_group", d_["topk_group"])
    grouped = v3 or topk_method == "group_limited_greedy"
    if n_moe and grouped:
        n_group = read_int(cfg, "n_group", d_["n_group"])
        topk_group = read_int(cfg, "topk_group", d_["topk_group"])
        if E % n_group:
            raise ScenarioError("model.n_group", f"{n_group} does not divide n_routed_experts {E}")
        if topk_group > n_group:
            raise ScenarioError("model.topk_group", f"{topk_group} exceeds n_group {n_group}")
    return _Moe(inter, i_moe, E, n_shared, first_dense, n_moe, top_k, topk_method, n_group, topk_group)


def _mla_params(mla: _Mla, h: int, heads: int, L: int, attn_bias: bool) -> list[ParamGroup]:
    """The MLA projections and latent norms of every layer (``q_proj``, or ``q_a_proj`` + norm + ``q_b_proj``)."""
    a = "model.layers.*.self_attn."
    dqk = mla.nope + mla.rope
    qr, kvr = mla.q_rank, mla.kv_rank
    groups: list[ParamGroup] = []
    if qr is None:
        groups += linear_params(
            a + "q_proj", "attention", heads * dqk, h, bias=False, parallel="col", module="q_proj", count=L
        )
    else:
        groups += linear_params(
            a + "q_a_proj", "attention", qr, h, bias=attn_bias, parallel=None, module="q_a_proj", count=L
        )
        groups += norm_params(a, ("q_a_layernorm",), qr, L, bias=False, stack="decoder")
        groups += linear_params(
            a + "q_b_proj",
            "attention",
            heads * dqk,
            qr,
            bias=False,
            parallel="col",
            module="q_b_proj",
            count=L,
        )
    groups += linear_params(
        a + "kv_a_proj_with_mqa", "attention", kvr + mla.rope, h,
        bias=attn_bias, parallel=None, module="kv_a_proj_with_mqa", count=L,
    )  # fmt: skip
    groups += norm_params(a, ("kv_a_layernorm",), kvr, L, bias=False, stack="decoder")
    groups += linear_params(
        a + "kv_b_proj", "attention", heads * (mla.nope + mla.v), kvr,
        bias=False, parallel="col", module="kv_b_proj", count=L,
    )  # fmt: skip
    groups += linear_params(
        a + "o_proj", "attention", h, heads * mla.v, bias=attn_bias, parallel="row", module="o_proj", count=L
    )
    return groups


def _mlp_params(moe: _Moe, h: int, mlp_bias: bool) -> list[ParamGroup]:
    """The dense first layers' MLPs, then the router, routed experts and shared experts of the MoE layers."""
    p = "model.layers.*."
    n_moe = moe.n_moe
    groups: list[ParamGroup] = []
    groups += dense_mlp(p + "mlp.", moe.first_dense, moe.inter, h, bias=mlp_bias)
    groups += router(p + "mlp.gate", n_moe, moe.experts, h)
    groups += routed_experts(p + "mlp.experts.", n_moe, moe.experts, moe.i_moe, h)
    groups += dense_mlp(
        p + "mlp.shared_experts.", n_moe if moe.shared else 0, moe.i_moe * moe.shared, h, bias=mlp_bias
    )
    return groups


def _mlp_parts(moe: _Moe, *, v3: bool) -> tuple[dict[str, Any], ...]:
    """The MLP kinds the activation rules read: dense first layers, routed experts, shared experts."""
    parts: list[dict[str, Any]] = []
    if moe.first_dense:
        parts.append(
            {"name": "dense MLP (first layers)", "layers": moe.first_dense, "rows": 1, "width": moe.inter}
        )
    if moe.n_moe:
        parts.append(
            {"name": "routed experts", "layers": moe.n_moe, "rows": moe.top_k, "width": moe.i_moe,
             "experts": moe.experts, "router": "sigmoid" if v3 else "softmax-fp32"}
        )  # fmt: skip
        if moe.shared:
            parts.append(
                {"name": "shared experts", "layers": moe.n_moe, "rows": 1, "width": moe.i_moe * moe.shared}
            )
    return tuple(parts)


def _build(cfg: Mapping[str, Any], *, v3: bool) -> Architecture:
    """DeepSeek-V3 (``v3``) or V2 from ``cfg``: the config read, then MLA, MLP stack, norms and head."""
    d_ = DEEPSEEK_V3_DEFAULTS if v3 else DEEPSEEK_V2_DEFAULTS
    family = "deepseek_v3" if v3 else "deepseek_v2"
    h = read_int(cfg, "hidden_size")
    L = read_int(cfg, "num_hidden_layers")
    heads = read_int(cfg, "num_attention_heads")
    vocab = read_int(cfg, "vocab_size")
    tied = read_bool(cfg, "tie_word_embeddings", d_["tie_word_embeddings"])
    act = read_str(cfg, "hidden_act", d_["hidden_act"])
    attn_bias = read_bool(cfg, "attention_bias", d_["attention_bias"])
    mlp_bias = False if v3 else read_bool(cfg, "mlp_bias", d_["mlp_bias"])
    mla = _read_mla(cfg, d_)
    moe = _read_moe(cfg, d_, L, v3=v3)
    n_moe = moe.n_moe

    groups: list[ParamGroup] = [embedding_param("model.embed_tokens.weight", vocab, h)]
    groups += _mla_params(mla, h, heads, L, attn_bias)
    groups += _mlp_params(moe, h, mlp_bias)
    groups += norm_params(
        "model.layers.*.", ("input_layernorm", "post_attention_layernorm"), h, L, bias=False, stack="decoder"
    )
    groups += final_norm_and_head("model.", "norm", h, vocab, tied=tied, bias=False)
    return Architecture(
        family=family,
        model_type=str(cfg.get("model_type", family)),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=heads,  # MLA expands the latent to k and v for every head
        head_dim=mla.nope + mla.rope,
        intermediate_size=moe.i_moe if n_moe else moe.inter,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=activation_label("hidden_act", act, gated=True),
        norm="rmsnorm",
        position="rope",
        num_experts=moe.experts if n_moe else 0,
        experts_per_token=moe.top_k,
        attention_dropout=read_probability(cfg, "attention_dropout", d_["attention_dropout"]),
        decoder_layers=L,
        causal=True,
        extra={
            "hf_class": "DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM",
            "max_position_embeddings": read_int(
                cfg, "max_position_embeddings", d_["max_position_embeddings"]
            ),
            "rope_theta": read_rope_theta(cfg, d_["rope_theta"]),
            "rms_norm_eps": read_positive(cfg, "rms_norm_eps", d_["rms_norm_eps"]),
            "norms_per_layer": 2,
            "mla": {
                "q_lora_rank": mla.q_rank or 0,
                "kv_lora_rank": mla.kv_rank,
                "qk_rope_head_dim": mla.rope,
                "qk_nope_head_dim": mla.nope,
                "v_head_dim": mla.v,
            },
            "rope_head_dim": mla.rope,
            "mlp_parts": _mlp_parts(moe, v3=v3),
            "moe_layers": n_moe,
            # peft 0.21.2 maps deepseek_v2/v3 as qwen2_moe (transformers 5.24 ``_MODEL_TO_CONVERSION_PATTERN``): the
            # expert names land on the fused experts through target_parameters (architecture/moe.py)
            "lora_expert_targets": ("gate_proj", "up_proj", "down_proj", "gate") if n_moe else (),
            "first_k_dense_replace": moe.first_dense,
            "dense_intermediate_size": moe.inter,
            "moe_intermediate_size": moe.i_moe,
            "n_shared_experts": moe.shared,
            "n_group": moe.n_group,
            "topk_group": moe.topk_group,
            "topk_method": moe.topk_method,
            "routed_scaling_factor": cfg.get("routed_scaling_factor", d_["routed_scaling_factor"]),
            "norm_topk_prob": cfg.get("norm_topk_prob", d_["norm_topk_prob"]),
            "fp32_router": True,
            "mtp_layers_not_built": cfg.get("num_nextn_predict_layers", cfg.get("num_mtp_layers", 0)) or 0,
        },
    )


@register_family("deepseek_v3")
def build_deepseek_v3(cfg: Mapping[str, Any]) -> Architecture:
    """DeepSeek-V3 / R1 (671B) as ``DeepseekV3ForCausalLM``; see the module docstring."""
    return _build(cfg, v3=True)


@register_family("deepseek_v2")
def build_deepseek_v2(cfg: Mapping[str, Any]) -> Architecture:
    """DeepSeek-V2 / V2-Lite as ``DeepseekV2ForCausalLM``; see the module docstring."""
    return _build(cfg, v3=False)
