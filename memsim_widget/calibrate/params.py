"""Parameter groups of any transformers causal LM, counted on the meta device (no weights, no network).

The model is built with ``AutoModelForCausalLM.from_config`` on the meta device (never ``trust_remote_code``);
every parameter ``model.named_parameters()`` lists (tied weights once, as ``sum(p.numel())`` counts) becomes a
:class:`~memsim_widget.architecture.ParamGroup`: before the repeated blocks (``scope="pre"``), inside them (one
group per block-relative name and shape, ``count`` = blocks holding it) or after them (``scope="post"``). The
role (attention, MLP, experts, norm, embedding, head) is read from the owning module's class and path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.types import ParamGroup

_ATTN = re.compile(r"attn|attention|self_att|cross_att|(^|\.)(q|k|v|o)_proj$|query|key|value|qkv")
_MLP = re.compile(
    r"mlp|ffn|feed_forward|fc\d|fc_in|fc_out|dense_h_to_4h|dense_4h_to_h|up_proj|down_proj|gate_proj"
)
_EXPERT = re.compile(r"expert")
_ROUTER = re.compile(r"router|(^|\.)gate$")


def hf_config(config: Mapping[str, Any], attention: str = "sdpa") -> Any:
    """The transformers config object of an HF config dict (``model_type`` plus keys), built offline."""
    from transformers import AutoConfig

    kw = dict(config)
    cfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
    cfg._attn_implementation = attention
    return cfg


def layer_key(cfg: Any) -> str:
    """The config key holding the block count (``n_layer`` for GPT-J, ``num_hidden_layers`` for OPT)."""
    return getattr(cfg, "attribute_map", {}).get("num_hidden_layers", "num_hidden_layers")


def build_meta(cfg: Any) -> Any:
    """The causal-LM training class of ``cfg`` on the meta device (eager attention: every class has it)."""
    import torch
    import transformers

    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


def supports_sdpa(model: Any) -> bool:
    """Whether the model class has an SDPA attention path (transformers refuses ``sdpa`` for one without)."""
    return bool(getattr(type(model), "_supports_sdpa", False))


def _signature(block: Any) -> tuple:
    """What makes two blocks the same: every submodule's class and every parameter's name and shape."""
    mods = tuple((n, type(m).__name__) for n, m in block.named_modules())
    return mods, tuple((n, tuple(p.shape)) for n, p in block.named_parameters())


def _blocks(model: Any, expected: int | None = None) -> tuple[str, int]:
    """The dotted path of the model's repeated blocks and their count: the outermost ModuleList as long as the
    config's layer count (an experts list may be longer), else the outermost longest one.

    Raises ScenarioError when the blocks differ (a hybrid of attention and state-space blocks, layers with and
    without experts): a 2- and 3-block copy would then stand for blocks it never traced."""
    import torch

    from memsim_widget.errors import ScenarioError

    best: tuple[str, Any] = ("", None)
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)]
    for name, mod in lists:
        if best[1] is None or len(mod) > len(best[1]):
            best = (name, mod)
    best = next(((n, m) for n, m in lists if expected and len(m) == expected), best)
    if best[1] is None or not len(best[1]):
        raise ScenarioError("model.model_type", "no repeated blocks (a ModuleList) found: not calibrated")
    sigs = {_signature(m) for m in best[1]}
    if len(sigs) > 1:
        kinds = sorted({type(m).__name__ for m in best[1]})
        raise ScenarioError(
            "model.model_type", f"its {len(best[1])} blocks are not all alike ({len(sigs)} kinds: "
            f"{', '.join(kinds)}): a fit from a 2- and 3-block copy cannot stand for them, so it is not calibrated",
        )  # fmt: skip
    return best[0], len(best[1])


def _kind(path: str, module: Any, where: str) -> tuple[str, bool]:
    """(role, expert) of a parameter owned by ``module`` at dotted ``path`` (relative to its block)."""
    cls = type(module).__name__.lower()
    p = path.lower()
    if "norm" in cls or re.search(r"(^|\.)(ln|norm|layernorm|layer_norm)[\w]*$", p):
        return "norm", False
    if where == "pre":
        return ("position" if "pos" in p or "position" in cls else "embedding"), False
    if where == "post":
        return ("head" if "head" in p else "other"), False
    if _EXPERT.search(p):
        return "experts", True
    if _ROUTER.search(p):
        return "router", False
    if _ATTN.search(p):
        return "attention", False
    if _MLP.search(p):
        return "mlp", False
    return "other", False


def param_groups(model: Any, layers: int | None = None) -> tuple[tuple[ParamGroup, ...], int, bool]:
    """(groups, block count, tied) of a model built on the meta device (``layers``: the config's block count);
    ``module`` is the leaf Linear name."""
    import torch

    blocks, n_blocks = _blocks(model, layers)
    modules = dict(model.named_modules())
    linear_types = (torch.nn.Linear,)
    try:
        from transformers.pytorch_utils import Conv1D

        linear_types = (torch.nn.Linear, Conv1D)
    except ImportError:  # pragma: no cover
        pass
    layered: dict[tuple[str, tuple[int, ...]], list[Any]] = {}
    groups: list[ParamGroup] = []
    prefix = blocks + "."
    for name, p in model.named_parameters():
        owner_path, _, leaf = name.rpartition(".")
        owner = modules.get(owner_path)
        is_linear = isinstance(owner, linear_types) and leaf == "weight"
        mod_name = owner_path.rpartition(".")[2] if is_linear else None
        if name.startswith(prefix):
            rel = name[len(prefix) :].partition(".")[2]
            key = (rel, tuple(p.shape))
            if key not in layered:
                kind, expert = _kind(rel.rpartition(".")[0], owner, "layer")
                layered[key] = [kind, expert, mod_name, 0]
            layered[key][3] += 1
            continue
        # embedding tables run before the blocks; everything else outside them (final norm, head) after
        where = "pre" if isinstance(owner, torch.nn.Embedding) else "post"
        kind, expert = _kind(owner_path, owner, where)
        groups.append(ParamGroup(name=name, kind=kind, shape=tuple(p.shape), scope=where, module=mod_name))
    layer_groups = [
        ParamGroup(name=f"{blocks}.*.{rel}", kind=k, shape=shape, count=n, module=m, expert=e)
        for (rel, shape), (k, e, m, n) in layered.items()
    ]
    pre = [g for g in groups if g.scope == "pre"]
    post = [g for g in groups if g.scope == "post"]
    head = getattr(model, "get_output_embeddings", lambda: None)()
    emb = getattr(model, "get_input_embeddings", lambda: None)()
    tied = head is not None and emb is not None and head.weight is emb.weight
    return (*pre, *layer_groups, *post), n_blocks, tied
