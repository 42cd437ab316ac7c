"""Rules that need the resolved model (``arch``), checked by ``engine.context.Context``, the optimizer's
implementations (checked there too), and the state-space layers' refusal of tensor and context parallelism."""

from __future__ import annotations

from typing import Any

from memsim_widget.architecture.moe import expert_lora_missing
from memsim_widget.optimizers import OPTIMIZER_IMPLS, OPTIMIZERS
from memsim_widget.rules.pipeline_split import (
    EMBEDDING_WEIGHT,
    HEAD_WEIGHT,
    chunk_layers,
    layers_problem,
    split_problem,
    split_style,
)
from memsim_widget.rules.rule import Rule, View, inert

#: Why a state-space layer refuses a key (engine/activations.py raises the others with it).
SSM_WHY = "is not modelled for Mamba's state-space layers (no trace checks it)"


def _split_broken(v: View) -> Any:
    """Whether ``rules/pipeline_split`` cannot split the layers over pp x virtual stages in the scenario's
    style (``pp_split``; unset: even where they divide, else torchtitan's); ``parallel.pp`` may be a column."""
    n_layers, pp, vs = v["arch"].num_layers, v["parallel.pp"], v["parallel.virtual_stages"]
    eff, n = n_layers + EMBEDDING_WEIGHT + HEAD_WEIGHT, pp * vs
    style = v.get("parallel.pp_split")
    titan = eff // n < 2
    if style == "even":
        return n_layers % n != 0
    if style == "torchtitan":
        return titan
    if style == "megatron":
        return (eff % pp != 0) | ((eff // pp) % vs != 0) | titan
    return (n_layers % n != 0) & titan


def _split_text(v: View) -> str:
    """The split's problem in words (``rules/pipeline_split.split_problem``) for a scalar view."""
    n_layers, pp, vs = v["arch"].num_layers, v["parallel.pp"], v["parallel.virtual_stages"]
    style = split_style(v.get("parallel.pp_split"), n_layers, pp * vs)
    return split_problem(n_layers, pp, vs, style) or f"{n_layers} layers cannot be split over pp = {pp}"


def _auto_uneven(v: View) -> Any:
    """Whether the split is made by a style (no ``pp_layers``) and is uneven: torchtitan's and Megatron's
    always (their first and last chunk give a layer up), the unset style where pp x virtual stages does not
    divide the layers."""
    if v.get("parallel.pp_layers") is not None or v.get("parallel.pp_split") == "even":
        return False
    if v.get("parallel.pp_split") is not None:
        return True
    return v["arch"].num_layers % (v["parallel.pp"] * v["parallel.virtual_stages"]) != 0


def _stage_layer_text(v: View) -> str:
    """The layers per chunk in words: one count, or the uneven split's counts."""
    n_layers, pp, vs = v["arch"].num_layers, v["parallel.pp"], v["parallel.virtual_stages"]
    if not _auto_uneven(v):
        return str(n_layers // (pp * vs))
    return "/".join(str(c) for c in sorted(set(chunk_layers(n_layers, pp, vs, v.get("parallel.pp_split")))))


def _rounds(v: View) -> Any:
    """Rounds of ``ScheduleInterleaved1F1B``: ``max(1, pp_microbatches // pp)`` (it needs the micro-batches
    to divide into them; fewer micro-batches than pp is one round); ``parallel.pp`` may be a column."""
    r = v["parallel.pp_microbatches"] // v["parallel.pp"]
    return r + (r == 0)


def _ep_text(ep: object) -> str:
    """``ep=N`` for a typed ep over 1, else ``ep > 1`` (the disabled reason's wording; any typed value)."""
    return f"ep={ep}" if isinstance(ep, int) and ep > 1 else "ep > 1"


def available_impl(optimizer: str, impl: str) -> str:
    """The optimizer implementation a scenario gets: ``impl`` where the optimizer has it, else ``fused`` where it
    has one (bitsandbytes' and torchao's optimizers are fused kernels, and it is the fastest), else the first it
    lists. The widget's reset and the planner's candidates both take it."""
    impls = OPTIMIZERS[optimizer].impls
    if not impls or impl in impls:
        return impl
    return "fused" if "fused" in impls else impls[0]


def _impl_broken(v: View) -> bool:
    impls = OPTIMIZERS[v["optimizer"]].impls
    return v["optimizer"] != "none" and bool(impls) and v["optimizer_impl"] not in impls


def _impl_refused(v: View) -> list[str]:
    impls = OPTIMIZERS[v["optimizer"]].impls
    return [i for i in OPTIMIZER_IMPLS if i not in impls] if v["optimizer"] != "none" and impls else []


def _seq_len_broken(v: View) -> bool:
    a = v["arch"]
    return a.fixed_seq_len is None and a.max_seq_len is not None and v["seq_len"] > a.max_seq_len


def _unknown_targets(v: View) -> bool:
    targets = v["lora.targets"]
    if v["method"] == "full" or not isinstance(targets, list | tuple) or not targets:
        return False
    experts = v["arch"].facts.limits.lora_expert_targets
    return any(t not in v["linear_modules"] and t != "all-linear" and t not in experts for t in targets)


def _expert_targets(v: View) -> list[str]:
    """The LoRA targets peft maps onto the model's fused routed experts (``LimitFacts.lora_expert_targets``)."""
    targets = v["lora.targets"]
    names = v["arch"].facts.limits.lora_expert_targets
    if not isinstance(targets, list | tuple):
        return []
    return list(names) if "all-linear" in targets else [t for t in targets if t in names]


def _expert_missing(v: View) -> list[tuple[str, str]]:
    """Expert target names given without the names peft fuses them with (``architecture/moe.expert_lora_missing``)."""
    targets = v["lora.targets"]
    if not isinstance(targets, list | tuple):
        return []
    return expert_lora_missing(targets, v["arch"].facts.limits.lora_expert_targets)


#: The precisions LoRA on fused experts is traced in (peft's merged weight takes the parameter's dtype; under autocast
#: or a mixed recipe the grouped_mm would save cast copies no trace has shown).
EXPERT_LORA_PRECISIONS = ("bf16",)


def _expert_lora_untraced(v: View) -> Any:
    """LoRA on fused experts outside what was traced: another precision, QLoRA, tensor/expert/context
    parallelism, checkpointing other than none or full, compile, a framework other than transformers'."""
    p = v["precision"]
    ckpt = v["activation_checkpointing"]
    return (
        (p != "bf16")
        | (v["method"] == "qlora")
        | (v["parallel.tp"] > 1)
        | (v["parallel.ep"] > 1)
        | (v["parallel.cp"] > 1)
        | ((ckpt != "none") & (ckpt != "full"))
        | bool(v["compile"])
        | (v["framework"] != "hf")
    )


def _known_targets(v: View) -> list[str]:
    return [t for t in v["lora.targets"] if t in v["linear_modules"] or t == "all-linear"] or ["all-linear"]


RULES: tuple[Rule, ...] = (
    Rule(
        "tp divides the attention heads",
        "parallel.tp",
        "model",
        broken=lambda v: v["arch"].num_heads % v["parallel.tp"] != 0,
        message=lambda v: f"{v['arch'].num_heads} attention heads are not divisible by tp={v['parallel.tp']}",
    ),
    Rule(
        "tp and the key/value heads divide",
        "parallel.tp",
        "model",
        broken=lambda v: (
            (v["parallel.tp"] > 1)
            & (v["arch"].num_kv_heads % v["parallel.tp"] != 0)
            & (v["parallel.tp"] % v["arch"].num_kv_heads != 0)
        ),
        message=lambda v: (
            f"{v['arch'].num_kv_heads} key/value heads and tp={v['parallel.tp']}: one must divide the other"
        ),
    ),
    Rule(
        "the pipeline split gives every chunk a layer",
        "parallel.pp",
        "model",
        broken=lambda v: (v.get("parallel.pp_layers") is None) & _split_broken(v),
        message=lambda v: (
            f"{_split_text(v)} (parallel.pp_split sets the style, parallel.pp_layers the layers per stage)"
        ),
    ),
    Rule(
        "offloaded layers are at most the model's",
        "activation_offloading_layers",
        "model",
        broken=lambda v: (
            (v["activation_offloading_layers"] is not None)
            and v["activation_offloading_layers"] > v["arch"].num_layers
        ),
        message=lambda v: (
            f"must be at most the model's {v['arch'].num_layers} layers (all of them: as unset), got "
            f"{v['activation_offloading_layers']}"
        ),
    ),
    Rule(
        "pp_layers add up to the layers",
        "parallel.pp_layers",
        "model",
        broken=lambda v: (
            v["parallel.pp_layers"] is not None
            and layers_problem(v["arch"].num_layers, v["parallel.pp_layers"], v["parallel.virtual_stages"])
            is not None
        ),
        message=lambda v: str(
            layers_problem(v["arch"].num_layers, v["parallel.pp_layers"], v["parallel.virtual_stages"])
        ),
    ),
    Rule(
        "ep needs experts it divides",
        "parallel.ep",
        "model",
        broken=lambda v: (
            (v["parallel.ep"] > 1)
            & ((not v["arch"].is_moe) | (v["arch"].num_experts % v["parallel.ep"] != 0))
        ),
        message=lambda v: (  # as the disabled reason (ep = 1, or a value typed wrong): "ep > 1 needs ..."
            f"{_ep_text(v['parallel.ep'])} needs an MoE model with experts "
            f"divisible by ep (this model has {v['arch'].num_experts} experts)"
        ),
        reset=lambda v: 1,
        disabled=lambda v: not v["arch"].is_moe,
    ),
    Rule(
        "seq_len within the position table",
        "seq_len",
        "model",
        broken=_seq_len_broken,
        message=lambda v: (
            f"must be at most {v['arch'].max_seq_len} for this model (the longest sequence its learned position "
            f"table can index), got {v['seq_len']}"
        ),
        reset=lambda v: v["arch"].max_seq_len,
    ),
    Rule(
        "ep where the model has an expert-parallel plan",
        "parallel.ep",
        "model",
        broken=lambda v: (v["parallel.ep"] > 1) & (v["arch"].facts.limits.expert_parallel_error is not None),
        message=lambda v: (
            v["arch"].facts.limits.expert_parallel_error
        ),  # Llama 4: every expert takes every token
    ),
    Rule(
        "cp divides the sequence",
        "parallel.cp",
        "model",
        broken=lambda v: (v["arch"].fixed_seq_len is None) & (v["seq_len"] % v["parallel.cp"] != 0),
        message=lambda v: f"seq_len={v['seq_len']} is not divisible by cp={v['parallel.cp']}",
    ),
    Rule(
        "the optimizer has the implementation",
        "optimizer_impl",
        "model",
        broken=_impl_broken,
        message=lambda v: (
            f"{v['optimizer']} has no {v['optimizer_impl']!r} implementation; "
            f"allowed: {', '.join(OPTIMIZERS[v['optimizer']].impls)}"
        ),
        reset=lambda v: available_impl(v["optimizer"], v["optimizer_impl"]),
        refused=_impl_refused,
    ),
    inert(
        "seq_len of a fixed-sequence model",
        "seq_len",
        lambda v: bool(v["arch"].fixed_seq_len),
        lambda v: f"the model's sequence is fixed ({v['arch'].fixed_seq_len} tokens)",
    ),
    # the engine ignores targets the model lacks; the widget drops them (before the rule below can apply)
    Rule(
        "LoRA targets the model lacks are dropped",
        "lora.targets",
        "inert",
        broken=_unknown_targets,
        message="LoRA targets that name no Linear module of this model are dropped",
        reset=_known_targets,
    ),
    Rule(
        "fused expert targets come whole",
        "lora.targets",
        "model",
        broken=lambda v: v["method"] != "full" and bool(_expert_missing(v)),
        message=lambda v: (
            "; ".join(f"{a} needs {b} too" for a, b in _expert_missing(v))
            + ": peft 0.21.2 adapts them as one fused parameter of the experts (gate_up_proj)"
        ),
    ),
    Rule(
        "LoRA on fused experts as traced",
        "lora.targets",
        "model",
        broken=lambda v: (v["method"] != "full") & bool(_expert_targets(v)) & _expert_lora_untraced(v),
        message=lambda v: (
            f"{_expert_targets(v)} adapt the fused routed experts (peft's target_parameters), modelled as traced: "
            f"precision {' / '.join(EXPERT_LORA_PRECISIONS)}, LoRA (not QLoRA), tp, ep and cp 1, checkpointing none "
            "or full, no compile, framework hf; otherwise name the Linear modules only: "
            f"{', '.join(sorted({g.module for g in v['arch'].params if g.module} - set(v['arch'].facts.limits.lora_expert_targets)))}"
        ),
    ),
    Rule(
        "LoRA targets match a module",
        "lora.targets",
        "model",
        broken=lambda v: v["method"] != "full" and not v["adapters"],
        message=lambda v: (
            f"{list(v['lora.targets'])} match no Linear module of this model; "
            f"modules: {', '.join(sorted({g.module for g in v['arch'].params if g.module}))}"
        ),
    ),
    Rule(
        "all-linear where peft can wrap every Linear",
        "lora.targets",
        "model",
        broken=lambda v: (
            v["method"] != "full"
            and "all-linear" in v["lora.targets"]
            and v["arch"].facts.limits.lora_all_linear_error
            is not None  # Llama 4: peft's all-linear breaks it
        ),
        message=lambda v: v["arch"].facts.limits.lora_all_linear_error,
    ),
    Rule(
        "interleaved micro-batches divide into rounds",
        "parallel.pp_microbatches",
        "model",
        broken=lambda v: (
            (v["parallel.pp_microbatches"] % _rounds(v) != 0)
            & (v["parallel.pp"] > 1)
            & (v["parallel.pp_schedule"] == "interleaved")
        ),
        message=lambda v: (
            f"the interleaved schedule runs pp_microbatches in rounds of about pp = {v['parallel.pp']}: "
            f"{v['parallel.pp_microbatches']} micro-batches do not divide into {_rounds(v)} rounds "
            "(torch.distributed.pipelining ScheduleInterleaved1F1B)"
        ),
    ),
    Rule(
        "pipeline stages hold whole blocks of a hybrid's layer pattern",
        "parallel.pp",
        "model",
        broken=lambda v: (
            (v["parallel.pp"] * v["parallel.virtual_stages"] > 1)
            & (
                (
                    (v["arch"].num_layers // (v["parallel.pp"] * v["parallel.virtual_stages"]))
                    % v["arch"].facts.limits.block_period
                    != 0
                )
                | ((v["arch"].facts.limits.block_period > 1) & _auto_uneven(v))
            )
        ),  # fmt: skip
        message=lambda v: (
            f"{_stage_layer_text(v)} layers per pipeline stage: "
            f"{v['arch'].model_type}'s stages would hold different layer kinds (its pattern repeats every "
            f"{v['arch'].facts.limits.block_period} layers); use a pp x virtual_stages that leaves a multiple of "
            f"{v['arch'].facts.limits.block_period} layers per stage"
        ),
    ),
    Rule(
        "state-space layers run on one rank's whole sequence",
        "parallel",
        "ssm",
        broken=lambda v: (
            (v["arch"].facts.ssm is not None) & ((v["parallel.tp"] > 1) | (v["parallel.cp"] > 1))
        ),
        message=f"tensor or context parallelism {SSM_WHY}",
    ),
)
