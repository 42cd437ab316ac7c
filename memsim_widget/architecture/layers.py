"""Parameter groups of the common layers (Linear, attention, norms, embedding, LM head) and the MLP activation
labels."""

from __future__ import annotations

from memsim_widget.architecture.types import Architecture, ParamGroup
from memsim_widget.errors import choice_error

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


def activation_label(key: str, act: str, gated: bool) -> str:
    """Map an HF activation name to the engine's MLP activation label (swiglu, geglu, gelu, ...)."""
    table = _GATED_ACTS if gated else _PLAIN_ACTS
    if act not in table:
        raise choice_error(f"model.{key}", act, table)
    return table[act]


def linear_params(
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


def norm_params(
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


def embedding_param(name: str, vocab: int, hidden: int, *, stack: str = "decoder") -> ParamGroup:
    """Token embedding table [vocab, hidden], vocab-parallel on dim 0, on the first pipeline stage."""
    return ParamGroup(name=name, kind="embedding", shape=(vocab, hidden), scope="pre", tp_dim=0, stack=stack)


def lm_head_param(name: str, vocab: int, hidden: int, *, stack: str = "decoder") -> ParamGroup:
    """Untied output projection [vocab, hidden], vocab-parallel on dim 0, on the last pipeline stage."""
    return ParamGroup(
        name=name, kind="head", shape=(vocab, hidden), scope="post", tp_dim=0, module="lm_head", stack=stack
    )


def attention_params(
    p: str,
    L: int,
    h: int,
    heads: int,
    kv: int,
    d: int,
    *,
    bias: bool,
    o_bias: bool | None = None,
    o_name: str = "o_proj",
) -> list[ParamGroup]:
    """q/k/v/o projections of a GQA attention block (``self_attn.q_proj`` ...) in ``L`` layers under prefix ``p``:
    q [heads * d, h], k and v [kv * d, h] column-parallel, the output Linear ``o_name`` [h, heads * d]
    row-parallel; ``o_bias`` None: the output Linear has a bias when the others do."""
    groups: list[ParamGroup] = []
    for name, width in (("q_proj", heads * d), ("k_proj", kv * d), ("v_proj", kv * d)):
        groups += linear_params(
            p + f"self_attn.{name}", "attention", width, h, bias=bias, parallel="col", module=name, count=L
        )
    groups += linear_params(
        p + f"self_attn.{o_name}",
        "attention",
        h,
        heads * d,
        bias=bias if o_bias is None else o_bias,
        parallel="row",
        module=o_name,
        count=L,
    )
    return groups


def final_norm_and_head(
    prefix: str, norm: str, hidden: int, vocab: int, *, tied: bool, bias: bool
) -> list[ParamGroup]:
    """The end of a decoder-only LM: its final norm ``<prefix><norm>`` and, unless the head is tied to the token
    embeddings, ``lm_head.weight`` [vocab, hidden]; both on the last pipeline stage."""
    groups = norm_params(prefix, (norm,), hidden, 1, bias=bias, scope="post", stack="decoder")
    if not tied:
        groups.append(lm_head_param("lm_head.weight", vocab, hidden))
    return groups


def qk_norm_params(
    arch: Architecture, width: int, prefix: str = "model.layers.*.self_attn."
) -> list[ParamGroup]:
    """The per-layer ``q_norm`` / ``k_norm`` RMSNorm weights [width] (replicated under tensor parallel)."""
    return [
        ParamGroup(name=f"{prefix}{n}.weight", kind="norm", shape=(width,), count=arch.num_layers)
        for n in ("q_norm", "k_norm")
    ]
