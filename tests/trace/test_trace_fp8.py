"""torchao's float8 training (``fp8_recipe`` tensorwise and rowwise: ``convert_to_float8_training`` on every Linear
but the head) traced on CPU fake tensors: it saves the high-precision input and weight for backward (torchao 0.18
``float8/float8_linear.py``, ``ctx.save_for_backward(input_hp, weight_hp_t)``) and casts to float8 again in
backward, so a float8 step keeps what the bf16 step keeps; only the forward's cast transients are new
(docs/fidelity.md, "fp8"). The engine's rule (``memsim_widget/fp8.py``: no quantised copy kept) is held to the trace
on ``FP8_CASES``: the small Llama and two families at their real vocabularies.

Skipped unless torchao is installed (scripts/dev installs ``torchao==0.18.0`` with ``--no-deps``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("torchao.float8")

from fidelity_cases import FP8_CASES, compare  # noqa: E402

from memsim_widget.engine.core import estimate  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

pytestmark = pytest.mark.slow


def _trace(data: dict):  # noqa: ANN202
    from memsim_widget.trace.api import trace_config

    return trace_config(Scenario.from_dict(data))


@pytest.mark.parametrize(("name", "data"), FP8_CASES, ids=[n for n, _ in FP8_CASES])
def test_engine_holds_the_float8_trace(name: str, data: dict) -> None:
    r = compare(name, data)
    assert abs(r["error"]) < 0.001, r  # the trace's peak within 0.1% (the bf16 rule's small-shape rounding)
    # the rule: a torchao float8 step keeps the bf16 step's tensors, so its estimate is the bf16 estimate
    bf16 = {k: v for k, v in data.items() if k != "fp8_recipe"}
    assert r["engine"] == estimate(Scenario.from_dict(bf16)).peak_tensor_bytes


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_training_keeps_the_bf16_steps_saved_tensors(recipe: str) -> None:
    data = dict(FP8_CASES)["llama bf16 float8 tensorwise b2 s512"]
    bf16 = _trace({k: v for k, v in data.items() if k != "fp8_recipe"})
    fp8 = _trace({**data, "fp8_recipe": recipe})
    assert fp8.ops > bf16.ops  # the float8 casts and scaled matmuls ran
    assert fp8.peak_bytes == bf16.peak_bytes  # the peak (the loss's backward) holds the same tensors
    assert fp8.phase_peaks["2/backward"] == bf16.phase_peaks["2/backward"]
    assert fp8.phase_peaks["2/forward"] > bf16.phase_peaks["2/forward"]  # the casts' transients
