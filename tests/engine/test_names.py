"""The closed name sets are StrEnums that read, serialise and print exactly as the plain strings they replace."""

from __future__ import annotations

import json

import pytest

from memsim_widget import Scenario, estimate
from memsim_widget.engine.estimate import Verdict
from memsim_widget.engine.items import CATEGORIES, LEVELS, Category, Item, Level
from memsim_widget.engine.rl.objectives import Phase, phase_of
from memsim_widget.engine.speed.step_time import TIME_CATEGORIES, TimeCategory


def test_the_sets_keep_their_names_and_order() -> None:
    assert CATEGORIES == (
        "parameters",
        "gradients",
        "optimizer_states",
        "activations",
        "temporaries",
        "overhead",
    )
    assert LEVELS == ("tensor", "allocator", "reserved", "device", "host")
    assert TIME_CATEGORIES == (
        "forward",
        "backward",
        "recompute",
        "memory-bound",
        "tensor/context parallel",
        "data parallel",
        "pipeline bubble",
        "optimizer step",
        "offload",
    )
    assert tuple(Verdict) == ("fits", "tight", "does not fit")
    assert tuple(Phase) == ("training", "rollout")


def test_a_member_serialises_formats_and_prints_as_its_value() -> None:
    data = {Category.OPTIMIZER_STATES: [Level.ALLOCATOR, Verdict.DOES_NOT_FIT, TimeCategory.MEMORY_BOUND]}
    assert json.dumps(data) == '{"optimizer_states": ["allocator", "does not fit", "memory-bound"]}'
    assert f"{Verdict.DOES_NOT_FIT}!" == "does not fit!"
    assert str(Phase.ROLLOUT) == "rollout"
    assert repr(data) == "{'optimizer_states': ['allocator', 'does not fit', 'memory-bound']}"
    assert {"activations": 1}[Category.ACTIVATIONS] == 1 and {Category.ACTIVATIONS: 1}["activations"] == 1


def test_an_item_stores_members_and_refuses_an_unknown_name() -> None:
    item = Item("activations", "x", 1000, "1000 B", "allocator")
    assert item.category is Category.ACTIVATIONS and item.level is Level.ALLOCATOR
    assert item.allocated_bytes == 1024
    assert Item(Category.OVERHEAD, "ctx", 5, "5 B", Level.DEVICE).allocated_bytes == 0
    with pytest.raises(ValueError, match="'activation' is not a valid Category"):
        Item("activation", "x", 1, "1 B")
    with pytest.raises(ValueError, match="'gpu' is not a valid Level"):
        Item("overhead", "x", 1, "1 B", "gpu")


def test_an_estimate_carries_members_and_its_json_carries_the_values() -> None:
    est = estimate(Scenario(model="qwen2.5-0.5b", seq_len=512))
    assert {type(c) for c in est.frame["category"]} == {Category}
    assert {type(i.level) for i in est.worst.items} == {Level}
    assert est.verdict() is Verdict.FITS
    assert phase_of(est.peak_phase) is Phase.TRAINING
    text = json.dumps(est.to_dict())
    assert json.loads(text)["components"].keys() == set(CATEGORIES)
    assert '"verdict": "fits"' in text and "Category." not in text and "Level." not in text
