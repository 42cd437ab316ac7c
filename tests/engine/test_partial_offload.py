"""Partial activation offloading (``activation_offloading_layers``: the first N of L layers to the host).

The rule (``engine/step/timeline.partial_resident``) is TransformerEngine 2.9's schedule, what Megatron-Core's
``cpu_offloading_num_layers`` runs: while the loss runs the L - N layers not offloaded are on the GPU; from the
last layer's backward on, layer N-1 is being brought back too (L - N + 1); the host holds the N layers' sets.
N = 0 moves nothing (no offloading), N = L is every layer (today's torchtune rule, as unset).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget.cli import main
from memsim_widget.engine.caches.parts_cache import cached_activation_groups
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

BASE = {"model": "llama-3.2-1b", "seq_len": 1024, "micro_batch_size": 2}  # 16 layers
L = 16


def _sc(n: int | None, **extra: object) -> dict:
    return {**BASE, **extra, "activation_offloading": True, "activation_offloading_layers": n}


def _groups(data: dict) -> dict:
    ctx = Context(Scenario.from_dict(data))
    return cached_activation_groups(ctx, ctx.stages[0])


def _gpu_figures(data: dict) -> tuple:
    est = estimate(data)
    return (est.peak_allocated_bytes, est.peak_reserved_bytes, est.device_total_bytes, est.peak_phase,
            [(i.item, i.bytes, i.formula) for i in est.worst.items])  # fmt: skip


def test_zero_layers_is_no_offloading_on_the_gpu():
    assert _gpu_figures(_sc(0)) == _gpu_figures(BASE)
    assert estimate(_sc(0)).to_dict()["host_bytes"] == 0


def test_every_layer_is_todays_full_offloading():
    full = estimate({**BASE, "activation_offloading": True}).to_dict()
    every = estimate(_sc(L)).to_dict()
    assert every.pop("scenario")["activation_offloading_layers"] == L
    full.pop("scenario")
    assert every == full


def test_the_gpu_holds_the_layers_not_offloaded():
    # one layer's saved set: at N = L - 1 a single layer (not layer 0) is left on the GPU while the loss runs
    layer = _groups(_sc(L - 1))["saved_at_loss"].raw
    assert layer > 0
    for n in range(1, L):
        g = _groups(_sc(n))
        assert g["saved_at_loss"].raw == (L - n) * layer  # linear in the layers offloaded
        if n >= 2:  # at n = 1 the set brought back is layer 0's, which lacks the first layer's skipped terms
            assert (
                g["saved"].raw == (L - n + 1) * layer
            )  # ... and layer n-1 brought back at the top of backward


def test_the_host_holds_the_offloaded_layers():
    one = estimate(_sc(1)).to_dict()["host_bytes"]
    assert one > 0
    for n in (2, 5, L - 1):
        assert estimate(_sc(n)).to_dict()["host_bytes"] == n * one


def test_checkpointed_layers_offload_their_inputs():
    ckpt = {"activation_checkpointing": "full"}
    layer = _groups(_sc(L - 1, **ckpt))["saved_at_loss"].raw
    assert _groups(_sc(4, **ckpt))["saved_at_loss"].raw == (L - 4) * layer
    assert layer < _groups(_sc(L - 1))["saved_at_loss"].raw  # a layer's input, not its whole saved set


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(["gpt2", "llama-3.2-1b", "qwen2.5-0.5b"]),
    seq=st.sampled_from([256, 1024]),  # gpt2: at most 1024 positions
    mb=st.sampled_from([1, 2, 4]),
    ckpt=st.sampled_from(["none", "full", "selective"]),
    data=st.data(),
)
def test_more_layers_offloaded_never_take_more_gpu_memory(model, seq, mb, ckpt, data):
    base = {"model": model, "seq_len": seq, "micro_batch_size": mb, "activation_checkpointing": ckpt,
            "activation_offloading": True}  # fmt: skip
    layers = Context(Scenario.from_dict(base)).arch.num_layers
    a = data.draw(st.integers(0, layers))
    b = data.draw(st.integers(a, layers))
    low = estimate({**base, "activation_offloading_layers": a})
    high = estimate({**base, "activation_offloading_layers": b})
    assert high.peak_allocated_bytes <= low.peak_allocated_bytes
    assert high.to_dict()["host_bytes"] >= low.to_dict()["host_bytes"]


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (_sc(-1), "must be an integer >= 0"),
        (_sc(L + 1), f"at most the model's {L} layers"),
        ({**BASE, "activation_offloading_layers": 4}, "activation_offloading true only"),
        (_sc(4, parallel={"pp": 2}), "refuses pipeline parallelism"),
        (_sc(True), "must be an integer"),
    ],
)
def test_bad_layer_counts_name_the_field(data, text):
    with pytest.raises(ScenarioError) as err:
        Context(Scenario.from_dict(data))
    assert err.value.field == "activation_offloading_layers" and text in str(err.value)


def test_the_cli_takes_the_flag_and_refuses_a_bad_count_in_one_line(capsys):
    args = ["estimate", "--model", "llama-3.2-1b", "--activation-offloading", "true"]
    assert main([*args, "--activation-offloading-layers", "8", "--json"]) == 0
    assert '"activation_offloading_layers": 8' in capsys.readouterr().out
    code = main([*args, "--activation-offloading-layers", "17"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "activation_offloading_layers" in err
