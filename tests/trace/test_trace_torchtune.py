"""torchtune's activation offloading and optimizer in backward, traced (trace/torchtune_memory.py reproduces
torchtune v0.6.1's ``OffloadActivations`` and ``register_optim_in_bwd_hooks``) and held against the engine."""

from __future__ import annotations

import pytest
from fidelity_cases import CASES, TORCHTUNE_CASES

from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.trace.traceable import check_traceable, trace_kwargs

LLAMA_CKPT = dict(CASES)["llama bf16 ckpt b2 s512"]


def test_the_tracer_takes_both_savers_for_one_gpu() -> None:
    sc = Scenario.from_dict({**LLAMA_CKPT, "activation_offloading": True, "optimizer_in_backward": True})
    check_traceable(sc)
    kw = trace_kwargs(sc)
    assert kw["activation_offloading"] is True and kw["optimizer_in_backward"] is True
    assert "activation_offloading" not in trace_kwargs(Scenario.from_dict(LLAMA_CKPT))


@pytest.mark.parametrize("key", ["activation_offloading", "optimizer_in_backward"])
def test_a_multi_gpu_layout_with_a_saver_is_refused_by_its_field(key: str) -> None:
    sc = Scenario.from_dict({**LLAMA_CKPT, key: True, "parallel": {"dp": 2, "zero": 3}})
    with pytest.raises(ScenarioError) as err:
        check_traceable(sc)
    assert err.value.field == key


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        # a layer's backward holds the peak: the layer brought back is the engine's one resident layer
        ("llama bf16 ckpt offload b2 s512", -0.01, 0.01),  # the same -0.85% as without offloading
        ("llama bf16 opt-in-bwd b2 s512", 0.0, 0.001),
        ("llama bf16 ckpt offload opt-in-bwd b2 s512", 0.0, 0.03),
        # the loss peak: the engine's one resident layer is the only excess (traced: none)
        ("llama L8 V32k bf16 ckpt offload b2 s512", 0.0, 0.002),
        ("llama L8 V32k bf16 offload b2 s512", 0.0, 0.03),
        # bitsandbytes: exact but for its quantisation maps (2 x 1 KiB per optimizer, one optimizer per parameter
        # in backward), which the engine leaves out
        ("llama L8 V32k bf16 ckpt adamw-8bit b2 s512", -1e-4, 1e-4),
        ("llama L8 V32k bf16 ckpt adamw-8bit opt-in-bwd offload b2 s512", -0.001, 0.002),
        ("llama L8 V32k bf16 ckpt paged-adamw-8bit b2 s512", -1e-4, 1e-4),
        ("llama L8 V32k bf16 ckpt paged-adamw-8bit opt-in-bwd offload b2 s512", -0.001, 0.002),
        ("llama L8 V32k bf16 ckpt paged-adamw opt-in-bwd b2 s512", -1e-4, 1e-4),
        ("llama L8 V32k bf16 ckpt paged-adamw opt-in-bwd offload b2 s512", 0.0, 0.002),
    ],
)
def test_the_engine_holds_to_the_torchtune_trace(name: str, low: float, high: float) -> None:
    pytest.importorskip("transformers")
    from fidelity_cases import compare

    r = compare(name, dict(TORCHTUNE_CASES)[name])
    assert low <= r["error"] <= high, r


@pytest.mark.slow
def test_at_the_loss_every_layer_input_is_on_the_host() -> None:
    """torchtune keeps a GPU original only until five more tensors are packed; the final norm packs more than
    five, so at the loss peak none of the eight checkpointed layer inputs (2 B x T x h each) is on the GPU."""
    pytest.importorskip("transformers")
    from memsim_widget.trace.api import trace_config

    off = dict(TORCHTUNE_CASES)["llama L8 V32k bf16 ckpt offload b2 s512"]
    on_gpu = trace_config(Scenario.from_dict({**off, "activation_offloading": False}))
    offloaded = trace_config(Scenario.from_dict(off))
    assert on_gpu.peak_op == offloaded.peak_op == "_log_softmax_backward_data"
    assert on_gpu.by_role["activation"] - offloaded.by_role["activation"] == 8 * 2 * (2 * 512) * 256


@pytest.mark.slow
def test_in_backward_no_gradient_outlives_its_step() -> None:
    pytest.importorskip("transformers")
    from memsim_widget.trace.api import trace_config

    tr = trace_config(Scenario.from_dict(dict(TORCHTUNE_CASES)["llama bf16 opt-in-bwd b2 s512"]))
    assert tr.model_state_bytes["gradient"] == 0
    assert tr.model_state_bytes["optimizer_state"] > 0


def _l8_parameters() -> list[int]:
    """Elements of each parameter of the eight-layer Llama (h 256, 4 kv heads of 32, I 688, V 32000, untied)."""
    h, kv, i, v = 256, 128, 688, 32000
    layer = [h * h, kv * h, kv * h, h * h, i * h, i * h, h * i, h, h]
    return [v * h, *layer * 8, h, v * h]


@pytest.mark.slow
@pytest.mark.parametrize("paged", [False, True])
def test_bitsandbytes_8bit_states_on_the_gpu_are_what_init_state_allocates(paged: bool) -> None:
    """bitsandbytes ``Optimizer2State.init_state``: fp32 states under 4096 elements, else uint8 states and an fp32
    absmax per 256 elements; ``get_state_buffer`` pages the states of parameters of 1e5 elements or more (not their
    absmax); plus the two 256-entry fp32 quantisation maps of the optimizer."""
    pytest.importorskip("transformers")
    from memsim_widget.trace.api import trace_config

    opt = "paged-adamw-8bit" if paged else "adamw-8bit"
    tr = trace_config(Scenario.from_dict(dict(TORCHTUNE_CASES)[f"llama L8 V32k bf16 ckpt {opt} b2 s512"]))
    expected = 2 * 256 * 4
    for n in _l8_parameters():
        if n < 4096:
            expected += 2 * 4 * n
        else:
            expected += 2 * 4 * -(-n // 256) + (0 if paged and n >= 100_000 else 2 * n)
    assert tr.model_state_bytes["optimizer_state"] == expected
