"""fp8 training recipes (``fp8_recipe``, memsim_widget/fp8.py): the scenario key, the quantised weight copies each
recipe keeps, and the step time's Linear matmuls at the card's fp8 (fp4) peak, held to published fp8 runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memsim_widget.architecture import build_architecture
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.speed.step_time import step_parts
from memsim_widget.engine.speed.time_breakdown import context_time_model
from memsim_widget.errors import ScenarioError
from memsim_widget.fidelity_speed import DATA, _model, load
from memsim_widget.fp8 import FP8_RECIPES
from memsim_widget.scenario import Scenario

TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 1000}  # fmt: skip
FP8_DATA = DATA.parent / "fp8.csv"


def _at_step(sc: Scenario, moment: str = "optimizer_step") -> dict[str, int]:
    est = estimate(sc)
    step = next(m for m in est.worst.moments if m.name == moment)
    return {i.item: i.bytes for i in step.items}


def test_an_unknown_recipe_is_one_error_naming_the_field() -> None:
    with pytest.raises(ScenarioError) as e:
        Scenario.from_dict({"model": TINY, "fp8_recipe": "fp6"})
    assert e.value.field == "fp8_recipe" and "tensorwise" in str(e.value)


def test_a_recipe_needs_a_bf16_compute_precision() -> None:
    with pytest.raises(ScenarioError) as e:
        Scenario.from_dict({"model": TINY, "precision": "fp32", "fp8_recipe": "tensorwise"})
    assert e.value.field == "fp8_recipe" and "fp32" in str(e.value)


def test_precision_fp8_alone_is_transformer_engines_delayed_scaling() -> None:
    sc = Scenario.from_dict({"model": TINY, "precision": "fp8"})
    assert sc.fp8 is FP8_RECIPES["te-delayed"] and "fp8_recipe" not in sc.to_dict()
    assert Scenario.from_dict({"model": TINY}).fp8 is None
    assert Scenario.from_dict({"model": TINY, "fp8_recipe": "rowwise"}).to_dict()["fp8_recipe"] == "rowwise"


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchao_float8_keeps_the_bf16_steps_bytes(recipe: str) -> None:
    """torchao saves the bf16 input and weight and recasts in backward (traced: tests/trace/test_trace_fp8.py)."""
    base = {"model": TINY, "micro_batch_size": 2, "seq_len": 512}
    for precision in ("bf16", "mixed-bf16", "fp8"):
        plain = estimate(
            Scenario.from_dict({**base, "precision": "mixed-bf16" if precision == "fp8" else precision})
        )
        fp8 = estimate(Scenario.from_dict({**base, "precision": precision, "fp8_recipe": recipe}))
        assert fp8.peak_tensor_bytes == plain.peak_tensor_bytes


@pytest.mark.parametrize(
    ("recipe", "per_weight"),
    [("te-delayed", 2.0), ("te-current", 2.0), ("mxfp8", 2 * (1 + 1 / 32)), ("nvfp4", 2 * (0.5 + 1 / 16))],
)
def test_transformer_engine_keeps_both_orientations_of_each_linear_weight(
    recipe: str, per_weight: float
) -> None:
    arch = build_architecture(TINY)
    linear = sum(g.numel for g in arch.params if g.module and g.kind not in ("embedding", "head"))
    items = _at_step(Scenario.from_dict({"model": TINY, "precision": "fp8", "fp8_recipe": recipe}))
    cache = {k: v for k, v in items.items() if "cache" in k}
    assert list(cache.values()) == [int(linear * per_weight + 0.999999)]


def test_only_the_linears_run_at_the_fp8_peak() -> None:
    """Attention and the head stay at the bf16 peak: an fp8 step is faster, but not twice as fast."""
    base = {"model": "llama-3.1-8b", "seq_len": 8192, "parallel": {"dp": 8, "zero": 3}}
    bf16 = estimate(Scenario.from_dict(base)).tokens_per_second_per_gpu
    fp8 = estimate(Scenario.from_dict({**base, "fp8_recipe": "tensorwise"})).tokens_per_second_per_gpu
    assert 1.2 < fp8 / bf16 < 2.0
    # a card without fp8 tensor cores runs the recipe's matmuls at its 16-bit peak
    ctx = Context(Scenario.from_dict({**base, "gpu": "a100-80gb", "fp8_recipe": "tensorwise"}))
    k = context_time_model(ctx)
    assert k.linear_peak_flops == k.peak_flops == 312e12


def test_published_nvidia_fp8_runs_within_15_percent() -> None:
    """NeMo / Megatron-Bridge fp8 rows on H100, B200 and GB200 (data/throughput/fp8.csv, development rows, nothing
    fitted): before the fp8 peak they were 24-40% slow. The GB200 70B FSDP row's 64 GPUs share one NVLink domain
    (a GB200 NVL72 rack's 72, catalog/gpus.json)."""
    rows = [r for r in load(FP8_DATA) if r.source != "torchtitan"]
    assert len(rows) == 9
    for r in rows:
        k, cols = _model(r)
        after = float(step_parts(k, cols)["tokens_per_gpu_s"]) / r.published - 1
        before = float(
            step_parts(replace(k, linear_peak_flops=k.peak_flops, fp8_cast_bytes=0.0), cols)[
                "tokens_per_gpu_s"
            ]
        )
        assert abs(after) < 0.15, (r.row_id, after)
        assert before / r.published - 1 < -0.2, r.row_id


def _cast_seconds(sc: Scenario) -> float:
    from memsim_widget.engine.speed.time_breakdown import step_time

    return next(i.seconds for i in step_time(Context(sc)).items if i.item == "torchao float8 casts")


def test_torchao_pays_its_cast_traffic_by_hand_transformer_engine_does_not() -> None:
    """5 B per element cast: 1.5 x (in + out) features per token and layer, every weight twice per micro-batch."""
    base = {"model": TINY, "micro_batch_size": 2, "seq_len": 512}
    sc = Scenario.from_dict({**base, "fp8_recipe": "tensorwise"})
    k = context_time_model(Context(sc))
    tokens, layers = 2 * 512, 4
    by_hand = (tokens * layers * 1.5 * k.flops.io_per_layer + layers * k.flops.linear_per_layer) * 5.0
    assert _cast_seconds(sc) == pytest.approx(by_hand / (k.speed.hbm_gb_s * 1e9 * 0.8), rel=1e-12)
    assert _cast_seconds(Scenario.from_dict({**base, "fp8_recipe": "tensorwise", "compile": True})) == (
        pytest.approx(_cast_seconds(sc) / 2, rel=1e-12)
    )
    assert _cast_seconds(Scenario.from_dict({**base, "precision": "fp8", "fp8_recipe": "te-current"})) == 0.0
    assert _cast_seconds(Scenario.from_dict(base)) == 0.0


def test_fp8_all_gather_is_torchaos_tensorwise_under_zero3_only() -> None:
    base = {"model": TINY, "fp8_recipe": "tensorwise", "parallel": {"dp": 2, "zero": 3}}
    assert Scenario.from_dict({**base, "fp8_all_gather": True}).to_dict()["fp8_all_gather"] is True
    assert "fp8_all_gather" not in Scenario.from_dict(base).to_dict()  # unset: off, torchtitan's default
    for bad, words in (
        ({"fp8_all_gather": "yes"}, "true or false"),
        ({"fp8_all_gather": True, "fp8_recipe": "rowwise"}, "tensorwise"),
        ({"fp8_all_gather": True, "parallel": {"dp": 2, "zero": 1}}, "ZeRO-3"),
    ):
        with pytest.raises(ScenarioError) as e:
            Scenario.from_dict({**base, **bad})
        assert e.value.field == "fp8_all_gather" and words in str(e.value)


@pytest.mark.parametrize("recipe", ["te-current", "te-delayed"])
def test_fp8_all_gather_under_megatron_is_fsdps_fp8_param_gather(recipe: str) -> None:
    """Megatron FSDP gathers TransformerEngine fp8 parameters (Megatron-Bridge's current-scaling recipe sets
    ``fp8_param_gather``); other frameworks gather only torchao's tensorwise weights in fp8."""
    base = {"model": TINY, "precision": "fp8", "fp8_recipe": recipe, "parallel": {"dp": 2, "zero": 3}}
    assert (
        Scenario.from_dict({**base, "framework": "megatron", "fp8_all_gather": True}).fp8_all_gather is True
    )
    for bad, words in (({"framework": "hf"}, "tensorwise"), ({"framework": "megatron", "fp8_recipe": "mxfp8"},
                       "te-current")):  # fmt: skip
        with pytest.raises(ScenarioError) as e:
            Scenario.from_dict({**base, **bad, "fp8_all_gather": True})
        assert e.value.field == "fp8_all_gather" and words in str(e.value)


def test_megatron_fp8_params_keep_no_whole_model_cache_only_the_gathered_units_transpose() -> None:
    """With fp8 parameters there is no bf16 weight to quantise, so TransformerEngine's whole-model fp8 weight and
    transpose cache (2 B per Linear element) is gone; the gathered unit holds each Linear element in fp8 plus the
    transpose Megatron FSDP makes before the unit's backward (1 + 1 B, instead of 2 B bf16): same bytes there."""
    base = {"model": TINY, "framework": "megatron", "precision": "fp8", "fp8_recipe": "te-current",
            "micro_batch_size": 2, "seq_len": 512, "parallel": {"dp": 2, "zero": 3}}  # fmt: skip
    arch = build_architecture(TINY)
    linear = sum(g.numel for g in arch.params if g.module and g.kind not in ("embedding", "head"))
    off, on = (
        _at_step(Scenario.from_dict({**base, "fp8_all_gather": v}), "backward_top") for v in (False, True)
    )
    assert off["fp8 weight and transpose cache"] == 2 * linear
    assert "fp8 weight and transpose cache" not in on
    layer_tensors = sum(g.count for g in arch.params if g.scope == "layer" and g.module) // 4
    gathered = "FSDP2 all-gather output of the last unit (held until the next all-gather)"
    assert on[gathered] - off[gathered] == layer_tensors * 4  # the fp32 scale of each gathered fp8 weight


def test_fp8_all_gather_gathers_each_layers_linear_weights_in_one_byte() -> None:
    """FSDP2's unit of a layer while gathered: its Linear weights at 1 B (+ a 4 B scale each) instead of 2 B, its
    norms as before. On the small Llama (dp=2, b2 s512) the trace drops by 724,852 B (benchmarks/fp8_all_gather.py,
    72,958,500 -> 72,233,648); this rule by 724,964 (112 B of FSDP2's all-gather padding not counted)."""
    base = {"model": TINY, "micro_batch_size": 2, "seq_len": 512, "fp8_recipe": "tensorwise",
            "parallel": {"dp": 2, "zero": 3}}  # fmt: skip
    arch = build_architecture(TINY)
    lin = sum(g.numel for g in arch.params if g.scope == "layer" and g.module) // 4
    tensors = sum(g.count for g in arch.params if g.scope == "layer" and g.module) // 4
    off = estimate(Scenario.from_dict(base)).peak_tensor_bytes
    on = estimate(Scenario.from_dict({**base, "fp8_all_gather": True})).peak_tensor_bytes
    assert off - on == lin * (2 - 1) - tensors * 4


def test_fp8_all_gather_halves_the_gathered_linear_bytes_in_the_step_time() -> None:
    base = {
        "model": "llama-3.1-8b",
        "seq_len": 8192,
        "fp8_recipe": "tensorwise",
        "parallel": {"dp": 64, "zero": 3},
    }
    k16 = context_time_model(Context(Scenario.from_dict(base)))
    k8 = context_time_model(Context(Scenario.from_dict({**base, "fp8_all_gather": True})))
    arch = Context(Scenario.from_dict(base)).arch
    lin = sum(g.numel for g in arch.params if g.scope == "layer" and g.module)
    assert (k16.fetch_bytes - k8.fetch_bytes) * arch.parameters == pytest.approx(lin * (2 - 1), rel=1e-12)


@pytest.mark.parametrize(
    ("recipe", "rows"), [("te-delayed", 1024 + 2), ("te-current", 2), ("mxfp8", 0), ("nvfp4", 0)]
)
def test_transformer_engine_keeps_each_gemms_scaling_state(recipe: str, rows: int) -> None:
    """Delayed scaling: an fp32 amax history of 1024 rows (DelayedScaling's default) plus scale and inverse scale
    for the 3 forward and 2 backward tensors of every GEMM; current scaling: scale and amax only; block scales
    live beside the data (the weight caches)."""
    arch = build_architecture(TINY)
    gemms = sum(g.count for g in arch.params if g.module and g.kind not in ("embedding", "head"))
    items = _at_step(Scenario.from_dict({"model": TINY, "precision": "fp8", "fp8_recipe": recipe}))
    state = items.get("fp8 scaling state (amax history, scales)", 0)
    assert state == gemms * 5 * rows * 4
    assert "fp8 scaling state (amax history, scales)" not in _at_step(
        Scenario.from_dict({"model": TINY, "fp8_recipe": "tensorwise"})
    )


@pytest.mark.parametrize(
    ("recipe", "q"), [("te-current", 1.0), ("mxfp8", 1 + 1 / 32), ("nvfp4", 0.5 + 1 / 16)]
)
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_transformer_engine_saves_its_linear_inputs_quantised(
    recipe: str, q: float, sp: bool, attention: str
) -> None:
    """TE's ``_Linear.forward`` saves the quantised input: Korthikanti's QKV, fc1 (h wide) and fc2 (I wide) inputs
    at ``q`` B instead of 2 B; without sequence parallelism the QKV and fc1 inputs are replicated over the
    tensor-parallel ranks. The projection's input is the attention output: flash attention keeps that in bf16 for
    its own backward, so the quantised copy adds ``q`` B x h/t; with eager attention the copy replaces it."""
    from memsim_widget.engine.activations.megatron import megatron_activations

    base = {"model": TINY, "micro_batch_size": 2, "seq_len": 512, "framework": "megatron", "precision": "fp8",
            "attention": attention, "parallel": {"tp": 2, "sequence_parallel": sp}}  # fmt: skip
    plain = megatron_activations(Context(Scenario.from_dict({**base, "precision": "mixed-bf16"}))).per_layer[
        0
    ]
    fp8 = megatron_activations(Context(Scenario.from_dict({**base, "fp8_recipe": recipe}))).per_layer[0]
    h, i, t, sb = 256, 688, 2, 2 * 512
    wide = (2 * h + i) / t if sp else 2 * h + i / t
    proj = -q * h / t if attention == "sdpa" else (2 - q) * h / t
    assert plain.bytes - fp8.bytes == pytest.approx((2 - q) * sb * wide + sb * proj, rel=1e-12)
    assert recipe in fp8.name
