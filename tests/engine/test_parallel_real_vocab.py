"""Rules that real vocabularies exposed in traces of PyTorch's own FSDP2 and DTensor code (docs/fidelity-parallel.md,
the V32k-V256k rows): exact bytes from Llama 3.1 8B's shapes (h 4096, V 128,256, 32 layers)."""

from __future__ import annotations

from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.states import model_states
from memsim_widget.scenario import Scenario

H, V, L, I, KV = 4096, 128256, 32, 14336, 1024
LAYER = 2 * H * H + 2 * KV * H + 3 * I * H + 2 * H  # q, o, k, v, gate/up/down, two norms
ROOT = 2 * V * H + H  # embedding, head, final norm


def _states(data: dict, stage: int = 0):
    ctx = Context(Scenario.from_dict({"model": "llama-3.1-8b", **data}))
    return model_states(ctx, ctx.stages[stage])


def test_fsdp2_root_reduce_scatter_holds_unsharded_grads_and_the_reduce_input():
    # torchtitan mixed precision: bf16 unsharded gradients, fp32 reduce-scatter input and gradient shards
    st = _states({"precision": "amp-bf16", "framework": "torchtitan", "parallel": {"dp": 4, "zero": 3}})
    assert [i.bytes for i in st.root_reduce] == [ROOT * 2, ROOT * 4]
    all_grads = sum(i.bytes for i in st.grads)
    assert all_grads == (L * LAYER + ROOT) * 4 // 4
    assert sum(i.bytes for i in st.grads_but_root) == all_grads - ROOT * 4 // 4


def test_the_root_reduce_scatter_is_the_peak_of_fsdp2_at_a_real_vocabulary_with_few_layers():
    model = {
        "model_type": "llama", "hidden_size": H, "intermediate_size": I, "num_hidden_layers": 2,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": V, "tie_word_embeddings": False,
    }  # fmt: skip
    sc = {"model": model, "micro_batch_size": 1, "seq_len": 1024, "precision": "amp-bf16"}
    est = estimate(Scenario.from_dict({**sc, "framework": "torchtitan", "parallel": {"dp": 4, "zero": 3}}))
    assert est.worst.peak_phase == "root_reduce_scatter"


def test_no_root_reduce_scatter_without_fsdp():
    assert _states({"parallel": {"dp": 4}}).root_reduce == []
    assert _states({"parallel": {"tp": 2}}).root_reduce == []


def test_transformers_plan_steps_split_and_plain_parameters_as_two_foreach_groups():
    # the untied embedding and every norm stay plain tensors under base_model_tp_plan; the rest is split by 2
    st = _states({"precision": "bf16", "parallel": {"tp": 2}})
    plain = V * H + 2 * L * H + H
    split = (L * (LAYER - 2 * H) + V * H) // 2
    (temp,) = st.step_temps
    assert temp.bytes == max(split, plain) * 2


def test_one_foreach_group_when_fsdp_makes_every_parameter_a_dtensor():
    st = _states({"precision": "bf16", "parallel": {"tp": 2, "dp": 2, "zero": 3}})
    n = sum(i.bytes for i in st.grads) // 2  # gradient shards, 2 B each
    (temp,) = st.step_temps
    assert temp.bytes == n * 2


def test_vocab_sharded_embedding_keeps_a_full_vocabulary_partial_gradient_without_fsdp():
    tt = {"precision": "amp-bf16", "framework": "torchtitan"}
    st = _states({**tt, "parallel": {"tp": 4, "sequence_parallel": True}})
    extra = [i for i in st.grads if "Partial" in i.item]
    assert [i.bytes for i in extra] == [V // 4 * H * 3 * 4]  # (tp - 1) shards of fp32 gradient
    assert not any("Partial" in i.item for i in st.grads_but_bottom)  # made by the embedding's backward
    # FSDP2 redistributes it; transformers' plan leaves the untied embedding whole; the last stage has none
    assert not any(
        "Partial" in i.item for i in _states({**tt, "parallel": {"tp": 4, "dp": 2, "zero": 3}}).grads
    )
    assert not any("Partial" in i.item for i in _states({"parallel": {"tp": 4}}).grads)
    last = _states({**tt, "parallel": {"tp": 2, "pp": 2}}, stage=1)
    assert not any("Partial" in i.item for i in last.grads)


def test_fsdp2_root_regathered_for_backward_holds_the_unsharded_root_and_its_all_gather_output():
    st = _states({"precision": "bf16", "parallel": {"dp": 4, "zero": 3}})
    assert [i.bytes for i in st.root_regather] == [ROOT * 2, ROOT * 2]
    kept = _states({"precision": "bf16", "parallel": {"dp": 4, "zero": 3, "reshard_after_forward": False}})
    assert kept.root_regather == []  # the root stays gathered from its forward to its backward


def test_dp_x_tp_root_reduce_scatter_output_beside_one_unsharded_root_gradient():
    tt = {"precision": "amp-bf16", "framework": "torchtitan"}
    st = _states({**tt, "parallel": {"dp": 2, "tp": 2, "zero": 3, "sequence_parallel": True}})
    root = 2 * (V // 2) * H + H  # embedding and head split by tp (vocab), the final norm whole
    assert [i.bytes for i in st.root_reduce_out] == [root * 4, root * 4 // 2, V // 2 * H * 2]
    assert _states({**tt, "parallel": {"dp": 4, "zero": 3}}).root_reduce_out == []


def test_a_schedule_that_returns_outputs_keeps_every_micro_batch_logits_and_their_concatenation():
    from memsim_widget.engine.parallel.pipeline import outputs_held, outputs_through_step

    data = {"model": "llama-3.1-8b", "parallel": {"pp": 2, "pp_microbatches": 4}}
    ctx = Context(Scenario.from_dict({**data, "output_lifetime": "step"}))
    first, last = ctx.stages
    assert outputs_held(ctx, last, True) == 4 and outputs_through_step(ctx, last, True) == 8
    assert outputs_through_step(ctx, first, True) == 0
    # torchtitan's return_outputs=False (and HF's default lifetime): one output until its backward
    plain = Context(Scenario.from_dict(data))
    assert (
        outputs_held(plain, plain.stages[1]) == 1 and outputs_through_step(plain, plain.stages[1], False) == 0
    )
    est = estimate(Scenario.from_dict({**data, "output_lifetime": "step", "seq_len": 1024}))
    step = next(m for m in est.ranks[1].moments if m.name == "optimizer_step")
    logits = [i for i in step.items if "micro-batch outputs" in i.formula]
    assert sum(i.bytes for i in logits) == 8 * 2 * 1024 * V  # bf16 logits of b=1 x s=1024, 8 copies
