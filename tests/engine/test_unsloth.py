"""``framework: "unsloth"``: only its offloaded gradient checkpointing has a rule, as full checkpointing with the layer
inputs offloaded to the host (a formula from unsloth_zoo's ``Unsloth_Offloaded_Gradient_Checkpointer``, untraced)."""

from __future__ import annotations

import pytest

from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.trace.traceable import check_traceable

BASE = {
    "model": "llama-3.1-8b",
    "micro_batch_size": 1,
    "seq_len": 8192,
    "method": "qlora",
    "framework": "unsloth",
}
OFFLOADED = {"activation_checkpointing": "full", "activation_offloading": True}


def test_offloaded_checkpointing_is_hfs_full_checkpointing_with_the_inputs_on_the_host() -> None:
    """The checkpointer copies each layer's input to the host and saves nothing else on the GPU: the figure is HF's
    full checkpointing with activation offloading, and below full checkpointing alone (the layer inputs leave)."""
    unsloth = estimate(Scenario.from_dict({**BASE, **OFFLOADED}))
    hf = estimate(Scenario.from_dict({**BASE, **OFFLOADED, "framework": "hf"}))
    assert unsloth.peak_tensor_bytes == hf.peak_tensor_bytes
    on_gpu = estimate(Scenario.from_dict({**BASE, "activation_checkpointing": "full"}))
    assert unsloth.peak_tensor_bytes < on_gpu.peak_tensor_bytes


def test_the_caveat_says_what_is_a_formula_and_what_is_hfs() -> None:
    caveat = next(
        c for c in estimate(Scenario.from_dict({**BASE, **OFFLOADED})).caveats if c.startswith("unsloth")
    )
    assert "untraced" in caveat and "HF's rules" in caveat
    plain = next(c for c in estimate(Scenario.from_dict(BASE)).caveats if c.startswith("unsloth"))
    assert "does not set both" in plain
    with pytest.raises(ScenarioError) as err:
        check_traceable(Scenario.from_dict({**BASE, "method": "lora", **OFFLOADED}))
    assert err.value.field == "framework"
