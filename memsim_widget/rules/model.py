"""Rules that need the resolved model (``arch``), checked by ``engine.context.Context``, the optimizer's
implementations (checked there too), and the state-space layers' refusal of tensor and context parallelism."""

from __future__ import annotations

from memsim_widget.optimizers import OPTIMIZER_IMPLS, OPTIMIZERS
from memsim_widget.rules.rule import Rule, View, inert

#: Why a state-space layer refuses a key (engine/activations.py raises the others with it).
SSM_WHY = "is not modelled for Mamba's state-space layers (no trace checks it)"


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
    return any(t not in v["linear_modules"] and t != "all-linear" for t in targets)


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
        "pp x virtual stages divides the layers",
        "parallel.pp",
        "model",
        broken=lambda v: (
            (v["parallel.pp_layers"] is None)
            & (v["arch"].num_layers % (v["parallel.pp"] * v["parallel.virtual_stages"]) != 0)
        ),
        message=lambda v: (
            f"{v['arch'].num_layers} layers are not divisible by pp*virtual_stages = "
            f"{v['parallel.pp'] * v['parallel.virtual_stages']} (parallel.pp_layers sets an uneven split)"
        ),
    ),
    Rule(
        "pp_layers add up to the layers",
        "parallel.pp_layers",
        "model",
        broken=lambda v: (
            v["parallel.pp_layers"] is not None
            and (
                sum(v["parallel.pp_layers"]) != v["arch"].num_layers
                or min(v["parallel.pp_layers"]) < v["parallel.virtual_stages"]
            )
        ),
        message=lambda v: (
            f"must add up to the model's {v['arch'].num_layers} layers, at least virtual_stages = "
            f"{v['parallel.virtual_stages']} per stage, got {list(v['parallel.pp_layers'])}"
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
        "interleaved schedule fills the pipeline",
        "parallel.pp_microbatches",
        "model",
        broken=lambda v: (
            (v["parallel.pp_microbatches"] < v["parallel.pp"])
            & (v["parallel.pp"] > 1)
            & (v["parallel.pp_schedule"] == "interleaved")
        ),
        message="the interleaved schedule needs pp_microbatches >= pp",
    ),
    Rule(
        "pipeline stages hold whole blocks of a hybrid's layer pattern",
        "parallel.pp",
        "model",
        broken=lambda v: (
            (v["parallel.pp"] * v["parallel.virtual_stages"] > 1)
            & (
                (v["arch"].num_layers // (v["parallel.pp"] * v["parallel.virtual_stages"]))
                % v["arch"].facts.limits.block_period
                != 0
            )
        ),  # fmt: skip
        message=lambda v: (
            f"{v['arch'].num_layers // (v['parallel.pp'] * v['parallel.virtual_stages'])} layers per pipeline stage: "
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
