"""torchao's float8 training (``convert_to_float8_training``, tensorwise and rowwise scaling) traced on CPU fake
tensors: it saves the high-precision input and weight for backward (torchao 0.18 ``float8/float8_linear.py``,
``ctx.save_for_backward(input_hp, weight_hp_t)``) and casts to float8 again in backward, so a float8 step keeps
what the bf16 step keeps; only the forward's cast transients are new (docs/fidelity.md, "fp8").

Skipped unless torchao is installed (``pip install --no-deps torchao==0.18.0``): not in scripts/dev, because once
installed every ``import peft`` imports it, and its import prints library-load warnings on stderr (CUDA-only .so
files) that would change the notebooks' saved outputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
float8 = pytest.importorskip("torchao.float8")

from fidelity_cases import CASES  # noqa: E402

from memsim_widget.scenario import Scenario  # noqa: E402

pytestmark = pytest.mark.slow


def _trace(recipe: str | None, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN202
    import memsim_widget.trace.hf as hf
    from memsim_widget.trace.api import trace_config

    build = hf.build_hf_model

    def float8_model(cfg, dtype, attention):  # noqa: ANN001, ANN202
        model = build(cfg, dtype, attention)
        if recipe is not None:
            float8.convert_to_float8_training(
                model,
                config=float8.Float8LinearConfig.from_recipe_name(recipe),
                module_filter_fn=lambda _m, fqn: "lm_head" not in fqn,  # torchtitan leaves the output layer
            )
            assert type(model.model.layers[0].self_attn.q_proj).__name__ == "Float8Linear"
        return model

    monkeypatch.setattr(hf, "build_hf_model", float8_model)
    return trace_config(Scenario.from_dict(dict(CASES)["llama bf16 sdpa b2 s512"]))


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_training_keeps_the_bf16_steps_saved_tensors(
    recipe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bf16 = _trace(None, monkeypatch)
    fp8 = _trace(recipe, monkeypatch)
    assert fp8.ops > bf16.ops  # the float8 casts and scaled matmuls ran
    assert fp8.peak_bytes == bf16.peak_bytes  # the peak (the loss's backward) holds the same tensors
    assert fp8.phase_peaks["2/backward"] == bf16.phase_peaks["2/backward"]
    assert fp8.phase_peaks["2/forward"] > bf16.phase_peaks["2/forward"]  # the casts' transients
