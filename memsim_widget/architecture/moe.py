"""Shared pieces of the mixture-of-experts families (mixtral aside: qwen3_moe, deepseek_v2/v3, gpt_oss, llama4).

transformers 5 stores each MoE layer's routed experts fused, as ``experts.gate_up_proj`` [E, 2I, h] and
``experts.down_proj`` [E, h, I] (plain ``nn.Parameter`` s, not ``nn.Linear``: no LoRA Linear adapter), and
the router as a ``weight`` [E, h] parameter. The Architecture lists one tensor per expert (``count = MoE
layers x E``) so that expert parallelism divides the count, with the same element count as the fused tensors;
a rank holds them fused again, one [E/ep, ...] tensor per MoE layer (``engine/states/budget.fused_experts``).

``mlp_parts`` describes, for the engine's activations, which MLP each layer runs: a list of dicts with
``name``, ``layers`` (how many layers run it), ``rows`` (tokens it processes per token: top-k for routed
experts, 1 otherwise), ``width`` (its intermediate size) and, for routed experts, ``experts`` and ``router``
(how the router computes its scores, which decides what it saves).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memsim_widget.architecture.layers import linear_params
from memsim_widget.architecture.types import ParamGroup
from memsim_widget.errors import ScenarioError

#: peft 0.21.2's names for the checkpoint's expert Linears and the fused transformers 5 parameter each becomes a
#: ``target_parameters`` entry of (``utils/transformers_weight_conversion.py`` ``_MOE_TARGET_MODULE_MAPPING``,
#: Mixtral's and the Qwen2-MoE pattern that Qwen3-MoE and DeepSeek-V2/V3 follow); names fused into one parameter
#: must be targeted together, and the fused adapter's rank (and alpha) is the LoRA rank times their number
#: (``_MOE_FUSED_TARGETS``, ``rank_pattern``)
PEFT_EXPERT_PARAMETERS: dict[str, str] = {
    "w1": "gate_up_proj",
    "w3": "gate_up_proj",
    "w2": "down_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
    "down_proj": "down_proj",
    "gate": "gate.weight",
}


def expert_lora_ranks(targets: Iterable[str], names: Iterable[str]) -> dict[str, int]:
    """The fused expert parameters LoRA ``targets`` adapt on a model whose expert names are ``names``
    (``LimitFacts.lora_expert_targets``), each with its rank multiple (2 for gate_up_proj from two names)."""
    names = tuple(names)
    hit = {t for t in targets if t in names}
    out: dict[str, int] = {}
    for fused in dict.fromkeys(PEFT_EXPERT_PARAMETERS[n] for n in names):
        parts = [n for n in names if PEFT_EXPERT_PARAMETERS[n] == fused]
        if hit.issuperset(parts):
            out[fused] = len(parts)
    return out


def peft_parameter(g: ParamGroup) -> str:
    """The ``target_parameters`` name peft gives a MoE parameter group (a fused expert tensor's own name, the
    router's ``gate.weight``; ``PEFT_EXPERT_PARAMETERS``' values), "" for any other group."""
    if g.kind == "experts":
        return g.name.rsplit(".", 1)[-1]
    return "gate.weight" if g.kind == "router" else ""


def expert_lora_missing(targets: Iterable[str], names: Iterable[str]) -> list[tuple[str, str]]:
    """(targeted name, the name it must come with) where ``targets`` name one part of a fused parameter only
    (peft raises: "Cannot convert PEFT target(s) ... without also targeting ...")."""
    names = tuple(names)
    hit = {t for t in targets if t in names}
    out = []
    for n in sorted(hit):
        for m in names:
            if m != n and m not in hit and PEFT_EXPERT_PARAMETERS[m] == PEFT_EXPERT_PARAMETERS[n]:
                out.append((n, m))
    return out


def moe_layer_flags(n_layers: int, is_moe: Any) -> list[bool]:
    """Which layers are MoE layers, from a predicate on the layer index."""
    return [bool(is_moe(i)) for i in range(n_layers)]


def routed_experts(
    prefix: str,
    n_moe_layers: int,
    n_experts: int,
    inter: int,
    h: int,
    *,
    bias: bool = False,
    gate_up: str = "gate_up_proj",
    down: str = "down_proj",
    transposed: bool = False,
) -> list[ParamGroup]:
    """One layer's fused routed experts, per expert: gate_up [2I, h] (+ bias [2I]) and down [h, I] (+ bias [h]);
    ``transposed`` stores them [h, 2I] and [I, h] as Llama 4 and GPT-OSS do (``x @ W``, not ``W x``)."""
    if not n_moe_layers or not n_experts:
        return []
    count = n_moe_layers * n_experts
    common = {"kind": "experts", "count": count, "expert": True}
    up_shape, up_dim = ((h, 2 * inter), 1) if transposed else ((2 * inter, h), 0)
    down_shape, down_dim = ((inter, h), 0) if transposed else ((h, inter), 1)
    groups = [ParamGroup(name=f"{prefix}{gate_up}", shape=up_shape, tp_dim=up_dim, **common)]
    if bias:
        groups.append(ParamGroup(name=f"{prefix}{gate_up}_bias", shape=(2 * inter,), tp_dim=0, **common))
    groups.append(ParamGroup(name=f"{prefix}{down}", shape=down_shape, tp_dim=down_dim, **common))
    if bias:
        groups.append(ParamGroup(name=f"{prefix}{down}_bias", shape=(h,), **common))
    return groups


def router(name: str, n_moe_layers: int, n_experts: int, h: int, *, bias: bool = False) -> list[ParamGroup]:
    """The router's weight [E, h] (+ bias [E]) in each MoE layer, replicated under tensor parallelism."""
    if not n_moe_layers:
        return []
    groups = [ParamGroup(name=f"{name}.weight", kind="router", shape=(n_experts, h), count=n_moe_layers)]
    if bias:
        groups.append(ParamGroup(name=f"{name}.bias", kind="router", shape=(n_experts,), count=n_moe_layers))
    return groups


def dense_mlp(
    prefix: str, n_layers: int, inter: int, h: int, *, kind: str = "mlp", bias: bool = False
) -> list[ParamGroup]:
    """A SwiGLU MLP (gate_proj, up_proj, down_proj Linears) in ``n_layers`` layers."""
    if not n_layers:
        return []
    groups: list[ParamGroup] = []
    for name in ("gate_proj", "up_proj"):
        groups += linear_params(
            prefix + name, kind, inter, h, bias=bias, parallel="col", module=name, count=n_layers
        )
    groups += linear_params(
        prefix + "down_proj", kind, h, inter, bias=bias, parallel="row", module="down_proj", count=n_layers
    )
    return groups


def mlp_parts(
    n_dense: int, dense_width: int, n_moe: int, top_k: int, moe_width: int, experts: int
) -> tuple[dict[str, Any], ...]:
    """``mlp_parts`` of a stack that interleaves dense SwiGLU MLPs and softmax-routed experts (qwen3_moe, jamba)."""
    parts: list[dict[str, Any]] = []
    if n_dense:
        parts.append({"name": "dense MLP", "layers": n_dense, "rows": 1, "width": dense_width})
    if n_moe:
        parts.append(
            {"name": "routed experts", "layers": n_moe, "rows": top_k, "width": moe_width, "experts": experts,
             "router": "softmax"}
        )  # fmt: skip
    return tuple(parts)


def check_top_k(top_k: int, n_experts: int, key: str = "num_experts_per_tok", of: str = "experts") -> None:
    """Refuse a router that picks more experts than there are."""
    if n_experts and top_k > n_experts:
        raise ScenarioError(f"model.{key}", f"{top_k} exceeds the {n_experts} {of}")


def layer_indices(cfg: Any, key: str, n_layers: int) -> list[int]:
    """A list-of-layer-indices config key (``mlp_only_layers``), each in [0, n_layers)."""
    value = cfg.get(key)
    if value is None:
        return []
    if not isinstance(value, list | tuple) or any(
        isinstance(i, bool) or not isinstance(i, int) for i in value
    ):
        raise ScenarioError(f"model.{key}", f"must be a list of layer indices, got {value!r:.60}")
    bad = [i for i in value if not 0 <= i < n_layers]
    if bad:
        raise ScenarioError(f"model.{key}", f"layer indices must be in [0, {n_layers}), got {bad[0]}")
    return list(value)
