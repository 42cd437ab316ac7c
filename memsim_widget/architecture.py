"""Model architecture: the shapes and parameter counts of a model, per module kind, from an HF config.

The engine reads only this object; it never looks at raw HF config keys. Each model family
(llama, mistral, qwen2, mixtral, gemma2, phi3, gpt2, bert, t5, vit) is one builder function in
``FAMILIES`` taking an HF config mapping; register a new family with ``register_family``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ScenarioError, choice_error, short_repr

#: Parameter kinds of the breakdown, in display order.
PARAM_KINDS = ("embedding", "position", "attention", "mlp", "experts", "router", "norm", "head", "other")


@dataclass(frozen=True)
class ParamGroup:
    """``count`` identical parameter tensors of one role (e.g. every layer's q_proj weight).

    ``scope`` says where the tensors live for pipeline splitting: ``"layer"`` (one per transformer
    block, ``count`` a multiple of the block count), ``"pre"`` (before the blocks: embeddings, on the
    first pipeline stage) or ``"post"`` (after: final norm, head, on the last stage).
    ``tp_dim`` is the dimension tensor parallelism splits (None: replicated on every TP rank).
    ``module`` is the leaf ``nn.Linear`` name LoRA targets match (``"q_proj"``), None if not a Linear weight.
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    count: int = 1
    scope: str = "layer"
    tp_dim: int | None = None
    module: str | None = None
    expert: bool = False
    stack: str = "decoder"

    @property
    def numel_each(self) -> int:
        return math.prod(self.shape)

    @property
    def numel(self) -> int:
        return self.numel_each * self.count


@dataclass(frozen=True)
class Architecture:
    """Everything the engine needs to know about a model's shape.

    ``num_layers`` counts all transformer blocks (encoder + decoder for T5). ``fixed_seq_len`` is
    set for models whose sequence is fixed by the input (ViT: patches + 1), else None. ``max_seq_len``
    is the longest sequence a learned absolute position table can index (BERT, GPT-2: its rows;
    RoBERTa: its rows less the padding offset), None where positions do not bound it (RoPE, relative).
    """

    family: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    params: tuple[ParamGroup, ...]
    mlp_activation: str = "swiglu"  # swiglu | geglu | gelu | gelu_tanh | relu
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    position: str = "rope"  # rope | learned | relative | alibi (Falcon) | none
    num_experts: int = 0
    experts_per_token: int = 0
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    encoder_layers: int = 0
    decoder_layers: int = 0
    causal: bool = True
    fixed_seq_len: int | None = None
    max_seq_len: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def parameters(self) -> int:
        """Total parameters, tied weights counted once (as ``sum(p.numel())`` in PyTorch)."""
        return sum(g.numel for g in self.params)

    def parameters_by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(PARAM_KINDS, 0)
        for g in self.params:
            out[g.kind] = out.get(g.kind, 0) + g.numel
        return out

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def attention_kernel(self, requested: str) -> str:
        """The attention transformers runs when ``requested`` is asked for: a model class without an SDPA path
        (``extra["sdpa"] is False``, Gemma 2) falls back to eager, as ``PreTrainedModel`` does by default."""
        return "eager" if requested == "sdpa" and self.extra.get("sdpa") is False else requested


FamilyBuilder = Callable[[Mapping[str, Any]], Architecture]
FAMILIES: dict[str, FamilyBuilder] = {}


def register_family(*model_types: str) -> Callable[[FamilyBuilder], FamilyBuilder]:
    """Decorator registering a builder for one or more HF ``model_type`` values."""

    def deco(fn: FamilyBuilder) -> FamilyBuilder:
        for mt in model_types:
            FAMILIES[mt] = fn
        return fn

    return deco


# ---------------------------------------------------------------------------------------------------
# Family builders: HF config mapping -> Architecture.
#
# Each builder lists every parameter tensor of the transformers class used for training (named in its
# docstring), as transformers 5.x builds it. Structural keys (hidden size, layer and head counts, vocab,
# MLP width) are required: HF's config classes would silently default them to a 7B-class model, which
# is never what a user meant. Every other key falls back to the default of the transformers config
# class, written out in the ``_*_DEFAULTS`` dicts below (the package never imports transformers).
# ---------------------------------------------------------------------------------------------------

_MISSING: Any = object()


def _present(cfg: Mapping[str, Any], key: str) -> bool:
    """True if ``key`` is in the config with a non-null value (HF treats null as 'use the default')."""
    return cfg.get(key) is not None


def _int(
    cfg: Mapping[str, Any],
    key: str,
    default: Any = _MISSING,
    *,
    minimum: int = 1,
    aliases: tuple[str, ...] = (),
) -> int:
    """Read an integer config key (or one of its aliases), raising ScenarioError naming ``model.<key>``."""
    used = next((k for k in (key, *aliases) if _present(cfg, k)), None)
    if used is None:
        if default is _MISSING:
            raise ScenarioError(f"model.{key}", "is required")
        return int(default)
    value = cfg[used]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"model.{used}", f"must be an integer, got {value!r}")
    if value < minimum:
        raise ScenarioError(f"model.{used}", f"must be >= {minimum}, got {value}")
    return value


def _float(cfg: Mapping[str, Any], key: str, default: float) -> float:
    """Read a probability-like float config key in [0, 1), e.g. a dropout rate."""
    if not _present(cfg, key):
        return float(default)
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ScenarioError(f"model.{key}", f"must be a number in [0, 1), got {value!r}")
    return float(value)


def _bool(cfg: Mapping[str, Any], key: str, default: bool) -> bool:
    """Read a boolean config key."""
    if not _present(cfg, key):
        return default
    value = cfg[key]
    if not isinstance(value, bool):
        raise ScenarioError(f"model.{key}", f"must be true or false, got {value!r}")
    return value


def _str(cfg: Mapping[str, Any], key: str, default: str) -> str:
    """Read a string config key."""
    if not _present(cfg, key):
        return default
    value = cfg[key]
    if not isinstance(value, str):
        raise ScenarioError(f"model.{key}", f"must be a string, got {value!r}")
    return value


def _head_dim(cfg: Mapping[str, Any], hidden: int, heads: int, default: int | None = None) -> int:
    """Per-head width: the explicit ``head_dim`` key, else ``default``, else hidden_size / heads."""
    if _present(cfg, "head_dim"):
        return _int(cfg, "head_dim")
    if default is not None:
        return default
    if hidden % heads:
        raise ScenarioError(
            "model.num_attention_heads",
            f"hidden_size {hidden} is not divisible by {heads} heads (set head_dim explicitly)",
        )
    return hidden // heads


def _kv_heads(cfg: Mapping[str, Any], heads: int, default: int | None) -> int:
    """Key/value head count (GQA), defaulting like the config class; must divide the query heads."""
    kv = _int(cfg, "num_key_value_heads", heads if default is None else default)
    if heads % kv:
        raise ScenarioError("model.num_key_value_heads", f"{kv} does not divide num_attention_heads {heads}")
    return kv


def _positive(cfg: Mapping[str, Any], key: str, default: float, where: str | None = None) -> float:
    """Read a positive finite number config key (``rope_theta``, ``rms_norm_eps``); null means the default."""
    if not _present(cfg, key):
        return float(default)
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ScenarioError(f"model.{where or key}", f"must be a positive finite number, got {value!r:.60}")
    return float(value)


def layer_kinds(
    cfg: Mapping[str, Any],
    layers: int,
    allowed: tuple[str, ...],
    default: Callable[[int], str],
    *,
    longer_ok: bool = False,
) -> list[str]:
    """Each layer's attention kind: the config's ``layer_types`` (one of ``allowed`` per layer; ``longer_ok``:
    a longer list is cut to ``layers``, as GPT-OSS and Llama 4 read it), else ``default(layer index)``."""
    given = cfg.get("layer_types")
    if given is None:
        return [default(i) for i in range(layers)]
    if (
        not isinstance(given, list | tuple)
        or any(t not in allowed for t in given)
        or len(given) < layers
        or (len(given) > layers and not longer_ok)
    ):
        count = f"at least {layers}" if longer_ok else str(layers)
        raise ScenarioError(
            "model.layer_types", f"must list {count} entries, each {' or '.join(map(repr, allowed))}"
        )
    return list(given[:layers])


def _rope_theta(cfg: Mapping[str, Any], default: float) -> float:
    """RoPE base, from ``rope_theta`` (transformers 4 configs) or ``rope_parameters`` (transformers 5)."""
    if _present(cfg, "rope_theta"):
        return _positive(cfg, "rope_theta", default)
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and params.get("rope_theta") is not None:
        return _positive(params, "rope_theta", default, "rope_parameters.rope_theta")
    return default


def _num_labels(cfg: Mapping[str, Any]) -> int:
    """Classifier width like PretrainedConfig: ``num_labels``, else len(``id2label``), else 2."""
    if _present(cfg, "num_labels"):
        return _int(cfg, "num_labels", minimum=0)
    id2label = cfg.get("id2label")
    if isinstance(id2label, Mapping):
        return len(id2label)
    return 2


_GATED_ACTS = {
    "silu": "swiglu",
    "swish": "swiglu",
    "gelu": "geglu",
    "gelu_new": "geglu",
    "gelu_pytorch_tanh": "geglu",
    "gelu_fast": "geglu",
}
_PLAIN_ACTS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
    "quick_gelu": "quick_gelu",  # CLIP: x * sigmoid(1.702 x)
}


def _activation(key: str, act: str, gated: bool) -> str:
    """Map an HF activation name to the engine's MLP activation label (swiglu, geglu, gelu, ...)."""
    table = _GATED_ACTS if gated else _PLAIN_ACTS
    if act not in table:
        raise choice_error(f"model.{key}", act, table)
    return table[act]


def _linear(
    name: str,
    kind: str,
    out_features: int,
    in_features: int,
    *,
    bias: bool,
    parallel: str | None,
    module: str | None,
    count: int = 1,
    scope: str = "layer",
    stack: str = "decoder",
    expert: bool = False,
    conv1d: bool = False,
) -> list[ParamGroup]:
    """Weight (+ bias) groups of an nn.Linear, with Megatron TP dims ('col', 'row' or None = replicated).

    ``conv1d`` is GPT-2's Conv1D, whose weight is stored [in, out], so the split dims are swapped.
    """
    if parallel == "col":
        w_dim, b_dim = (1 if conv1d else 0), 0
    elif parallel == "row":
        w_dim, b_dim = (0 if conv1d else 1), None
    else:
        w_dim, b_dim = None, None
    shape = (in_features, out_features) if conv1d else (out_features, in_features)
    common = {"kind": kind, "count": count, "scope": scope, "stack": stack, "expert": expert}
    groups = [ParamGroup(name=f"{name}.weight", shape=shape, tp_dim=w_dim, module=module, **common)]
    if bias:
        groups.append(ParamGroup(name=f"{name}.bias", shape=(out_features,), tp_dim=b_dim, **common))
    return groups


def _norms(
    prefix: str,
    names: tuple[str, ...],
    hidden: int,
    count: int,
    *,
    bias: bool,
    scope: str = "layer",
    stack: str,
) -> list[ParamGroup]:
    """Replicated norm weight (+ bias for LayerNorm) groups, one per named norm."""
    groups: list[ParamGroup] = []
    for n in names:
        parts = ("weight", "bias") if bias else ("weight",)
        for part in parts:
            groups.append(
                ParamGroup(
                    name=f"{prefix}{n}.{part}",
                    kind="norm",
                    shape=(hidden,),
                    count=count,
                    scope=scope,
                    stack=stack,
                )
            )
    return groups


def _embedding(name: str, vocab: int, hidden: int, *, stack: str = "decoder") -> ParamGroup:
    """Token embedding table [vocab, hidden], vocab-parallel on dim 0, on the first pipeline stage."""
    return ParamGroup(name=name, kind="embedding", shape=(vocab, hidden), scope="pre", tp_dim=0, stack=stack)


def _lm_head(name: str, vocab: int, hidden: int, *, stack: str = "decoder") -> ParamGroup:
    """Untied output projection [vocab, hidden], vocab-parallel on dim 0, on the last pipeline stage."""
    return ParamGroup(
        name=name, kind="head", shape=(vocab, hidden), scope="post", tp_dim=0, module="lm_head", stack=stack
    )


# ----------------------------------------------------------------------------- llama-style decoders

_LLAMA_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": None,  # None -> num_attention_heads
    "head_dim": None,  # None -> hidden_size // num_attention_heads
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
}
_MISTRAL_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 8,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "attention_dropout": 0.0,
}
_QWEN2_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 32,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 28,
    "attention_dropout": 0.0,
}
_MIXTRAL_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 8,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_theta": 1e6,
    "sliding_window": None,
    "attention_dropout": 0.0,
    "num_experts_per_tok": 2,
    "num_local_experts": 8,
    "router_aux_loss_coef": 0.001,
}
_GEMMA_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 16,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
}
_GEMMA2_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
}
_PHI3_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": None,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "sliding_window": None,
}

_DECODER_REQUIRED = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


def _decoder(
    cfg: Mapping[str, Any],
    *,
    family: str,
    hf_class: str,
    defaults: Mapping[str, Any],
    act_key: str = "hidden_act",
    qkv_bias: bool = False,
    o_bias: bool = False,
    mlp_bias: bool = False,
    layer_norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm"),
    fused: bool = False,
    moe: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> Architecture:
    """Shared builder for RMSNorm + RoPE decoder-only models (llama, mistral, qwen2, mixtral, gemma, phi3)."""
    h, n_layers, heads, inter, vocab = (_int(cfg, k) for k in _DECODER_REQUIRED)
    kv = _kv_heads(cfg, heads, defaults["num_key_value_heads"])
    d = _head_dim(cfg, h, heads, defaults.get("head_dim"))
    tied = _bool(cfg, "tie_word_embeddings", defaults["tie_word_embeddings"])
    act = _str(cfg, act_key, defaults[act_key])
    n_exp = _int(cfg, "num_local_experts", defaults.get("num_local_experts", 0)) if moe else 0
    top_k = _int(cfg, "num_experts_per_tok", defaults.get("num_experts_per_tok", 0)) if moe else 0
    if moe and top_k > n_exp:
        raise ScenarioError("model.num_experts_per_tok", f"{top_k} exceeds num_local_experts {n_exp}")

    L = n_layers
    p = "model.layers.*."
    groups: list[ParamGroup] = [_embedding("model.embed_tokens.weight", vocab, h)]
    if fused:  # phi3: one qkv_proj [(a + 2 kv) d, h]
        groups += _linear(
            p + "self_attn.qkv_proj", "attention", (heads + 2 * kv) * d, h,
            bias=qkv_bias, parallel="col", module="qkv_proj", count=L,
        )  # fmt: skip
    else:
        for name, width in (("q_proj", heads * d), ("k_proj", kv * d), ("v_proj", kv * d)):
            groups += _linear(
                p + f"self_attn.{name}",
                "attention",
                width,
                h,
                bias=qkv_bias,
                parallel="col",
                module=name,
                count=L,
            )
    groups += _linear(
        p + "self_attn.o_proj",
        "attention",
        h,
        heads * d,
        bias=o_bias,
        parallel="row",
        module="o_proj",
        count=L,
    )
    if moe:  # mixtral: router + per-expert w1 (gate), w3 (up), w2 (down), grouped over layers * experts
        groups += _linear(
            p + "block_sparse_moe.gate", "router", n_exp, h, bias=False, parallel=None, module="gate", count=L
        )
        e = p + "block_sparse_moe.experts.*."
        LE = L * n_exp
        groups += _linear(
            e + "w1", "experts", inter, h, bias=False, parallel="col", module="w1", count=LE, expert=True
        )
        groups += _linear(
            e + "w3", "experts", inter, h, bias=False, parallel="col", module="w3", count=LE, expert=True
        )
        groups += _linear(
            e + "w2", "experts", h, inter, bias=False, parallel="row", module="w2", count=LE, expert=True
        )
    elif fused:  # phi3: one gate_up_proj [2 I, h]
        groups += _linear(
            p + "mlp.gate_up_proj",
            "mlp",
            2 * inter,
            h,
            bias=mlp_bias,
            parallel="col",
            module="gate_up_proj",
            count=L,
        )
        groups += _linear(
            p + "mlp.down_proj", "mlp", h, inter, bias=mlp_bias, parallel="row", module="down_proj", count=L
        )
    else:
        for name in ("gate_proj", "up_proj"):
            groups += _linear(
                p + f"mlp.{name}", "mlp", inter, h, bias=mlp_bias, parallel="col", module=name, count=L
            )
        groups += _linear(
            p + "mlp.down_proj", "mlp", h, inter, bias=mlp_bias, parallel="row", module="down_proj", count=L
        )
    groups += _norms(p, layer_norms, h, L, bias=False, stack="decoder")
    groups += _norms("model.", ("norm",), h, 1, bias=False, scope="post", stack="decoder")
    if not tied:
        groups.append(_lm_head("lm_head.weight", vocab, h))

    info: dict[str, Any] = {
        "hf_class": hf_class,
        "max_position_embeddings": _int(cfg, "max_position_embeddings", defaults["max_position_embeddings"]),
        "rope_theta": _rope_theta(cfg, defaults["rope_theta"]),
        "rms_norm_eps": _positive(cfg, "rms_norm_eps", defaults["rms_norm_eps"]),
        "norms_per_layer": len(layer_norms),
    }
    if isinstance(cfg.get("rope_scaling"), Mapping):
        info["rope_scaling"] = dict(cfg["rope_scaling"])
    info.update(extra or {})
    return Architecture(
        family=family,
        model_type=str(cfg.get("model_type", family)),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=d,
        intermediate_size=inter,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=_activation(act_key, act, gated=True),
        norm="rmsnorm",
        position="rope",
        num_experts=n_exp,
        experts_per_token=top_k,
        attention_dropout=_float(cfg, "attention_dropout", defaults["attention_dropout"]),
        hidden_dropout=_float(cfg, "resid_pdrop", defaults.get("resid_pdrop", 0.0)),
        decoder_layers=L,
        causal=True,
        extra=info,
    )


@register_family("llama")
def build_llama(cfg: Mapping[str, Any]) -> Architecture:
    """Llama 2/3 as ``LlamaForCausalLM``: optional attention/MLP biases, lm_head unless tied."""
    attn_bias = _bool(cfg, "attention_bias", _LLAMA_DEFAULTS["attention_bias"])
    return _decoder(
        cfg,
        family="llama",
        hf_class="LlamaForCausalLM",
        defaults=_LLAMA_DEFAULTS,
        qkv_bias=attn_bias,
        o_bias=attn_bias,
        mlp_bias=_bool(cfg, "mlp_bias", _LLAMA_DEFAULTS["mlp_bias"]),
    )


@register_family("mistral")
def build_mistral(cfg: Mapping[str, Any]) -> Architecture:
    """Mistral as ``MistralForCausalLM``: llama layout without biases; sliding window in ``extra``."""
    window = cfg.get("sliding_window", _MISTRAL_DEFAULTS["sliding_window"])
    return _decoder(
        cfg,
        family="mistral",
        hf_class="MistralForCausalLM",
        defaults=_MISTRAL_DEFAULTS,
        extra={"sliding_window": window},
    )


@register_family("qwen2")
def build_qwen2(cfg: Mapping[str, Any]) -> Architecture:
    """Qwen2/2.5 as ``Qwen2ForCausalLM``: llama layout with q/k/v biases (never on o_proj)."""
    use_window = _bool(cfg, "use_sliding_window", _QWEN2_DEFAULTS["use_sliding_window"])
    return _decoder(
        cfg,
        family="qwen2",
        hf_class="Qwen2ForCausalLM",
        defaults=_QWEN2_DEFAULTS,
        qkv_bias=True,
        extra={
            "use_sliding_window": use_window,
            "sliding_window": cfg.get("sliding_window") if use_window else None,
            "max_window_layers": cfg.get("max_window_layers", _QWEN2_DEFAULTS["max_window_layers"]),
        },
    )


@register_family("mixtral")
def build_mixtral(cfg: Mapping[str, Any]) -> Architecture:
    """Mixtral as ``MixtralForCausalLM``: per-layer router [E, h] and E SwiGLU experts (w1, w3, w2).

    Experts are listed one tensor per expert (``count = layers * experts``, the checkpoint layout);
    transformers 5 stores them fused as ``experts.gate_up_proj`` [E, 2I, h] and ``experts.down_proj``
    [E, h, I], which has the same element count.
    """
    return _decoder(
        cfg,
        family="mixtral",
        hf_class="MixtralForCausalLM",
        defaults=_MIXTRAL_DEFAULTS,
        moe=True,
        extra={
            "sliding_window": cfg.get("sliding_window", _MIXTRAL_DEFAULTS["sliding_window"]),
            "router_aux_loss_coef": cfg.get(
                "router_aux_loss_coef", _MIXTRAL_DEFAULTS["router_aux_loss_coef"]
            ),
        },
    )


@register_family("gemma")
def build_gemma(cfg: Mapping[str, Any]) -> Architecture:
    """Gemma 1 as ``GemmaForCausalLM``: GeGLU, head_dim 256 by default, embeddings tied by default."""
    attn_bias = _bool(cfg, "attention_bias", _GEMMA_DEFAULTS["attention_bias"])
    return _decoder(
        cfg,
        family="gemma",
        hf_class="GemmaForCausalLM",
        defaults=_GEMMA_DEFAULTS,
        qkv_bias=attn_bias,
        o_bias=attn_bias,
        extra={"embedding_scale": "sqrt(hidden_size)"},
    )


@register_family("gemma2")
def build_gemma2(cfg: Mapping[str, Any]) -> Architecture:
    """Gemma 2 as ``Gemma2ForCausalLM``: 4 RMSNorms per layer, GeGLU, tied embeddings, logit softcapping.

    ``head_dim`` is its own key (default 256), not hidden_size / heads; layers alternate sliding-window
    (even) and global (odd) attention. transformers has no SDPA path for it (``extra["sdpa"] = False``): it runs
    eager, which ``Architecture.attention_kernel`` makes the engine and the tracer follow.
    """
    attn_bias = _bool(cfg, "attention_bias", _GEMMA2_DEFAULTS["attention_bias"])
    d = _GEMMA2_DEFAULTS
    return _decoder(
        cfg,
        family="gemma2",
        hf_class="Gemma2ForCausalLM",
        defaults=d,
        act_key="hidden_activation",
        qkv_bias=attn_bias,
        o_bias=attn_bias,
        layer_norms=(
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ),
        extra={
            "sliding_window": cfg.get("sliding_window", d["sliding_window"]),
            "attn_logit_softcapping": cfg.get("attn_logit_softcapping", d["attn_logit_softcapping"]),
            "final_logit_softcapping": cfg.get("final_logit_softcapping", d["final_logit_softcapping"]),
            "query_pre_attn_scalar": cfg.get("query_pre_attn_scalar", d["query_pre_attn_scalar"]),
            "layer_pattern": "sliding,global",
            "embedding_scale": "sqrt(hidden_size)",
            # Gemma2PreTrainedModel._supports_sdpa = False (SDPA cannot softcap the attention logits): transformers
            # runs it eager unless flash_attention_2 / flex_attention is asked for, and refuses "sdpa"
            "sdpa": False,
            "attention_note": "Gemma2ForCausalLM has no SDPA path in transformers (attention logit softcapping); "
            "it runs eager",
        },
    )


@register_family("phi3")
def build_phi3(cfg: Mapping[str, Any]) -> Architecture:
    """Phi-3 as ``Phi3ForCausalLM``: fused ``qkv_proj`` and ``gate_up_proj`` Linears, no biases."""
    d = _PHI3_DEFAULTS
    return _decoder(
        cfg,
        family="phi3",
        hf_class="Phi3ForCausalLM",
        defaults=d,
        fused=True,
        extra={
            "sliding_window": cfg.get("sliding_window", d["sliding_window"]),
            "embd_pdrop": _float(cfg, "embd_pdrop", d["embd_pdrop"]),
            "original_max_position_embeddings": cfg.get(
                "original_max_position_embeddings", d["original_max_position_embeddings"]
            ),
        },
    )


# ----------------------------------------------------------------------------- gpt2

_GPT2_DEFAULTS: dict[str, Any] = {
    "n_positions": 1024,
    "n_inner": None,  # None -> 4 * n_embd
    "activation_function": "gelu_new",
    "resid_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "attn_pdrop": 0.1,
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": True,
    "add_cross_attention": False,
}


@register_family("gpt2")
def build_gpt2(cfg: Mapping[str, Any]) -> Architecture:
    """GPT-2 as ``GPT2LMHeadModel``: learned positions, Conv1D weights stored [in, out], tied lm_head.

    Accepts GPT-2's own keys (n_embd, n_layer, n_head) or the generic aliases (hidden_size, ...).
    """
    d = _GPT2_DEFAULTS
    h = _int(cfg, "n_embd", aliases=("hidden_size",))
    L = _int(cfg, "n_layer", aliases=("num_hidden_layers",))
    heads = _int(cfg, "n_head", aliases=("num_attention_heads",))
    vocab = _int(cfg, "vocab_size")
    n_pos = _int(cfg, "n_positions", d["n_positions"], aliases=("max_position_embeddings",))
    inner = _int(cfg, "n_inner", 4 * h)
    tied = _bool(cfg, "tie_word_embeddings", d["tie_word_embeddings"])
    if h % heads:
        raise ScenarioError("model.n_head", f"n_embd {h} is not divisible by n_head {heads}")
    if _bool(cfg, "add_cross_attention", d["add_cross_attention"]):
        raise ScenarioError("model.add_cross_attention", "GPT-2 with cross-attention is not supported")
    p = "transformer.h.*."
    groups: list[ParamGroup] = [
        _embedding("transformer.wte.weight", vocab, h),
        ParamGroup(name="transformer.wpe.weight", kind="position", shape=(n_pos, h), scope="pre"),
    ]
    groups += _norms(p, ("ln_1",), h, L, bias=True, stack="decoder")
    groups += _linear(
        p + "attn.c_attn",
        "attention",
        3 * h,
        h,
        bias=True,
        parallel="col",
        module="c_attn",
        count=L,
        conv1d=True,
    )
    groups += _linear(
        p + "attn.c_proj", "attention", h, h, bias=True, parallel="row", module="c_proj", count=L, conv1d=True
    )
    groups += _norms(p, ("ln_2",), h, L, bias=True, stack="decoder")
    groups += _linear(
        p + "mlp.c_fc", "mlp", inner, h, bias=True, parallel="col", module="c_fc", count=L, conv1d=True
    )
    groups += _linear(
        p + "mlp.c_proj", "mlp", h, inner, bias=True, parallel="row", module="c_proj", count=L, conv1d=True
    )
    groups += _norms("transformer.", ("ln_f",), h, 1, bias=True, scope="post", stack="decoder")
    if not tied:
        groups.append(_lm_head("lm_head.weight", vocab, h))
    act = _str(cfg, "activation_function", d["activation_function"])
    return Architecture(
        family="gpt2",
        model_type=str(cfg.get("model_type", "gpt2")),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=h // heads,
        intermediate_size=inner,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=_activation("activation_function", act, gated=False),
        norm="layernorm",
        position="learned",
        attention_dropout=_float(cfg, "attn_pdrop", d["attn_pdrop"]),
        hidden_dropout=_float(cfg, "resid_pdrop", d["resid_pdrop"]),
        decoder_layers=L,
        causal=True,
        max_seq_len=n_pos,
        extra={
            "hf_class": "GPT2LMHeadModel",
            "n_positions": n_pos,
            "max_position_embeddings": n_pos,
            "embd_pdrop": _float(cfg, "embd_pdrop", d["embd_pdrop"]),
            "conv1d": True,
            "norms_per_layer": 2,
            "softmax_in_compute_dtype": True,
        },
    )


# ----------------------------------------------------------------------------- bert

_BERT_DEFAULTS: dict[str, Any] = {
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "layer_norm_eps": 1e-12,
    "tie_word_embeddings": True,
    "is_decoder": False,
    "add_cross_attention": False,
}


#: How a BERT-style encoder's forward differs from a pre-norm decoder's (engine/activations.py reads these): the
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


BERT_NAMES = MaskedLMNames(
    encoder="bert.",
    head_dense="cls.predictions.transform.dense",
    head_norm="cls.predictions.transform.LayerNorm",
    decoder="cls.predictions.decoder",
    head_bias="cls.predictions.bias",
)


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
    h, L, heads, inter, vocab = (_int(cfg, k) for k in _DECODER_REQUIRED)
    if h % heads:
        raise ScenarioError("model.num_attention_heads", f"hidden_size {h} is not divisible by {heads} heads")
    if _bool(cfg, "add_cross_attention", d["add_cross_attention"]):
        raise ScenarioError("model.add_cross_attention", f"{hf_class} with cross-attention is not supported")
    n_pos = _int(cfg, "max_position_embeddings", d["max_position_embeddings"])
    if n_pos <= position_offset:
        raise ScenarioError(
            "model.max_position_embeddings",
            f"{n_pos} leaves no position after the {position_offset} offset rows (pad_token_id + 1)",
        )
    n_types = _int(cfg, "type_vocab_size", d["type_vocab_size"])
    tied = _bool(cfg, "tie_word_embeddings", d["tie_word_embeddings"])
    S, e = "encoder", names.encoder
    groups: list[ParamGroup] = [
        _embedding(f"{e}embeddings.word_embeddings.weight", vocab, h, stack=S),
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
    groups += _norms(f"{e}embeddings.", ("LayerNorm",), h, 1, bias=True, scope="pre", stack=S)
    p = f"{e}encoder.layer.*."
    for name in ("query", "key", "value"):
        groups += _linear(
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
    groups += _linear(
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
    groups += _norms(p + "attention.output.", ("LayerNorm",), h, L, bias=True, stack=S)
    groups += _linear(
        p + "intermediate.dense", "mlp", inter, h, bias=True, parallel="col", module="dense", count=L, stack=S
    )
    groups += _linear(
        p + "output.dense", "mlp", h, inter, bias=True, parallel="row", module="dense", count=L, stack=S
    )
    groups += _norms(p + "output.", ("LayerNorm",), h, L, bias=True, stack=S)
    groups += _linear(
        names.head_dense, "head", h, h, bias=True, parallel=None, module="dense", scope="post", stack=S
    )
    norm_prefix, norm_name = names.head_norm.rsplit(".", 1)
    groups += _norms(f"{norm_prefix}.", (norm_name,), h, 1, bias=True, scope="post", stack=S)
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
    act = _str(cfg, "hidden_act", d["hidden_act"])
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
        mlp_activation=_activation("hidden_act", act, gated=False),
        norm="layernorm",
        position="learned",
        attention_dropout=_float(cfg, "attention_probs_dropout_prob", d["attention_probs_dropout_prob"]),
        hidden_dropout=_float(cfg, "hidden_dropout_prob", d["hidden_dropout_prob"]),
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


@register_family("bert")
def build_bert(cfg: Mapping[str, Any]) -> Architecture:
    """BERT as ``BertForMaskedLM`` (no pooler): MLM head = dense + LayerNorm + vocab bias.

    The MLM decoder weight is tied to the word embeddings and counted once (as the embedding); its
    [vocab] bias is counted as head. With ``tie_word_embeddings: false`` the decoder's own weight and
    bias are added (transformers 5 then leaves ``cls.predictions.bias`` a separate, unused tensor).
    """
    return bert_encoder(
        cfg, family="bert", hf_class="BertForMaskedLM", names=BERT_NAMES, defaults=_BERT_DEFAULTS
    )


# ----------------------------------------------------------------------------- t5

_T5_DEFAULTS: dict[str, Any] = {
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
    d = _T5_DEFAULTS
    h = _int(cfg, "d_model", aliases=("hidden_size",))
    enc = _int(cfg, "num_layers", aliases=("num_hidden_layers",))
    dec = _int(cfg, "num_decoder_layers", enc)
    heads = _int(cfg, "num_heads", aliases=("num_attention_heads",))
    ff = _int(cfg, "d_ff")
    vocab = _int(cfg, "vocab_size")
    d_kv = _int(cfg, "d_kv", d["d_kv"])
    buckets = _int(cfg, "relative_attention_num_buckets", d["relative_attention_num_buckets"])
    proj = _str(cfg, "feed_forward_proj", d["feed_forward_proj"])
    if proj not in _T5_ACTS:
        raise choice_error("model.feed_forward_proj", proj, _T5_ACTS)
    gated = proj.startswith("gated-")
    # transformers 5.24 T5Config.__post_init__: scale_decoder_outputs = tie_word_embeddings is not False;
    # tie_word_embeddings = True (always)
    scale_out = _bool(cfg, "tie_word_embeddings", d["tie_word_embeddings"])
    inner = heads * d_kv

    groups: list[ParamGroup] = [_embedding("shared.weight", vocab, h, stack="encoder")]
    for stack, n in (("encoder", enc), ("decoder", dec)):
        p = f"{stack}.block.*.layer."
        attns = ["0.SelfAttention"] + (["1.EncDecAttention"] if stack == "decoder" else [])
        ff_idx = len(attns)
        groups.append(
            ParamGroup(
                name=f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                kind="position",
                shape=(buckets, heads),
                scope="pre",
                stack=stack,
            )
        )
        for a in attns:
            for name in ("q", "k", "v"):
                groups += _linear(
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
            groups += _linear(
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
        wis = ("wi_0", "wi_1") if gated else ("wi",)
        for name in wis:
            groups += _linear(
                p + f"{ff_idx}.DenseReluDense.{name}", "mlp", ff, h,
                bias=False, parallel="col", module=name, count=n, stack=stack,
            )  # fmt: skip
        groups += _linear(
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
        groups += _norms(
            p, tuple(f"{i}.layer_norm" for i in range(ff_idx + 1)), h, n, bias=False, stack=stack
        )
        groups += _norms(f"{stack}.", ("final_layer_norm",), h, 1, bias=False, scope="post", stack=stack)
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
        attention_dropout=_float(cfg, "dropout_rate", d["dropout_rate"]),
        hidden_dropout=_float(cfg, "dropout_rate", d["dropout_rate"]),
        encoder_layers=enc,
        decoder_layers=dec,
        causal=True,
        extra={
            "hf_class": "T5ForConditionalGeneration",
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


# ----------------------------------------------------------------------------- vit

_VIT_DEFAULTS: dict[str, Any] = {
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


def _square(cfg: Mapping[str, Any], key: str, default: int) -> int:
    """An image/patch size given as an int or a square [h, w] pair."""
    value = cfg.get(key)
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        return _int({key: value[0]}, key)
    return _int(cfg, key, default)


@register_family("vit")
def build_vit(cfg: Mapping[str, Any]) -> Architecture:
    """ViT as ``ViTForImageClassification`` (no pooler) with a [num_labels, h] classifier.

    ``num_labels`` comes from ``num_labels`` or ``id2label`` (default 2, as HF); 0 means no classifier
    (nn.Identity), i.e. the bare encoder. The sequence is fixed: (image/patch)^2 patches + CLS.
    Linear names follow transformers 5 (q_proj, k_proj, v_proj, o_proj, fc1, fc2).
    """
    d = _VIT_DEFAULTS
    h = _int(cfg, "hidden_size")
    L = _int(cfg, "num_hidden_layers")
    heads = _int(cfg, "num_attention_heads")
    inter = _int(cfg, "intermediate_size")
    image = _square(cfg, "image_size", d["image_size"])
    patch = _square(cfg, "patch_size", d["patch_size"])
    channels = _int(cfg, "num_channels", d["num_channels"])
    labels = _num_labels(cfg)
    qkv_bias = _bool(cfg, "qkv_bias", d["qkv_bias"])
    hd = _head_dim(cfg, h, heads)
    if image % patch:
        raise ScenarioError("model.patch_size", f"{patch} does not divide image_size {image}")
    n_patches = (image // patch) ** 2
    S = "encoder"
    groups: list[ParamGroup] = [
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
    p = "vit.layers.*."
    for name in ("q_proj", "k_proj", "v_proj"):
        groups += _linear(
            p + f"attention.{name}", "attention", heads * hd, h,
            bias=qkv_bias, parallel="col", module=name, count=L, stack=S,
        )  # fmt: skip
    groups += _linear(
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
    groups += _norms(p, ("layernorm_before", "layernorm_after"), h, L, bias=True, stack=S)
    groups += _linear(
        p + "mlp.fc1", "mlp", inter, h, bias=True, parallel="col", module="fc1", count=L, stack=S
    )
    groups += _linear(
        p + "mlp.fc2", "mlp", h, inter, bias=True, parallel="row", module="fc2", count=L, stack=S
    )
    groups += _norms("vit.", ("layernorm",), h, 1, bias=True, scope="post", stack=S)
    if labels > 0:
        groups += _linear(
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
    act = _str(cfg, "hidden_act", d["hidden_act"])
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
        mlp_activation=_activation("hidden_act", act, gated=False),
        norm="layernorm",
        position="learned",
        attention_dropout=_float(cfg, "attention_probs_dropout_prob", d["attention_probs_dropout_prob"]),
        hidden_dropout=_float(cfg, "hidden_dropout_prob", d["hidden_dropout_prob"]),
        encoder_layers=L,
        causal=False,
        fixed_seq_len=n_patches + 1,
        extra={
            "hf_class": "ViTForImageClassification",
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


# ----------------------------------------------------------------------------- dispatch


def build_architecture(config: Mapping[str, Any]) -> Architecture:
    """Build the Architecture of an HF config mapping, dispatching on its ``model_type``."""
    if not isinstance(config, Mapping):
        raise ScenarioError("model", f"an HF config must be a mapping, got {type(config).__name__}")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ScenarioError("model.model_type", "is required (e.g. 'llama', 'gpt2', 't5')")
    builder = FAMILIES.get(model_type)
    if builder is None:
        raise unknown_model_type(model_type)
    return builder(config)


def _spelling_key(name: str) -> str:
    """A model type with case and separators dropped ('GPT-NeoX' and 'gpt_neox' alike)."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _one_slip(typed: str, known: str) -> bool:
    """True if ``typed`` is ``known`` with one letter of a doubled pair dropped or added ('lama' / 'llama') or
    two adjacent letters swapped ('mitsral'), digits untouched. Other one-letter edits change the name into
    another model's ('llava' / 'llama', 'bart' / 'bert', 'opt' / 'gpt'), so they are no slip."""
    if len(typed) == len(known):
        diff = [i for i, (a, b) in enumerate(zip(typed, known, strict=True)) if a != b]
        return (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and typed[diff[0]] == known[diff[1]]
            and typed[diff[1]] == known[diff[0]]
            and not typed[diff[0]].isdigit()
            and not typed[diff[1]].isdigit()
        )
    short, long_ = sorted((typed, known), key=len)
    if len(long_) - len(short) != 1:
        return False
    i = next((i for i, (a, b) in enumerate(zip(short, long_, strict=False)) if a != b), len(short))
    extra = long_[i]
    doubled = (i > 0 and long_[i - 1] == extra) or (i + 1 < len(long_) and long_[i + 1] == extra)
    return long_[:i] + long_[i + 1 :] == short and doubled and not extra.isdigit()


def unknown_model_type(model_type: str) -> ScenarioError:
    """The one error for an unsupported ``model_type``: every supported type, and a hint only for a spelling
    slip of one of them (case, separators, a doubled or swapped letter), never for a neighbour name of another
    structure (jamba -> llama, modernbert -> bert, qwen2_vl -> qwen2: following such a hint gives a wrong count)."""
    key = _spelling_key(model_type[:200])
    slips = [mt for mt in sorted(FAMILIES) if key == _spelling_key(mt) or _one_slip(key, _spelling_key(mt))]
    hint = f" (did you mean {', '.join(repr(mt) for mt in slips)}?)" if slips else ""
    return ScenarioError(
        "model.model_type",
        f"{short_repr(model_type)} is not a supported model type{hint}; supported: {', '.join(sorted(FAMILIES))} "
        "(no other architecture stands in for one: its parameters and activations differ)",
    )


# The families written one module each (memsim_widget/families/) register themselves on import.
from memsim_widget import families as _families  # noqa: E402, F401
