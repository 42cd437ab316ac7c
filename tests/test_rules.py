"""The rules table (``memsim_widget.rules``) is what every reader applies: for each rule, a scenario that breaks it
raises exactly its message, the widget disables its control with that message, resets it with the rule's reset,
and the planner never proposes a candidate that breaks it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsim_widget.engine.activations import activations
from memsim_widget.engine.context import Context
from memsim_widget.errors import ScenarioError
from memsim_widget.optimizers import OPTIMIZERS
from memsim_widget.plan.space import SearchSpace, candidates, layouts
from memsim_widget.plan.vector import candidate_scenario
from memsim_widget.rules import RULES, Rule, available_impl
from memsim_widget.scenario import Scenario
from memsim_widget.widget.controls import CONTROLS, disabled_controls, normalize, rules_view
from memsim_widget.widget.scenario_edits import merge

SMALL_GQA = {"model_type": "llama", "hidden_size": 768, "num_hidden_layers": 2, "num_attention_heads": 12,
             "num_key_value_heads": 4, "intermediate_size": 1024, "vocab_size": 1000}  # fmt: skip
SCOUT = "llama-4-scout-17b-16e-text-only"
CLIP, LLAVA = "clip-vit-base-patch32", "llava-1.5-7b"

#: For every rule, changes to the default scenario that break it (a rule that raises) or that disable its
#: control (an inert rule). Adding a rule without an example fails ``test_every_rule_has_an_example``.
EXAMPLES: dict[str, dict[str, Any]] = {
    "sequence parallel needs tp > 1": {"parallel": {"sequence_parallel": True}},
    "ep divides dp x cp x tp": {"parallel": {"dp": 2, "tp": 2, "ep": 8}},
    "pp schedule needs pp > 1": {"parallel": {"pp_schedule": "gpipe"}},
    "pp_layers add up to the layers": {"model": "llama-3.2-1b", "parallel": {"pp": 2, "pp_layers": [7, 8]}},
    "pp micro-batches need pp > 1": {},
    "virtual stages need pp > 1": {},
    "interleaved schedule needs virtual stages": {"parallel": {"pp": 2, "pp_schedule": "interleaved"}},
    "virtual stages need the interleaved schedule": {"parallel": {"pp": 2, "virtual_stages": 2}},
    "offload needs ZeRO": {"parallel": {"offload": "optimizer"}},
    "parameter offload needs ZeRO-3": {"parallel": {"dp": 2, "zero": 2, "offload": "optimizer+params"}},
    "reshard after forward is FSDP's": {"parallel": {"dp": 2, "zero": 2}},
    "lora.rank needs LoRA": {},
    "lora.alpha needs LoRA": {},
    "lora.targets needs LoRA": {},
    "lora.adapter_dtype needs LoRA": {},
    "selective-op is not a Megatron mode": {
        "framework": "megatron",
        "activation_checkpointing": "selective-op",
    },
    "allocator_conf is a PYTORCH_CUDA_ALLOC_CONF string": {"allocator_conf": "expandable_segment:True"},
    "checkpoint_every needs full checkpointing": {"checkpoint_every": 2},
    "offloaded layers need activation offloading": {"activation_offloading_layers": 4},
    "offloaded layers without pipeline parallelism": {
        "activation_offloading": True,
        "activation_offloading_layers": 4,
        "parallel": {"pp": 2},
    },
    "offloaded layers are at most the model's": {
        "activation_offloading": True,
        "activation_offloading_layers": 33,
    },
    "checkpoint_every without activation offloading": {
        "activation_checkpointing": "full",
        "checkpoint_every": 2,
        "activation_offloading": True,
    },  # fmt: skip
    "optimizer in backward cannot accumulate": {"optimizer_in_backward": True, "grad_accum_steps": 4},
    "optimizer in backward needs a step": {"optimizer": "none", "optimizer_in_backward": True},
    "optimizer_impl needs a step": {"optimizer": "none"},
    "output_lifetime under Megatron": {"framework": "megatron"},
    "rl needs an objective": {"rl": {"num_generations": 4}},
    "shared_base needs a LoRA policy": {"objective": "dpo", "rl": {"reference": "shared_base"}},
    "ORPO is reference-free": {"objective": "orpo", "rl": {"reference": "gpu"}},
    "DPO, KTO and PPO need a reference": {"objective": "kto", "rl": {"reference": "none"}},
    "completions are shorter than the sequence": {
        "objective": "grpo",
        "seq_len": 512,
        "rl": {"completion_len": 512},
    },  # fmt: skip
    "rollout needs an online objective": {"objective": "dpo", "rl": {"rollout": "vllm_colocate"}},
    "completions per micro-batch is GRPO's": {"objective": "ppo", "rl": {"completions_per_micro_batch": 4}},
    "rl.num_generations needs its objective": {"objective": "dpo"},
    "rl.completion_len needs its objective": {},
    "rl.reference needs its objective": {"objective": "orpo"},
    "rl.rollout needs its objective": {},
    "rl.gpu_memory_utilization needs its objective": {},
    "rl.sleep_mode needs its objective": {},
    "sleep mode needs a colocated engine": {"objective": "grpo"},
    "gpu_memory_utilization needs a vLLM engine": {"objective": "ppo"},
    "tp divides the attention heads": {"parallel": {"tp": 3}},
    "tp and the key/value heads divide": {"model": SMALL_GQA, "parallel": {"tp": 6}},
    "the pipeline split gives every chunk a layer": {"parallel": {"pp": 3, "pp_split": "even"}},
    "ep needs experts it divides": {"parallel": {"dp": 2, "ep": 2}},
    "seq_len within the position table": {"model": "gpt2", "seq_len": 2048},
    "ep where the model has an expert-parallel plan": {"model": SCOUT, "parallel": {"dp": 2, "ep": 2}},
    "cp divides the sequence": {"seq_len": 2049, "parallel": {"cp": 2}},
    "the optimizer has the implementation": {"optimizer": "adamw-8bit"},
    "seq_len of a fixed-sequence model": {"model": "vit-base-patch16-224"},
    "LoRA targets the model lacks are dropped": {"method": "lora", "lora": {"targets": ["q_proj", "wq"]}},
    "LoRA targets match a module": {"method": "lora", "lora": {"targets": ["wq"]}},
    "fused expert targets come whole": {
        "model": "mixtral-8x7b",
        "method": "lora",
        "lora": {"targets": ["q_proj", "w1"]},
    },
    "LoRA on fused experts as traced": {
        "model": "mixtral-8x7b",
        "method": "lora",
        "precision": "amp-bf16",
        "lora": {"targets": ["q_proj", "w1", "w3"]},
    },
    "all-linear where peft can wrap every Linear": {
        "model": SCOUT,
        "method": "lora",
        "lora": {"targets": ["all-linear"]},
    },  # fmt: skip
    "interleaved micro-batches divide into rounds": {  # 5 micro-batches, 2 rounds of pp = 2
        "parallel": {"pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2, "pp_microbatches": 5}
    },  # fmt: skip
    "state-space layers run on one rank's whole sequence": {"model": "mamba-130m", "parallel": {"cp": 2}},
    "pipeline stages hold whole blocks of a hybrid's layer pattern": {
        "model": "jamba-v0.1",
        "parallel": {"pp": 16, "pp_microbatches": 16},
    },  # fmt: skip
    "images need a vision tower": {"images_per_sample": 2},
    "freeze_vision needs a vision tower": {"freeze_vision": True},
    "a trained vision tower is full training": {"model": LLAVA, "method": "lora", "freeze_vision": False},
    "CLIP trains one image per sample": {"model": CLIP, "seq_len": 77, "images_per_sample": 2},
    "multimodal models take no tp split": {"model": LLAVA, "parallel": {"tp": 2}},
    "multimodal models take no pp split": {"model": LLAVA, "parallel": {"pp": 2}},
    "multimodal models take no cp split": {"model": LLAVA, "parallel": {"cp": 2}},
    "multimodal checkpointing is none or full": {"model": LLAVA, "activation_checkpointing": "selective"},
    "CLIP is not checkpointed": {"model": CLIP, "seq_len": 77, "activation_checkpointing": "full"},
    "multimodal models run as transformers runs them": {"model": LLAVA, "framework": "torchtune"},
    "multimodal models take no QLoRA": {"model": LLAVA, "method": "qlora"},
    "multimodal models train sft only": {"model": LLAVA, "objective": "dpo"},
}
RAISING = [r for r in RULES if r.stage != "inert"]


def _data(rule: Rule) -> dict[str, Any]:
    """The default scenario's dict with the rule's example applied (as the widget holds it; ``num_gpus`` left to
    follow the layout)."""
    data = merge(Scenario().to_dict(), EXAMPLES[rule.name])
    data.pop("num_gpus")
    return data


def _flat(data: dict[str, Any], key: str) -> Any:
    section, _, sub = key.partition(".")
    return data[section][sub] if sub else data.get(key)


def test_every_rule_has_an_example_and_a_unique_name() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert set(EXAMPLES) == set(names)


def test_what_the_widget_does_with_a_rule_lands_on_a_control() -> None:
    """A rule that disables, refuses or resets names a control the front end draws."""
    keys = {c[0] for c in CONTROLS}
    acted = {r.field for r in RULES if r.disabled is not None or r.refused is not None or r.reset is not None}
    assert acted <= keys, acted - keys


@pytest.mark.parametrize("rule", RAISING, ids=lambda r: r.name)
def test_a_scenario_breaking_a_rule_raises_exactly_its_message(rule: Rule) -> None:
    data = _data(rule)
    view = rules_view(data)
    assert rule.judge(rule.broken, view) is not False  # the widget's view agrees (or cannot tell: adapters)
    with pytest.raises(ScenarioError) as err:
        activations(Context(Scenario.from_dict(data)))
    assert (err.value.field, err.value.message) == (rule.field, rule.text(view))


@pytest.mark.parametrize("rule", [r for r in RULES if r.disabled is not None], ids=lambda r: r.name)
def test_the_widget_disables_the_control_with_the_rules_message(rule: Rule) -> None:
    data = _data(rule)
    off, _ = disabled_controls(data)
    assert off[rule.field] == rule.text(rules_view(data))


@pytest.mark.parametrize("rule", [r for r in RULES if r.refused is not None], ids=lambda r: r.name)
def test_the_widget_refuses_the_values_that_break_the_rule(rule: Rule) -> None:
    data = _data(rule)
    _, values = disabled_controls(data)
    assert values[rule.field] == rule.refused(rules_view(data))
    assert _flat(data, rule.field) in values[rule.field]


@pytest.mark.parametrize("rule", [r for r in RULES if r.reset is not None], ids=lambda r: r.name)
def test_the_widget_resets_a_broken_rule_unless_the_field_was_set_in_the_same_change(rule: Rule) -> None:
    data = _data(rule)
    view = rules_view(data)
    assert rule.judge(rule.broken, view)
    out = normalize(data, set())
    assert _flat(out, rule.field) == rule.reset(view)
    assert not rule.judge(rule.broken, rules_view(out))
    assert _flat(normalize(data, {rule.field}), rule.field) == _flat(data, rule.field)


def test_the_optimizer_implementation_falls_back_to_fused_then_the_first_listed() -> None:
    """One rule for the widget and the planner: keep the scenario's, else fused, else the first listed."""
    assert available_impl("adamw", "for-loop") == "for-loop"
    assert available_impl("adamw-8bit", "foreach") == "fused"
    assert available_impl("adamw-4bit", "foreach") == "fused" and OPTIMIZERS["adamw-4bit"].impls[0] == "fused"
    assert available_impl("adafactor", "fused") == "for-loop"
    base = Scenario(optimizer_impl="foreach")
    row = {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero": 0, "sp": 0, "micro_batch": 1, "grad_accum": 1,
           "pp_microbatches": 1, "checkpointing": 0, "loss": 0, "optimizer": 0, "offload": 0}  # fmt: skip
    for opt in OPTIMIZERS:
        got = candidate_scenario(base, [opt], row).optimizer_impl
        sim = normalize(merge(base.to_dict(), {"optimizer": opt}), {"optimizer"})["optimizer_impl"]
        assert got == sim == available_impl(opt, "foreach")


BASES = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["qwen2.5-0.5b", "mixtral-8x7b", "mamba-130m", "falcon-7b", "gpt2"]),
        "framework": st.sampled_from(["hf", "megatron"]),
        "optimizer_in_backward": st.booleans(),
        "seq_len": st.sampled_from([512, 1024]),
        "parallel": st.sampled_from([{}, {"pp_schedule": "interleaved", "virtual_stages": 2}]),
    }
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=BASES,
    gpus=st.sampled_from([(1,), (2,), (8,), (4, 16)]),
    batch=st.sampled_from([None, 32]),
    offload=st.sampled_from([("none", "optimizer"), ("none", "optimizer", "optimizer+params")]),
    seed=st.integers(0, 2**16),
)
def test_the_planner_never_proposes_a_candidate_that_breaks_a_rule(base, gpus, batch, offload, seed) -> None:
    """Every candidate of the search space is a scenario that passes every rule (checked by building it, its
    Context and its activations: the readers that raise), sampled 60 per example."""
    if base["model"] == "mamba-130m":
        base = {**base, "framework": "hf"}  # Mamba refuses Megatron's rules before any layout is tried
    sc = Scenario.from_dict(base)
    space = SearchSpace(offload=offload, optimizers=("adamw", "adamw-8bit", "adafactor"))
    cols = candidates(sc, layouts(sc, gpus, space), space, batch)
    n = cols["dp"].shape[0]
    rng = np.random.default_rng(seed)
    for i in rng.choice(n, size=min(n, 60), replace=False) if n else []:
        row = {k: int(v[i]) for k, v in cols.items()}
        cand = candidate_scenario(sc, space.optimizers, row)
        activations(Context(cand))  # raises the first rule a candidate breaks
