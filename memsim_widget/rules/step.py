"""Rules among the training step's own keys (checkpointing, the optimizer step, LoRA, the loop), checked when a
``Scenario`` is built, and the step keys that have no effect in some scenarios (the widget disables them)."""

from __future__ import annotations

from memsim_widget.alloc_conf import alloc_conf_error
from memsim_widget.rules.rule import Rule, inert

NO_STEP = "no optimizer step"
LORA_ONLY = "LoRA settings apply to method lora or qlora"

RULES: tuple[Rule, ...] = (
    Rule(
        "allocator_conf is a PYTORCH_CUDA_ALLOC_CONF string",
        "allocator_conf",
        "scenario",
        broken=lambda v: alloc_conf_error(v["allocator_conf"]) is not None,
        message=lambda v: str(alloc_conf_error(v["allocator_conf"])),
    ),
    *(
        inert(f"{key} needs LoRA", key, lambda v: v["method"] == "full", LORA_ONLY)
        for key in ("lora.rank", "lora.alpha", "lora.targets", "lora.adapter_dtype")
    ),
    Rule(
        "selective-op is not a Megatron mode",
        "activation_checkpointing",
        "scenario",
        broken=lambda v: (v["framework"] == "megatron") & (v["activation_checkpointing"] == "selective-op"),
        message="'selective-op' is torchtitan's per-op policy; Megatron's are 'selective' and 'full'",
        reset=lambda v: "selective",
        refused=lambda v: ["selective-op"] if v["framework"] == "megatron" else [],
    ),
    Rule(
        "checkpoint_every needs full checkpointing",
        "checkpoint_every",
        "scenario",
        broken=lambda v: ((v["checkpoint_every"] or 1) > 1) & (v["activation_checkpointing"] != "full"),
        message=lambda v: (
            f"applies to activation_checkpointing 'full' only, got {v['activation_checkpointing']!r}"
        ),
        reset=lambda v: None,
        disabled=lambda v: v["activation_checkpointing"] != "full",
    ),
    Rule(
        "checkpoint_every without activation offloading",
        "checkpoint_every",
        "scenario",
        broken=lambda v: ((v["checkpoint_every"] or 1) > 1) & v["activation_offloading"],
        message="every-N checkpointing with activation_offloading is not modelled",
    ),
    Rule(
        "offloaded layers need activation offloading",
        "activation_offloading_layers",
        "scenario",
        broken=lambda v: (v["activation_offloading_layers"] is not None) & (not v["activation_offloading"]),
        message="applies with activation_offloading true only (it counts the layers offloaded)",
        reset=lambda v: None,
        disabled=lambda v: not v["activation_offloading"],
    ),
    Rule(
        "offloaded layers without pipeline parallelism",
        "activation_offloading_layers",
        "scenario",
        broken=lambda v: (v["activation_offloading_layers"] is not None) & (v["parallel.pp"] > 1),
        message=(
            "a layer count is Megatron-Core's cpu_offloading_num_layers, which refuses pipeline parallelism "
            "(TransformerConfig); unset it to offload every layer"
        ),
    ),
    Rule(
        "optimizer in backward cannot accumulate",
        "optimizer_in_backward",
        "scenario",
        broken=lambda v: v["optimizer_in_backward"] & (v["grad_accum_steps"] > 1),
        message="cannot be combined with grad_accum_steps > 1",
        reset=lambda v: False,
        disabled=lambda v: v["grad_accum_steps"] > 1,
    ),
    inert(
        "optimizer in backward needs a step",
        "optimizer_in_backward",
        lambda v: v["optimizer"] == "none",
        NO_STEP,
        False,
        resets=True,
    ),  # fmt: skip
    inert("optimizer_impl needs a step", "optimizer_impl", lambda v: v["optimizer"] == "none", NO_STEP),
    inert(
        "output_lifetime under Megatron",
        "output_lifetime",
        lambda v: v["framework"] == "megatron",
        "Megatron's schedule keeps only the loss of the model output",
    ),
)
