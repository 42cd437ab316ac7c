"""FSDP2 ``reshard_after_forward`` (parallel.reshard_after_forward), as its trace shows (docs/fidelity-parallel.md):
False keeps every layer's unsharded parameters from its forward to its backward and holds no all-gather output."""

from __future__ import annotations

import pytest
from fidelity_cases import LLAMA

from memsim_widget.catalog.models import architecture_for
from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario


def moment_bytes(reshard: bool, moment: str, **kw) -> int:
    par = {"dp": 4, "zero": 3, "reshard_after_forward": reshard}
    est = estimate(Scenario.from_dict({"model": LLAMA, "seq_len": 128, "parallel": par, **kw}))
    return next(m for m in est.ranks[0].moments if m.name == moment).tensor_bytes


def layer_bytes() -> int:
    """One decoder layer's parameters in bf16, unsharded."""
    arch = architecture_for(LLAMA)
    return 2 * sum(g.numel for g in arch.params if g.scope == "layer") // arch.num_layers


@pytest.mark.parametrize("moment", ["forward_end", "backward_start"])
def test_no_reshard_holds_every_layer_and_no_all_gather_output_through_the_loss(moment):
    layers = architecture_for(LLAMA).num_layers
    extra = moment_bytes(False, moment) - moment_bytes(True, moment)
    assert extra == layers * layer_bytes() - layer_bytes()  # all layers kept, the last all-gather output gone


def test_no_reshard_keeps_the_other_layers_at_the_top_of_backward():
    layers = architecture_for(LLAMA).num_layers
    extra = moment_bytes(False, "backward_top") - moment_bytes(True, "backward_top")
    assert extra == (layers - 1) * layer_bytes() - layer_bytes()


def test_no_reshard_changes_nothing_without_fsdp():
    for par in ({"dp": 4, "zero": 2}, {"dp": 1, "zero": 0}):
        a, b = (
            estimate(Scenario.from_dict({"model": LLAMA, "parallel": {**par, "reshard_after_forward": r}}))
            for r in (True, False)
        )
        assert a.device_total_bytes == b.device_total_bytes


def test_reshard_after_forward_must_be_a_bool():
    with pytest.raises(ScenarioError) as err:
        Scenario.from_dict({"parallel": {"reshard_after_forward": "no"}})
    assert err.value.field == "parallel.reshard_after_forward"
