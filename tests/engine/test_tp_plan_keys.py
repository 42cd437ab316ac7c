"""``parallel.tp_plan`` and ``parallel.loss_parallel``: the framework's plan unless set, so hybrids (an HF model under a
torchtitan-shaped DTensor plan, torchtitan without loss parallel) can be said; impossible combinations refused."""

from __future__ import annotations

import pytest

from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.frameworks import embedding_split, loss_parallel, tp_plan, vocab_split
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario


def _ctx(framework: str = "hf", **par) -> Context:
    return Context(
        Scenario.from_dict({"model": "llama-3.1-8b", "framework": framework, "parallel": {"tp": 2, **par}})
    )


@pytest.mark.parametrize(
    ("framework", "par", "plan", "vocab", "emb", "lp"),
    [
        ("hf", {}, "hf", False, False, False),  # transformers' plan: full logits, replicated embedding
        ("torchtitan", {}, "torchtitan", True, True, True),
        ("megatron", {}, "megatron", True, True, False),  # vocab-parallel, but Megatron's own kernel
        ("hf", {"tp_plan": "torchtitan"}, "torchtitan", True, True, True),  # the hybrid
        ("torchtitan", {"loss_parallel": False}, "torchtitan", False, True, False),  # logits gathered
        ("hf", {"tp_plan": "torchtitan", "loss_parallel": False}, "torchtitan", False, True, False),
    ],
)
def test_the_plan_and_loss_parallel_resolve_from_the_keys_else_the_framework(
    framework, par, plan, vocab, emb, lp
):
    ctx = _ctx(framework, **par)
    assert (tp_plan(ctx.scenario), vocab_split(ctx), embedding_split(ctx), loss_parallel(ctx.scenario)) == (
        plan,
        vocab,
        emb,
        lp,
    )


def test_the_hybrid_estimates_like_torchtitans_plan_for_the_vocabulary():
    hybrid = estimate(_ctx("hf", tp_plan="torchtitan").scenario)
    plain = estimate(_ctx("hf").scenario)
    # the vocab-sharded embedding holds half the embedding's weights of the replicated one
    emb = 128256 * 4096
    assert plain.ranks[0].params_local - hybrid.ranks[0].params_local == emb // 2


@pytest.mark.parametrize(
    ("framework", "par", "field"),
    [
        ("hf", {"loss_parallel": True}, "parallel.loss_parallel"),  # the hf plan gathers the logits
        ("megatron", {"loss_parallel": False}, "parallel.loss_parallel"),
        ("hf", {"tp_plan": "deepspeed"}, "parallel.tp_plan"),
        ("hf", {"loss_parallel": "yes"}, "parallel.loss_parallel"),
    ],
)
def test_impossible_or_malformed_choices_are_one_clear_error(framework, par, field):
    with pytest.raises(ScenarioError) as err:
        estimate(_ctx(framework, **par).scenario)
    assert err.value.field == field


def test_unset_keys_are_not_echoed_and_set_ones_are():
    assert "tp_plan" not in _ctx().scenario.to_dict()["parallel"]
    out = _ctx("hf", tp_plan="torchtitan", loss_parallel=False).scenario.to_dict()["parallel"]
    assert out["tp_plan"] == "torchtitan" and out["loss_parallel"] is False
    assert (
        Scenario.from_dict({"model": "llama-3.1-8b", "parallel": out}).parallel
        == _ctx("hf", tp_plan="torchtitan", loss_parallel=False).scenario.parallel
    )


def test_torchtitan_with_tp_and_no_fsdp_computes_in_fp32():
    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.frameworks import effective_recipe

    def ctx(**par) -> Context:
        data = {"model": "llama-3.1-8b", "framework": "torchtitan", "precision": "amp-bf16", "parallel": par}
        return Context(Scenario.from_dict(data))

    tp_only, fsdp_tp = ctx(tp=2), ctx(tp=2, dp=2, zero=3)
    assert effective_recipe(tp_only).name == "fp32"  # maybe_enable_amp: neither FSDP's cast nor autocast
    assert effective_recipe(fsdp_tp).name == "amp-bf16" == effective_recipe(ctx()).name

    def mlp_internals(c: Context) -> int:
        return sum(t.bytes for t in activations(c).per_layer if "MLP activation internals" in t.name)

    assert mlp_internals(tp_only) == 2 * mlp_internals(fsdp_tp)  # 4 B instead of 2 B per element
