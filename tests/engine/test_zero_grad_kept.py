"""``zero_grad: zeros`` (PyTorch < 2.0's ``zero_grad()``, HF Trainer before transformers 4.27): the gradients are
zeroed in place, so every one of them is alive through the next step's forward and backward, exactly as the
gradients of an earlier micro-batch are under gradient accumulation (docs/memory-facts.md#the-training-loop).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import ZERO_GRADS, Scenario

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fidelity_measured as fm  # noqa: E402

#: BertForSequenceClassification(bert-large) as benchmarks/fidelity_measured.py expresses the transformers docs'
#: 2022 Trainer run of data/measured/published.csv row 81 (fp32, batch 4 x 512), ``zero_grad`` unset.
BERT_2022 = {k: v for k, v in fm.ROWS[81].scenario.items() if k != "zero_grad"}  # type: ignore[union-attr]
BERT_PARAMETERS = 335_145_986
#: The head's and final norm's parameters: their gradients are made at the top of backward, before its peak,
#: whether or not zero_grad kept the others (the estimate's "gradients of the head and final norm" item).
BERT_HEAD_PARAMETERS = 1_051_650

SCENARIOS = [
    {"model": "llama-3.2-1b", "seq_len": 512, "micro_batch_size": 2, "gpu": "h100-sxm-80gb"},
    {"model": "gpt2", "seq_len": 1024, "precision": "amp-bf16", "gpu": "a100-80gb"},
    BERT_2022,
]


@pytest.mark.parametrize("mode", ["fitted", "replay"])
def test_the_kept_gradients_add_every_gradient_but_the_heads_to_the_peak(mode):
    """fp32 BERT-large: at the top of backward (its eager attention's softmax backward in the top layer)
    set_to_none holds the head's and final norm's gradients and those the top layer made before its attention's
    backward (engine/states/gradients._top_layer_made: the output projection's weight and bias, the MLP and the
    block's norms after the attention, both of BERT's post-norm LayerNorms: h = 1,024, I = 4,096,
    (h + 1) h + 2 h I + I + h + 2 x 2 h);
    with them kept, all 335,145,986 parameters' gradients: 4 B x (335,145,986 - 1,051,650 - that layer's) more
    live tensor bytes at the same moment."""
    h, inter = 1024, 4096
    top_layer_made = (h + 1) * h + 2 * h * inter + inter + h + 2 * 2 * h
    none = estimate({**BERT_2022, "reserved_model": mode})
    kept = estimate({**BERT_2022, "reserved_model": mode, "zero_grad": "zeros"})
    assert none.trainable_parameters == BERT_PARAMETERS
    assert none.peak_phase == kept.peak_phase == "backward_top"
    expected = 4 * (BERT_PARAMETERS - BERT_HEAD_PARAMETERS - top_layer_made)
    assert kept.peak_tensor_bytes - none.peak_tensor_bytes == expected


@pytest.mark.parametrize("base", SCENARIOS, ids=["llama-3.2-1b", "gpt2-amp", "bert-large-2022"])
def test_kept_gradients_weigh_as_an_accumulation_steps_do(base):
    """One micro-batch whose gradients zero_grad kept meets the same gradients as the second of two
    accumulated micro-batches: the same peak, in every counter of the fitted rule, and the same allocated
    peak in the replay (whose reserved differs: a different order of allocations)."""
    kept = estimate({**base, "zero_grad": "zeros", "reserved_model": "fitted"})
    accumulated = estimate({**base, "grad_accum_steps": 2, "reserved_model": "fitted"})
    assert kept.peak_phase == accumulated.peak_phase
    for key in ("peak_tensor_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes"):
        assert getattr(kept, key) == getattr(accumulated, key), key
    kept_r = estimate({**base, "zero_grad": "zeros", "reserved_model": "replay"})
    accumulated_r = estimate({**base, "grad_accum_steps": 2, "reserved_model": "replay"})
    assert kept_r.peak_allocated_bytes == accumulated_r.peak_allocated_bytes


def test_set_to_none_is_the_unset_default():
    for mode in ("fitted", "replay"):
        unset = estimate({**BERT_2022, "reserved_model": mode})
        explicit = estimate({**BERT_2022, "reserved_model": mode, "zero_grad": "set_to_none"})
        assert (unset.peak_allocated_bytes, unset.peak_reserved_bytes, unset.device_total_bytes) == (
            explicit.peak_allocated_bytes,
            explicit.peak_reserved_bytes,
            explicit.device_total_bytes,
        )
    assert "zero_grad" not in Scenario.from_dict(BERT_2022).to_dict()
    assert Scenario.from_dict({**BERT_2022, "zero_grad": "zeros"}).to_dict()["zero_grad"] == "zeros"


def test_an_unknown_zero_grad_is_refused_naming_the_field_and_its_choices():
    with pytest.raises(ScenarioError) as err:
        Scenario.from_dict({**BERT_2022, "zero_grad": "zero"})
    assert "zero_grad" in str(err.value) and all(c in str(err.value) for c in ZERO_GRADS)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(["gpt2", "qwen2.5-0.5b", "llama-3.2-1b"]),
    accum=st.sampled_from([1, 2, 4]),
    in_backward=st.booleans(),
    ckpt=st.sampled_from(["none", "full"]),
    mode=st.sampled_from(["fitted", "replay"]),
)
def test_keeping_the_gradients_never_lowers_the_peak(model, accum, in_backward, ckpt, mode):
    """Kept gradients only add live bytes: the allocated peak is at least set_to_none's, and equal to it where
    nothing is freed between steps anyway (an optimizer stepping inside backward frees each gradient there)."""
    base = {
        "model": model,
        "seq_len": 256,
        "grad_accum_steps": accum,
        "optimizer_in_backward": in_backward,
        "activation_checkpointing": ckpt,
        "reserved_model": mode,
    }
    try:
        none = estimate(base)
    except ScenarioError:  # a combination the engine refuses (an optimizer in backward with accumulation)
        assume(False)
    kept = estimate({**base, "zero_grad": "zeros"})
    assert kept.peak_allocated_bytes >= none.peak_allocated_bytes
    if in_backward:
        assert kept.peak_allocated_bytes == none.peak_allocated_bytes


def test_a_trace_of_kept_gradients_is_refused_naming_the_field():
    """The traced steps free the gradients (``zero_grad(set_to_none=True)``): a trace could not check the kept
    ones, so it is refused rather than compared with a different step."""
    from memsim_widget.trace.traceable import check_traceable

    with pytest.raises(ScenarioError) as err:
        check_traceable(Scenario.from_dict({"model": "gpt2", "seq_len": 128, "zero_grad": "zeros"}))
    assert err.value.field == "zero_grad"
    check_traceable(Scenario.from_dict({"model": "gpt2", "seq_len": 128, "zero_grad": "set_to_none"}))
