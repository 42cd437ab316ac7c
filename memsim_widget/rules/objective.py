"""Rules on the objective and its ``rl`` block, checked when a ``Scenario`` is built, and the ``rl`` controls each
objective reads (the widget disables the others)."""

from __future__ import annotations

from memsim_widget.rules.rule import Rule, inert

ONLINE = ("grpo", "ppo")
NEEDS_REFERENCE = ("dpo", "kto", "ppo")
#: The ``rl`` controls and the objectives that read them.
RL_CONTROLS = {
    "rl.num_generations": ("grpo",),
    "rl.completion_len": ONLINE,
    "rl.reference": ("dpo", "kto", "grpo", "ppo"),
    "rl.rollout": ONLINE,
    "rl.gpu_memory_utilization": ONLINE,
    "rl.sleep_mode": ONLINE,
}


def _objective_reads(key: str) -> Rule:
    objectives = RL_CONTROLS[key]
    return inert(f"{key} needs its objective", key, lambda v: v["objective"] not in objectives,
                 f"applies to objective {' or '.join(objectives)}")  # fmt: skip


RULES: tuple[Rule, ...] = (
    Rule(
        "rl needs an objective",
        "rl",
        "objective",
        broken=lambda v: v["objective"] == "sft" and v["rl"] is not None,
        message="applies to the objectives dpo, orpo, kto, grpo and ppo; objective is sft",
    ),
    Rule(
        "shared_base needs a LoRA policy",
        "rl.reference",
        "objective",
        broken=lambda v: v["rl.reference"] == "shared_base" and v["method"] == "full",
        message="'shared_base' needs a LoRA/QLoRA policy (its frozen base is the reference)",
        reset=lambda v: None,
    ),
    Rule(
        "ORPO is reference-free",
        "rl.reference",
        "objective",
        broken=lambda v: v["objective"] == "orpo" and v["rl.reference"] not in (None, "none"),
        message="ORPO is reference-free: leave it unset or 'none'",
        reset=lambda v: None,
    ),
    Rule(
        "DPO, KTO and PPO need a reference",
        "rl.reference",
        "objective",
        broken=lambda v: v["objective"] in NEEDS_REFERENCE and v["rl.reference"] == "none",
        message=lambda v: f"{v['objective']} needs a reference model (or 'precomputed' log-probs)",
        reset=lambda v: None,
    ),
    Rule(
        "completions are shorter than the sequence",
        "rl.completion_len",
        "objective",
        broken=lambda v: v["objective"] in ONLINE and v["rl.completion_len"] >= v["seq_len"],
        message=lambda v: (
            f"must be below seq_len = {v['seq_len']} (prompt + completion), got {v['rl.completion_len']}"
        ),
        reset=lambda v: max(1, v["seq_len"] // 2),
    ),
    Rule(
        "rollout needs an online objective",
        "rl.rollout",
        "objective",
        broken=lambda v: v["objective"] not in ("sft", *ONLINE) and v["rl.rollout"] != "none",
        message=lambda v: f"{v['objective']} trains on a fixed dataset: rollout must be 'none'",
        reset=lambda v: "none",
    ),
    Rule(
        "completions per micro-batch is GRPO's",
        "rl.completions_per_micro_batch",
        "objective",
        broken=lambda v: v["rl.completions_per_micro_batch"] is not None and v["objective"] != "grpo",
        message=lambda v: f"applies to grpo, objective is {v['objective']}",
    ),
    *(_objective_reads(key) for key in RL_CONTROLS),
    # after the objective's own: a later rule never overwrites an earlier reason (readers keep the first)
    inert(
        "sleep mode needs a colocated engine",
        "rl.sleep_mode",
        lambda v: v["objective"] in ONLINE and v["rl.rollout"] != "vllm_colocate",
        "sleep mode applies to a colocated vLLM engine (rollout vllm_colocate)",
    ),
    inert(
        "gpu_memory_utilization needs a vLLM engine",
        "rl.gpu_memory_utilization",
        lambda v: v["objective"] in ONLINE and v["rl.rollout"] == "none",
        "applies to a vLLM rollout engine",
    ),
)
