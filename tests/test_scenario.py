"""The scenario JSON is a public contract: defaults, validation and a lossless round trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from memsim_widget.errors import ScenarioError
from memsim_widget.optimizers import OPTIMIZERS
from memsim_widget.precision import PRECISIONS
from memsim_widget.scenario import (
    ATTENTIONS,
    CHECKPOINTING,
    DEFAULTS,
    FRAMEWORKS,
    LOSSES,
    METHODS,
    Scenario,
)

CONTRACT_KEYS = {
    "model",
    "method",
    "lora",
    "precision",
    "optimizer",
    "optimizer_impl",
    "optimizer_in_backward",
    "micro_batch_size",
    "seq_len",
    "grad_accum_steps",
    "activation_checkpointing",
    "attention",
    "loss",
    "framework",
    "parallel",
    "gpu",
}
PARALLEL_KEYS = {
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "zero",
    "sequence_parallel",
    "pp_schedule",
    "pp_microbatches",
    "virtual_stages",
    "offload",
    "reshard_after_forward",
}


def test_resolved_scenario_echoes_every_contract_key_with_its_default():
    d = Scenario().to_dict()
    assert set(d) >= CONTRACT_KEYS
    assert set(d["parallel"]) == PARALLEL_KEYS
    assert set(d["lora"]) == {"rank", "alpha", "targets", "adapter_dtype"}
    for key, default in DEFAULTS.items():
        if key != "num_gpus":
            assert d[key] == default, key
    assert d["num_gpus"] == 1


def test_issue_example_parses_and_round_trips():
    text = json.dumps(
        {
            "model": "llama-3.1-8b",
            "method": "full",
            "lora": {"rank": 16, "alpha": 32, "targets": ["q_proj", "v_proj"], "adapter_dtype": "fp32"},
            "precision": "bf16",
            "optimizer": "adamw",
            "optimizer_impl": "foreach",
            "optimizer_in_backward": False,
            "micro_batch_size": 1,
            "seq_len": 2048,
            "grad_accum_steps": 1,
            "activation_checkpointing": "none",
            "attention": "sdpa",
            "loss": "standard",
            "framework": "hf",
            "parallel": {
                "dp": 1,
                "tp": 1,
                "pp": 1,
                "cp": 1,
                "ep": 1,
                "zero": 0,
                "sequence_parallel": False,
                "pp_schedule": "1f1b",
                "pp_microbatches": 1,
                "virtual_stages": 1,
                "offload": "none",
                "reshard_after_forward": True,
            },
            "gpu": "h100-sxm-80gb",
        }
    )
    s = Scenario.from_json(text)
    assert Scenario.from_json(s.to_json()) == s
    assert s.to_dict()["parallel"]["offload"] == "none"


def test_inline_model_dict_is_frozen_hashable_and_round_trips(tiny_llama):
    s = Scenario.from_dict({"model": tiny_llama})
    assert hash(s) == hash(Scenario.from_dict(s.to_dict()))
    assert Scenario.from_dict(json.loads(s.to_json())) == s
    with pytest.raises(TypeError):
        s.model["hidden_size"] = 1  # type: ignore[index]


def test_partial_nested_dicts_take_defaults():
    s = Scenario.from_dict({"parallel": {"dp": 8, "zero": 3}, "lora": {"rank": 64}})
    assert s.parallel.tp == 1 and s.parallel.zero == 3 and s.parallel.world_size == 8
    assert s.lora.rank == 64 and s.lora.targets == ("q_proj", "v_proj")


def test_deepspeed_bucket_keys_echo_only_when_set():
    """``parallel.overlap_comm`` and ``reduce_bucket_size`` (unset: DeepSpeed's defaults) are left out of the
    echo when unset; set, they round-trip (5e8 as JSON writes it is the whole number)."""
    assert "overlap_comm" not in Scenario().to_dict()["parallel"]
    assert "reduce_bucket_size" not in Scenario().to_dict()["parallel"]
    s = Scenario.from_dict(
        {"parallel": {"dp": 2, "zero": 2, "overlap_comm": True, "reduce_bucket_size": 5e8}}
    )
    assert s.parallel.reduce_bucket_size == 500_000_000 and isinstance(s.parallel.reduce_bucket_size, int)
    assert Scenario.from_json(s.to_json()) == s
    auto = s.replace(parallel={"reduce_bucket_size": "auto"})
    assert Scenario.from_json(auto.to_json()).parallel.reduce_bucket_size == "auto"


def test_replace_merges_nested_dicts():
    s = Scenario().replace(parallel={"dp": 4}, micro_batch_size=8)
    assert s.parallel.dp == 4 and s.micro_batch_size == 8 and s.parallel.zero == 0


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"precision": "bf17"}, "precision", "bf16"),
        ({"optimizer": "adamw8"}, "optimizer", "adamw-8bit"),
        ({"method": "qlora2"}, "method", "qlora"),
        ({"micro_batch_size": 0}, "micro_batch_size", ">= 1"),
        ({"seq_len": -5}, "seq_len", ">= 1"),
        ({"seq_len": "long"}, "seq_len", "integer"),
        ({"parallel": {"tp": 0}}, "parallel.tp", ">= 1"),
        ({"parallel": {"zero": 4}}, "parallel.zero", "0, 1, 2, 3"),
        ({"parallel": {"tensor": 2}}, "parallel.tensor", "allowed keys"),
        ({"parallel": {"sequence_parallel": True}}, "parallel.sequence_parallel", "tp > 1"),
        ({"parallel": {"offload": "optimizer"}}, "parallel.offload", "ZeRO"),
        ({"lora": {"adapter_dtype": "int8"}}, "lora.adapter_dtype", "fp32"),
        ({"seqlen": 10}, "seqlen", "seq_len"),
        ({"num_gpus": 8, "parallel": {"dp": 2, "tp": 2}}, "num_gpus", "dp*tp*pp*cp"),
        ({"model": {"hidden_size": 10}}, "model.model_type", "model_type"),
        ({"compile": True, "activation_memory_budget": 1.5}, "activation_memory_budget", "[0, 1]"),
        ({"compile": True, "activation_memory_budget": "half"}, "activation_memory_budget", "[0, 1]"),
        ({"compile": True, "activation_memory_budget": True}, "activation_memory_budget", "[0, 1]"),
        ({"activation_memory_budget": 0.5}, "activation_memory_budget", "compile to true"),
        ({"framework": "torchtitan", "compile_loss": True}, "compile_loss", "compile to true"),
        ({"parallel": {"overlap_comm": "yes"}}, "parallel.overlap_comm", "true or false"),
        ({"parallel": {"reduce_bucket_size": "big"}}, "parallel.reduce_bucket_size", '"auto"'),
        ({"parallel": {"reduce_bucket_size": True}}, "parallel.reduce_bucket_size", '"auto"'),
        ({"parallel": {"reduce_bucket_size": 0}}, "parallel.reduce_bucket_size", ">= 1"),
        ({"parallel": {"reduce_bucket_size": 2.5}}, "parallel.reduce_bucket_size", "integer"),
        ({"parallel": {"reduce_bucket_size": 2**41}}, "parallel.reduce_bucket_size", "<="),
    ],
)
def test_bad_input_names_the_field(data, field, words):
    with pytest.raises(ScenarioError) as err:
        Scenario.from_dict(data)
    assert err.value.field == field
    assert words in str(err.value)


def test_malformed_json_is_a_scenario_error():
    with pytest.raises(ScenarioError) as err:
        Scenario.from_json('{"model": ')
    assert err.value.field == "scenario" and "malformed JSON" in str(err.value)


@given(
    method=st.sampled_from(METHODS),
    precision=st.sampled_from(sorted(PRECISIONS)),
    optimizer=st.sampled_from(sorted(OPTIMIZERS)),
    ckpt=st.sampled_from(CHECKPOINTING),
    attention=st.sampled_from(ATTENTIONS),
    loss=st.sampled_from(LOSSES),
    framework=st.sampled_from(FRAMEWORKS),
    b=st.integers(1, 64),
    s=st.integers(1, 1 << 17),
    dp=st.integers(1, 64),
    zero=st.integers(0, 3),
    rank=st.integers(1, 256),
)
def test_json_round_trip_is_lossless(
    method, precision, optimizer, ckpt, attention, loss, framework, b, s, dp, zero, rank
):
    assume(not (framework == "megatron" and ckpt == "selective-op"))  # refused: Megatron has no per-op policy
    sc = Scenario.from_dict(
        {
            "method": method,
            "precision": precision,
            "optimizer": optimizer,
            "activation_checkpointing": ckpt,
            "attention": attention,
            "loss": loss,
            "framework": framework,
            "micro_batch_size": b,
            "seq_len": s,
            "parallel": {"dp": dp, "zero": zero},
            "lora": {"rank": rank},
        }
    )
    again = Scenario.from_json(sc.to_json())
    assert again == sc and again.to_dict() == sc.to_dict()


def test_the_memory_budget_is_echoed_only_when_set() -> None:
    """``activation_memory_budget`` is optional: a scenario without it prints as before the key existed."""
    assert "activation_memory_budget" not in Scenario.from_dict({"compile": True}).to_dict()
    sc = Scenario.from_dict({"compile": True, "activation_memory_budget": 0})
    assert sc.activation_memory_budget == 0.0 and sc.to_dict()["activation_memory_budget"] == 0.0
    assert Scenario.from_dict(sc.to_dict()) == sc
