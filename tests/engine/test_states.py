"""Model states per rank: exact bytes per precision recipe, optimizer, ZeRO stage and pipeline split."""

from __future__ import annotations

import math

import pytest

from memsim_widget.catalog.models import architecture_for
from memsim_widget.engine.core import estimate
from memsim_widget.engine.states import nf4_bytes
from memsim_widget.scenario import Scenario


def at(est, moment: str, rank: int = 0) -> dict[str, int]:
    """Tensor bytes per category at one moment of one rank."""
    r = est.ranks[rank]
    m = next(m for m in r.moments if m.name == moment)
    out: dict[str, int] = {}
    for i in m.items:
        if i.level == "tensor":
            out[i.category] = out.get(i.category, 0) + i.bytes
    return out


def run(model, **kw) -> object:
    return estimate(Scenario.from_dict({"model": model, "seq_len": 64, **kw}))


@pytest.mark.parametrize(
    ("precision", "weights", "grads", "states"),
    [
        ("fp32", 4, 4, 8),  # plain PyTorch: 16 B/param
        ("bf16", 2, 2, 4),  # pure bf16: Adam state in the parameter dtype, 8 B/param
        ("fp16", 2, 2, 4),
        ("amp-bf16", 4, 4, 8),  # autocast keeps fp32 weights, grads and states
        ("mixed-bf16", 2, 4, 4 + 8),  # Megatron: bf16 weights, fp32 main grads, fp32 master + m + v = 18 B
    ],
)
def test_bytes_per_parameter_per_recipe(tiny_llama, precision, weights, grads, states):
    n = architecture_for(tiny_llama).parameters
    step = at(run(tiny_llama, precision=precision), "optimizer_step")
    assert step["parameters"] == weights * n
    assert step["gradients"] == grads * n
    assert step["optimizer_states"] == states * n


def test_fp8_keeps_a_weight_and_transpose_cache_of_the_linears(tiny_llama):
    arch = architecture_for(tiny_llama)
    n = arch.parameters
    linear = sum(g.numel for g in arch.params if g.module and g.kind not in ("embedding", "head"))
    gemms = sum(g.count for g in arch.params if g.module and g.kind not in ("embedding", "head"))
    step = at(run(tiny_llama, precision="fp8"), "optimizer_step")
    # + delayed scaling's state: per GEMM 5 tensors x (1024 amax history rows + scale + inverse scale) x fp32
    assert step["parameters"] == 2 * n + 2 * linear + gemms * 5 * (1024 + 2) * 4
    assert step["gradients"] == 4 * n and step["optimizer_states"] == 12 * n


def test_seven_billion_pure_bf16_adamw_is_about_64_gib_at_the_step():
    est = estimate(Scenario(model="llama-2-7b", seq_len=128))
    n = est.parameters
    step = at(est, "optimizer_step")
    # weights 2 + grads 2 + Adam 4 + the foreach sqrt buffer 2 = 10 B/param
    assert step["parameters"] + step["gradients"] + step["optimizer_states"] == 8 * n
    assert step["temporaries"] == 2 * n
    assert 60 < (8 * n + 2 * n) / 2**30 < 66
    assert est.peak_phase == "optimizer_step"


@pytest.mark.parametrize(
    ("zero", "w_div", "g_div", "o_div"), [(0, 1, 1, 1), (1, 1, 1, 8), (2, 1, 8, 8), (3, 8, 8, 8)]
)
def test_zero_stages_divide_the_right_states_by_dp(zero, w_div, g_div, o_div):
    est = estimate(
        Scenario.from_dict(
            {
                "model": "llama-2-7b",
                "seq_len": 128,
                "precision": "mixed-bf16",
                "parallel": {"dp": 8, "zero": zero},
            }
        )
    )
    n = est.parameters
    step = at(est, "optimizer_step")
    assert step["optimizer_states"] == 12 * n // o_div
    grads = 4 * n // g_div
    if zero == 0:
        grads += 4 * n  # DDP's flat gradient buckets (gradient_as_bucket_view=False)
    assert step["gradients"] == grads
    assert step["parameters"] == 2 * n // w_div


def test_zero3_over_eight_gpus_holds_an_eighth_of_the_states():
    one = at(estimate(Scenario(model="llama-3.1-8b", seq_len=128)), "optimizer_step")
    eight = at(
        estimate(
            Scenario.from_dict({"model": "llama-3.1-8b", "seq_len": 128, "parallel": {"dp": 8, "zero": 3}})
        ),
        "optimizer_step",
    )
    for cat in ("parameters", "gradients", "optimizer_states"):
        assert eight[cat] * 8 == one[cat]


def test_pipeline_stages_split_layers_with_embedding_first_and_head_last(tiny_llama):
    arch = architecture_for(tiny_llama)
    h, v, i = 256, 1000, 688
    kv = 4 * 32
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * i + 2 * h
    est = run(tiny_llama, precision="fp32", parallel={"pp": 2})
    assert [r.stage.layers for r in est.ranks] == [2, 2]
    assert est.ranks[0].params_local == v * h + 2 * per_layer
    assert est.ranks[1].params_local == 2 * per_layer + h + v * h
    assert est.ranks[0].params_local + est.ranks[1].params_local == arch.parameters


def test_tensor_parallel_splits_matrices_and_keeps_norms(tiny_llama):
    """transformers' plan splits every Linear (the head too) and leaves norms and the untied embedding
    replicated; torchtitan's plan also splits the embedding on the vocabulary."""
    full = architecture_for(tiny_llama)
    norms = sum(g.numel for g in full.params if g.kind == "norm")
    embed = sum(g.numel for g in full.params if g.kind == "embedding")
    assert embed == full.vocab_size * full.hidden_size
    hf = run(tiny_llama, precision="fp32", parallel={"tp": 2})
    assert hf.ranks[0].params_local == (full.parameters - norms - embed) // 2 + norms + embed
    titan = run(tiny_llama, precision="fp32", framework="torchtitan", parallel={"tp": 2})
    assert titan.ranks[0].params_local == (full.parameters - norms) // 2 + norms


@pytest.mark.parametrize(
    ("optimizer", "per_param"), [("sgd", 0), ("sgd-momentum", 2), ("lion", 2), ("adamw", 4), ("adam", 4)]
)
def test_optimizer_state_sizes_in_pure_bf16(tiny_llama, optimizer, per_param):
    n = architecture_for(tiny_llama).parameters
    step = at(run(tiny_llama, optimizer=optimizer), "optimizer_step")
    assert step.get("optimizer_states", 0) == per_param * n


def test_adafactor_keeps_row_and_column_vectors(tiny_llama):
    arch = architecture_for(tiny_llama)
    expected = 0
    for g in arch.params:
        if len(g.shape) >= 2:
            expected += g.count * (g.shape[0] + g.shape[1]) * 2
        else:
            expected += g.count * g.shape[0] * 2
    step = at(run(tiny_llama, optimizer="adafactor", optimizer_impl="for-loop"), "optimizer_step")
    assert step["optimizer_states"] == expected


def test_eight_bit_adam_blocks_and_small_tensors(tiny_llama):
    arch = architecture_for(tiny_llama)
    expected = 0
    for g in arch.params:
        n = math.prod(g.shape)
        per = 2 * (n + 4 * math.ceil(n / 256)) if n >= 4096 else 2 * 4 * n
        expected += g.count * per
    step = at(run(tiny_llama, optimizer="adamw-8bit", optimizer_impl="fused"), "optimizer_step")
    assert step["optimizer_states"] == expected


def test_optimizer_step_temporaries_by_implementation(tiny_llama):
    arch = architecture_for(tiny_llama)
    n = arch.parameters
    largest = max(math.prod(g.shape) for g in arch.params)
    repeated = max(math.prod(g.shape) for g in arch.params if g.count >= 2)
    foreach = at(run(tiny_llama, optimizer_impl="foreach"), "optimizer_step")
    loop = at(run(tiny_llama, optimizer_impl="for-loop"), "optimizer_step")
    fused = at(run(tiny_llama, optimizer_impl="fused"), "optimizer_step")
    assert foreach["temporaries"] == 2 * n
    # per-tensor AdamW: 2 buffers of the tensor being updated, while the previous one's is still alive
    assert loop["temporaries"] == max(2 * largest, 3 * repeated) * 2
    assert "temporaries" not in fused


def test_adafactor_upcasts_the_tensor_being_updated(tiny_llama):
    arch = architecture_for(tiny_llama)
    largest = max(math.prod(g.shape) for g in arch.params)
    step = at(run(tiny_llama, optimizer="adafactor", optimizer_impl="for-loop"), "optimizer_step")
    assert step["temporaries"] == 4 * 4 * largest  # grad, param, grad^2 + eps, update in fp32


def test_lora_trains_only_adapters(tiny_llama):
    arch = architecture_for(tiny_llama)
    r = 8
    h, kv = 256, 128
    adapters = 4 * ((h + h) * r + (h + kv) * r)  # q_proj (h->h) and v_proj (h->kv) in 4 layers
    est = run(tiny_llama, method="lora", lora={"rank": r, "targets": ["q_proj", "v_proj"]})
    assert est.trainable_parameters == adapters
    step = at(est, "optimizer_step")
    assert step["gradients"] == 4 * adapters  # fp32 adapters (peft default)
    assert step["optimizer_states"] == 8 * adapters
    assert step["parameters"] == 2 * arch.parameters + 4 * adapters


def test_qlora_stores_linear_weights_in_nf4(tiny_llama):
    arch = architecture_for(tiny_llama)
    est = run(tiny_llama, method="qlora", lora={"targets": ["all-linear"]})
    linear = [
        g for g in arch.params if g.module and g.kind not in ("head", "embedding") and len(g.shape) == 2
    ]
    nf4 = sum(nf4_bytes(math.prod(g.shape)) * g.count for g in linear)
    other = sum(g.numel for g in arch.params if g not in linear)
    adapters = est.trainable_parameters
    step = at(est, "optimizer_step")
    assert step["parameters"] == nf4 + 2 * other + 4 * adapters
    assert nf4_bytes(64 * 256) == 64 * 256 // 2 + 256 + 4 + 4


def test_gradients_live_through_forward_only_with_accumulation(tiny_llama):
    one = at(run(tiny_llama), "forward_end")
    two = at(run(tiny_llama, grad_accum_steps=2), "forward_end")
    assert "gradients" not in one
    assert two["gradients"] == 2 * architecture_for(tiny_llama).parameters


def test_first_step_peaks_lower_than_steady_state(tiny_llama):
    est = run(tiny_llama, seq_len=4096)
    r = est.ranks[0]
    assert r.step1_peak_allocated_bytes < r.peak_allocated_bytes


def test_offload_moves_optimizer_states_to_host():
    est = estimate(
        Scenario.from_dict(
            {"model": "llama-2-7b", "seq_len": 128, "parallel": {"dp": 2, "zero": 2, "offload": "optimizer"}}
        )
    )
    assert "optimizer_states" not in at(est, "optimizer_step")
    assert est.ranks[0].host_bytes >= 4 * est.parameters // 2
