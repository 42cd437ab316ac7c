"""One tensor-parallel rank traced with PyTorch's DTensor plans on fake tensors (memsim_widget.trace.tp_plan).

Expected bytes come from the config arithmetic of the small Llama of ``fidelity_cases`` (tests/data) (h=256,
I=688, 8 heads of 32, 4 kv heads, 4 layers, V=1000), never from the tracer.
"""

from __future__ import annotations

from typing import Any

import pytest
from fidelity_cases import LLAMA, MIXTRAL, QWEN2

from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from memsim_widget.trace import distributed, tp_plan  # noqa: E402
from memsim_widget.trace.api import trace_scenario  # noqa: E402

#: Every test here runs a real trace on fake tensors: behind the slow marker (scripts/dev test runs it).
pytestmark = pytest.mark.slow

BF16, FP32 = 2, 4
B, S = 2, 256
H, I, V, L = LLAMA["hidden_size"], LLAMA["intermediate_size"], LLAMA["vocab_size"], LLAMA["num_hidden_layers"]
Q = LLAMA["num_attention_heads"] * (H // LLAMA["num_attention_heads"])  # q/o width: heads x head dim
KV = LLAMA["num_key_value_heads"] * (H // LLAMA["num_attention_heads"])


def scenario(model: dict = LLAMA, **keys: Any) -> Scenario:
    """The small model at b2 s256 bf16 with the given keys (``parallel`` among them)."""
    return Scenario.from_dict({"model": model, "micro_batch_size": B, "seq_len": S, **keys})


def trace_keeping_model(sc: Scenario, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, torch.nn.Module]:
    """Trace rank 0 of ``sc`` and keep the parallelised model (to find its parameters' storages)."""
    kept: list[torch.nn.Module] = []
    orig = distributed.parallelize

    def keep(model: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        orig(model, *args, **kwargs)
        kept.append(model)

    monkeypatch.setattr(distributed, "parallelize", keep)
    return trace_scenario(sc, rank=0), kept[0]


def bytes_at_zero_grad(result: Any, weight: torch.Tensor) -> tuple[str, int]:
    """(role, bytes) the tracker holds for the storage of ``weight``'s local shard just before zero_grad."""
    tracker = result.tracker
    seq = tracker.mark_seq(result.peak_step, "zero_grad") - 1
    storage = getattr(weight, "_local_tensor", weight).untyped_storage()
    (rec,) = [r for r in tracker.alive_at(seq) if r.ref is not None and r.ref() is storage]
    return tracker.final_role(rec), rec.nbytes


def layer_params_per_rank(tp: int) -> int:
    """One decoder layer's parameters on a tp rank: q, k, v, o and the SwiGLU MLP split, two norms whole."""
    return (H * Q + 2 * H * KV + Q * H + 3 * H * I) // tp + 2 * H


@pytest.mark.parametrize("tp", [2, 4])
def test_hf_plan_splits_attention_and_mlp_weights_by_tp(tp: int, monkeypatch: pytest.MonkeyPatch) -> None:
    result, model = trace_keeping_model(scenario(parallel={"tp": tp}), monkeypatch)
    for layer in model.model.layers:
        assert bytes_at_zero_grad(result, layer.self_attn.q_proj.weight) == ("parameter", Q * H // tp * BF16)
        assert bytes_at_zero_grad(result, layer.self_attn.o_proj.weight) == ("parameter", H * Q // tp * BF16)
        assert bytes_at_zero_grad(result, layer.mlp.gate_proj.weight) == ("parameter", I * H // tp * BF16)
    # transformers' plan leaves the embedding and the norms whole and splits the LM head on the vocabulary.
    expected = (L * layer_params_per_rank(tp) + H + V * H + V * H // tp) * BF16
    assert result.model_state_bytes["parameter"] == expected
    assert result.model_state_bytes["gradient"] == expected
    assert result.world_size == tp and "tensor-parallel rank 0" in result.rank_role


def norm_fp32_activation_bytes(result: Any) -> int:
    """fp32 bytes made inside the RMSNorms of step 2's forward and still alive when its backward starts
    (each norm's fp32 upcast of its input and its rsqrt, saved for the norm's backward)."""
    tracker = result.tracker
    seq = tracker.mark_seq(2, "backward")
    return sum(
        r.nbytes
        for r in tracker.alive_at(seq)
        if r.step == 2
        and r.module.endswith("layernorm")
        and r.dtype == "float32"
        and tracker.final_role(r) == "activation"
    )


def test_sequence_parallel_divides_the_saved_norm_activations_by_tp() -> None:
    tp = 4
    plain = trace_scenario(scenario(parallel={"tp": tp}), rank=0)
    sp = trace_scenario(scenario(parallel={"tp": tp, "sequence_parallel": True}), rank=0)
    full, split = norm_fp32_activation_bytes(plain), norm_fp32_activation_bytes(sp)
    # Without SP every rank's 2L norms see all T = b x s tokens: a T x h fp32 copy and a T x 1 rsqrt each.
    assert full == 2 * L * (B * S * H + B * S) * FP32
    assert 0.99 * tp <= full / split <= tp
    assert sp.peak_bytes < plain.peak_bytes


def test_torchtitan_loss_parallel_keeps_the_logits_sharded_on_the_vocabulary() -> None:
    tp = 2
    result = trace_scenario(
        scenario(framework="torchtitan", parallel={"tp": tp, "sequence_parallel": True}), rank=0
    )
    shapes = [tuple(t["shape"]) for t in result.top]
    assert (B * S, V // tp) in shapes, "the fp32 loss tensors are T x V/tp"
    assert all(V not in s for s in shapes), "no rank holds a full-vocabulary tensor"
    # torchtitan's plan splits the embedding on the vocabulary too.
    expected = (L * layer_params_per_rank(tp) + H + 2 * V * H // tp) * BF16
    assert result.model_state_bytes["parameter"] == expected


def test_hf_plan_gathers_full_fp32_logits_on_every_rank() -> None:
    result = trace_scenario(scenario(parallel={"tp": 2}), rank=0)
    assert {"shape": [B * S, V], "dtype": "float32"}.items() <= result.top[0].items()


def test_tied_embeddings_stay_one_parameter_split_on_the_vocabulary() -> None:
    tp = 2
    result = trace_scenario(scenario(QWEN2, parallel={"tp": tp}), rank=0)
    qkv_bias = (Q + 2 * KV) // tp
    expected = (L * (layer_params_per_rank(tp) + qkv_bias) + H + V * H // tp) * BF16
    assert result.model_state_bytes["parameter"] == expected


def test_two_d_fsdp_over_tp_halves_every_tp_shard() -> None:
    tp_only = trace_scenario(scenario(parallel={"tp": 2}), rank=0)
    two_d = trace_scenario(scenario(parallel={"dp": 2, "tp": 2, "zero": 3}), rank=0)
    # Every local tp shard of the small Llama has an even first dimension, so FSDP2 pads nothing.
    assert two_d.model_state_bytes["parameter"] == tp_only.model_state_bytes["parameter"] // 2
    assert two_d.world_size == 4 and "FSDP shard 0 of 2" in two_d.rank_role


def test_framework_picks_the_plan_style() -> None:
    assert tp_plan.tp_style_for(scenario(parallel={"tp": 2})) == ("hf", False)
    assert tp_plan.tp_style_for(scenario(framework="torchtitan", parallel={"tp": 2})) == ("torchtitan", True)
    with pytest.raises(ScenarioError) as err:
        tp_plan.tp_style_for(scenario(framework="megatron", parallel={"tp": 2}))
    assert err.value.field == "framework"


def test_megatron_tp_trace_is_refused_naming_the_framework() -> None:
    with pytest.raises(ScenarioError) as err:
        trace_scenario(scenario(framework="megatron", parallel={"tp": 2}), rank=0)
    assert err.value.field == "framework"


def test_unknown_style_is_refused_naming_the_framework() -> None:
    with pytest.raises(ScenarioError) as err:
        tp_plan.apply_tensor_parallel(
            torch.nn.Linear(2, 2), None, sequence_parallel=False, loss_parallel=False, style="megatron"
        )
    assert err.value.field == "framework" and "hf, torchtitan" in str(err.value)


def test_tp_that_splits_a_kv_head_is_refused() -> None:
    with pytest.raises(ScenarioError) as err:
        trace_scenario(scenario(parallel={"tp": 8}), rank=0)
    assert err.value.field == "parallel.tp" and "4 key/value heads" in str(err.value)


def test_mixtral_packed_expert_plan_is_refused() -> None:
    with pytest.raises(ScenarioError) as err:
        trace_scenario(scenario(MIXTRAL, parallel={"tp": 2}), rank=0)
    assert err.value.field == "parallel.tp" and "packed_colwise" in str(err.value)


def test_loss_parallel_kernels_temporaries_are_traced() -> None:
    """torch's loss-parallel kernels run inside DTensor's dispatch, where a dispatch mode is off
    (``tp_plan.local_loss_kernels_seen`` pushes the tracker back): the trace sees ``_log_softmax``'s
    ``x - x_max`` and its ``exp``, and in backward ``zeros_like``, ``exp`` and their sum alive at once with the
    saved log-softmax: four fp32 T x V/tp (torch 2.13.0 ``tensor/parallel/loss.py``)."""
    tp = 2
    result = trace_scenario(scenario(framework="torchtitan", parallel={"tp": tp}), rank=0)
    tracker = result.tracker
    big = [r for r in tracker.records if r.step == 2 and tuple(r.shape) == (B * S, V // tp)]
    assert all(r.nbytes == B * S * (V // tp) * FP32 for r in big if str(r.dtype) == "torch.float32")
    made = [(r.phase, r.op) for r in big]
    assert [op for phase, op in made if phase == "loss"] == ["_to_copy", "sub", "exp", "sub"]
    assert [op for phase, op in made if phase == "backward"][:4] == ["zeros_like", "exp", "add", "mul"]
    add = next(r for r in big if r.phase == "backward" and r.op == "add")
    alive = {(r.phase, r.op) for r in tracker.alive_at(add.alloc_seq) if r in big}
    assert alive == {("loss", "sub"), ("backward", "zeros_like"), ("backward", "exp"), ("backward", "add")}
