"""Fuzz the scenario boundary as a careless user would (issue 14): any value in any field, inline HF configs
with junk in their keys. The engine answers with a result or a ScenarioError naming a field, never another
exception; what it accepts writes standard JSON and reads back equal."""

from __future__ import annotations

import copy
import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsim_widget.catalog.gpus import GPUS
from memsim_widget.catalog.models import PRESETS
from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import (
    ATTENTIONS,
    CHECKPOINTING,
    DEFAULTS,
    FRAMEWORKS,
    LOSSES,
    METHODS,
    OFFLOADS,
    OPTIONAL_KEYS,
    OUTPUT_LIFETIMES,
    PADDINGS,
    PP_SCHEDULES,
    ZERO_GRADS,
    Scenario,
)

#: Small presets keep each estimate cheap; one of each family shape the builders read differently.
SMALL_MODELS = (
    "gpt2",
    "qwen2.5-0.5b",
    "bert-base-uncased",
    "t5-base",
    "vit-base-patch16-224",
    "llama-3.2-1b",
    "clip-vit-base-patch32",
    "llava-1.5-7b",
)

#: Every field an error may name: the scenario's keys, the scenario as a whole, and the derived choices.
ALLOWED_FIELDS = {*DEFAULTS, *OPTIONAL_KEYS, "scenario", "headroom", "optimizer_impl"}

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**31, 2**63, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([2.0, 0.5, -0.0, 1e300]),
    st.text(max_size=12),
    st.sampled_from(["", "abc", "x" * 300, "NaN", "1"]),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(0, 3), max_size=2),
)


def _field(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly a valid value, sometimes junk."""
    return st.one_of(valid, valid, valid, JUNK)


def _choices(values: tuple) -> st.SearchStrategy:
    return _field(st.sampled_from(values))


PARALLEL = st.fixed_dictionaries(
    {},
    optional={
        "dp": _field(st.sampled_from([1, 2, 4])),
        "tp": _field(st.sampled_from([1, 2])),
        "pp": _field(st.sampled_from([1, 2])),
        "cp": _field(st.sampled_from([1, 2])),
        "ep": _field(st.just(1)),
        "zero": _field(st.sampled_from([0, 1, 2, 3, 1.0])),
        "sequence_parallel": _field(st.booleans()),
        "pp_schedule": _choices(PP_SCHEDULES),
        "pp_microbatches": _field(st.sampled_from([1, 2, 4])),
        "virtual_stages": _field(st.sampled_from([1, 2])),
        "offload": _choices(OFFLOADS),
    },
)
LORA = st.fixed_dictionaries(
    {},
    optional={
        "rank": _field(st.sampled_from([1, 8, 16])),
        "alpha": _field(st.sampled_from([8, 16.0, 32])),
        "targets": _field(st.sampled_from([["q_proj", "v_proj"], ["all-linear"], "all-linear"])),
        "adapter_dtype": _choices(("fp32", "bf16", "fp16")),
    },
)


@st.composite
def inline_model(draw: st.DrawFn) -> dict:
    """A small preset's HF config with up to three of its keys (nested ones included) set to junk."""
    cfg = copy.deepcopy(PRESETS[draw(st.sampled_from(SMALL_MODELS))])
    keys = sorted(cfg)
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from([*keys, "rope_theta", "rms_norm_eps", "rope_scaling", "text_config"]))
        if key == "model_type" and draw(st.booleans()):
            continue  # keep most configs buildable so the junk reaches the builders
        cfg[key] = draw(st.one_of(JUNK, st.just({"factor": 2.0, "rope_type": "linear"})))
    return cfg


GPU = st.one_of(
    st.sampled_from(list(GPUS)),
    st.sampled_from(["NVIDIA A100-SXM4-80GB", "H100 80GB HBM3", "a100", "24GiB"]),
    st.fixed_dictionaries({"memory_gib": JUNK | st.sampled_from([24, 80.5])}),
    JUNK,
)

SCENARIO = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.sampled_from(SMALL_MODELS), inline_model(), JUNK),
        "method": _choices(METHODS),
        "lora": st.one_of(LORA, LORA, JUNK),
        "precision": _choices(("bf16", "fp32", "amp-bf16", "fp16")),
        "optimizer": _choices(("adamw", "sgd", "none", "adamw-8bit")),
        "optimizer_impl": _choices(("foreach", "fused", "for-loop")),
        "optimizer_in_backward": _field(st.booleans()),
        "micro_batch_size": _field(st.sampled_from([1, 2, 2.0])),
        "seq_len": _field(st.sampled_from([128, 512, 1024])),
        "grad_accum_steps": _field(st.sampled_from([1, 4])),
        "activation_checkpointing": _choices(CHECKPOINTING),
        "checkpoint_every": _field(st.sampled_from([1, 2])),
        "attention": _choices(ATTENTIONS),
        "loss": _choices(LOSSES),
        "framework": _choices(FRAMEWORKS),
        "output_lifetime": _choices(OUTPUT_LIFETIMES),
        "zero_grad": _choices(ZERO_GRADS),
        "images_per_sample": _field(st.sampled_from([0, 1, 2])),
        "freeze_vision": _field(st.booleans()),
        "compile": _field(st.booleans()),
        "activation_memory_budget": _field(st.sampled_from([None, 0.0, 0.5, 1, 1.5])),
        "compile_loss": _field(st.sampled_from([None, True, False, "no"])),
        "activation_offloading": _field(st.booleans()),
        "activation_offloading_layers": _field(st.sampled_from([None, -1, 0, 3, 10_000, 1.5, "4"])),
        "padding": _choices(PADDINGS),
        "cuda_lazy_loading": _field(st.booleans()),
        "parallel": st.one_of(PARALLEL, PARALLEL, JUNK),
        "gpu": GPU,
        "num_gpus": _field(st.sampled_from([None, 1, 2])),
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=SCENARIO)
def test_engine_raises_only_scenario_errors(data):
    try:
        sc = Scenario.from_dict(data)
        est = estimate(sc)
    except ScenarioError as exc:
        assert exc.field and "\n" not in str(exc)
        assert exc.field.split(".")[0].split("[")[0] in ALLOWED_FIELDS, exc
        return
    text = json.dumps(sc.to_dict(), allow_nan=False)  # standard JSON: no NaN/Infinity written back
    assert Scenario.from_json(text) == sc
    assert est.device_total_bytes > 0
    assert isinstance(sc.micro_batch_size, int) and isinstance(sc.parallel.zero, int)


@settings(max_examples=120, deadline=None)
@given(field=st.sampled_from(sorted(set(DEFAULTS) - {"num_gpus"})), value=JUNK)
def test_one_junk_field_is_a_named_error_or_valid(field, value):
    """Junk in one field alone, the others at their defaults: a result, or an error naming that field."""
    try:
        estimate(Scenario.from_dict({field: value}))
    except ScenarioError as exc:
        assert exc.field.split(".")[0] == field or exc.field == "model.model_type", (field, value, exc)


@settings(max_examples=80, deadline=None)
@given(value=st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**80), 2**80))
def test_numbers_are_finite_and_bounded(value):
    """Whatever number a numeric field gets, what is accepted is a finite, bounded integer or float."""
    for data in (
        {"seq_len": value},
        {"micro_batch_size": value},
        {"lora": {"alpha": value}},
        {"gpu": {"memory_gib": value}},
        {"parallel": {"dp": value, "zero": 3}},
    ):
        try:
            sc = Scenario.from_dict(data)
            est = estimate(sc)
        except ScenarioError:
            continue
        assert math.isfinite(sc.lora.alpha) and sc.seq_len <= 2**24 and sc.parallel.world_size <= 2**20
        assert 0 < est.device_total_bytes < 2**63
