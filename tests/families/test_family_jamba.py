"""Jamba (issue 12, hybrid state-space models): exact parameter counts against transformers' meta-device build of
``JambaForCausalLM``, the layer plan of JambaConfig, the hybrid activation rule (attention terms for the attention
layers, the Mamba mixer's for the others), the torch scan path held to a fake-tensor trace, and the refusals."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest

from memsim_widget.architecture import build_architecture
from memsim_widget.catalog.models import PRESETS, architecture_for
from memsim_widget.engine.activations import activations
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.flops import model_flops
from memsim_widget.engine.hybrid import stack_context
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

JAMBA_PRESETS = [p for p in PRESETS if PRESETS[p]["model_type"] == "jamba"]

#: Odd sizes: 6 layers, attention at 1 and 4 (period 3), MoE at 1, 3, 5; biases, dt rank 5, N = 8, K = 3, tied.
TINY: dict[str, Any] = {
    "model_type": "jamba",
    "hidden_size": 64,
    "intermediate_size": 88,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 101,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "attn_layer_period": 3,
    "attn_layer_offset": 1,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "mamba_d_state": 8,
    "mamba_d_conv": 3,
    "mamba_dt_rank": 5,
    "mamba_proj_bias": True,
    "mamba_conv_bias": False,
    "tie_word_embeddings": True,
}


def meta_counts(cfg: dict[str, Any]) -> tuple[int, Counter[str]]:
    """Total parameters and per-kind sums of ``JambaForCausalLM`` built on the meta device."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    kinds: Counter[str] = Counter()
    emb = model.get_input_embeddings().weight
    for name, p in model.named_parameters():
        if p is emb:
            kinds["embedding"] += p.numel()
        elif ".mamba." in name:  # the mixer and its dt/B/C norms
            kinds["ssm"] += p.numel()
        elif ".experts." in name:
            kinds["experts"] += p.numel()
        elif ".router." in name:
            kinds["router"] += p.numel()
        elif "norm" in name:
            kinds["norm"] += p.numel()
        elif name.startswith("lm_head"):
            kinds["head"] += p.numel()
        elif "self_attn" in name:
            kinds["attention"] += p.numel()
        else:  # feed_forward.{gate,up,down}_proj
            kinds["mlp"] += p.numel()
    return sum(p.numel() for p in model.parameters()), kinds


@pytest.mark.parametrize(
    "cfg",
    [
        *(PRESETS[p] for p in JAMBA_PRESETS),
        TINY,
        {**TINY, "num_experts": 1},  # every MLP dense
        {
            **TINY,
            "attn_layer_period": 8,
            "tie_word_embeddings": False,
            "mamba_dt_rank": "auto",
        },  # no attention
    ],
    ids=[*JAMBA_PRESETS, "tiny", "tiny-dense", "tiny-no-attention-untied"],
)
def test_parameters_match_transformers_by_kind(cfg: dict[str, Any]) -> None:
    arch = build_architecture(cfg)
    total, kinds = meta_counts(cfg)
    assert arch.parameters == total
    assert {k: v for k, v in arch.parameters_by_kind().items() if v} == dict(+kinds)


def test_presets_are_the_published_sizes() -> None:
    """52B for Jamba v0.1 and 1.5 Mini (one shape), 398B for 1.5 Large (AI21's figures)."""
    sizes = {p: round(architecture_for(p).parameters / 1e9, 1) for p in JAMBA_PRESETS}
    assert sizes == {"jamba-v0.1": 51.6, "jamba-1.5-mini": 51.6, "jamba-1.5-large": 398.6}


def test_layer_plan_is_jamba_configs() -> None:
    """Attention every attn_layer_period-th layer from its offset, experts every expert_layer_period-th."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.JambaConfig(**{k: v for k, v in TINY.items() if k != "model_type"})
    arch = build_architecture(TINY)
    assert list(arch.extra["layer_block_types"]) == hf.layers_block_type
    assert arch.extra["moe_layer_indices"] == [i for i, n in enumerate(hf.layers_num_experts) if n > 1]
    assert arch.extra["attention_layers"] == 2 and arch.extra["ssm"]["layers"] == 4
    assert model_flops(arch).attention_layers == 2


@pytest.mark.parametrize(
    ("keys", "field"),
    [
        ({"attn_layer_offset": 3}, "model.attn_layer_offset"),
        ({"expert_layer_offset": 2}, "model.expert_layer_offset"),
        ({"hidden_act": "gelu"}, "model.hidden_act"),
        ({"num_experts_per_tok": 5}, "model.num_experts_per_tok"),
        ({"num_attention_heads": 5, "num_key_value_heads": 5}, "model.num_attention_heads"),
    ],
)
def test_bad_keys_are_named(keys: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        build_architecture({**TINY, **keys})
    assert err.value.field == field


def _ctx(**keys: Any) -> Context:
    return Context(Scenario.from_dict({"model": TINY, "micro_batch_size": 2, "seq_len": 64, **keys}))


def test_attention_terms_count_for_the_attention_layers_only() -> None:
    """Seen as all-attention, the stack saves A per layer in attention terms; the hybrid keeps 2/6 of A."""
    ctx = _ctx(ssm_kernel="torch")
    whole = [t for t in activations(stack_context(ctx)).per_layer if t.name.startswith("attention ")]
    mine = [t for t in activations(ctx).per_layer if t.name.startswith("attention ")]
    assert [t.name for t in mine] == [t.name for t in whole] and whole
    assert [t.bytes for t in mine] == pytest.approx([t.bytes * 2 / 6 for t in whole])


def test_mixer_terms_count_for_the_mamba_layers_and_kernels_differ() -> None:
    """The mixer's terms are 4/6 of one mixer's; the torch path keeps every scan state, the kernels do not."""
    from memsim_widget.engine.hybrid import jamba_mixer

    for kernel in ("torch", "cuda"):
        ctx = _ctx(ssm_kernel=kernel)
        one, _ = jamba_mixer(ctx, ctx.arch.extra["ssm"])
        names = {t.name: t.bytes for t in one}
        mine = {t.name: t.bytes for t in activations(ctx).per_layer if t.name in names}
        assert mine == pytest.approx({n: b * 4 / 6 for n, b in names.items()})
    b, s, inner, N = 2, 64, 128, 8
    states = next(
        t
        for t in jamba_mixer(_ctx(ssm_kernel="torch"), _ctx().arch.extra["ssm"])[0]
        if "scan states" in t.name
    )
    assert states.bytes == b * inner * N * (4 * (s - 1) + 2 * (s + 1))
    pairs = next(
        t for t in jamba_mixer(_ctx(), _ctx().arch.extra["ssm"])[0] if "scan intermediates" in t.name
    )
    assert pairs.bytes == 4 * b * inner * 1 * 2 * N


def test_default_kernel_is_cuda_and_said_to_be_a_formula() -> None:
    est = estimate(Scenario.from_dict({"model": "jamba-v0.1", "micro_batch_size": 1, "seq_len": 2048}))
    assert any("not traced" in c for c in est.caveats)


@pytest.mark.parametrize(
    ("keys", "field"),
    [
        ({"precision": "amp-bf16"}, "precision"),
        ({"method": "lora", "lora": {"targets": ["q_proj"]}}, "method"),
        ({"activation_checkpointing": "full"}, "activation_checkpointing"),
        ({"framework": "megatron"}, "framework"),
        ({"parallel": {"tp": 2}}, "parallel"),
    ],
)
def test_untraced_combinations_are_refused(keys: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        estimate(Scenario.from_dict({"model": TINY, "micro_batch_size": 1, "seq_len": 64, **keys}))
    assert err.value.field == field


@pytest.mark.parametrize(
    "name",
    [
        "jamba torch bf16 sdpa b2 s64",
        "jamba torch fp32 b2 s64 (dense MLPs)",
        "jamba torch bf16 b1 s128 (tied, N=8, K=3, R=12, biases, attention on top, MoE at even layers)",
    ],
)
@pytest.mark.slow
def test_engine_within_one_percent_of_trace(name: str) -> None:
    pytest.importorskip("transformers")
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.01, r


def test_pipeline_stages_must_hold_whole_blocks_of_the_pattern() -> None:
    """Jamba v0.1 repeats every 8 layers: pp=4 (8 layers per stage) is modelled, pp=16 (2 per stage) refused."""
    sc = {"model": "jamba-v0.1", "micro_batch_size": 1, "seq_len": 512}
    assert (
        estimate(Scenario.from_dict({**sc, "parallel": {"pp": 4, "pp_microbatches": 4}})).peak_tensor_bytes
        > 0
    )
    with pytest.raises(ScenarioError) as err:
        estimate(Scenario.from_dict({**sc, "parallel": {"pp": 16, "pp_microbatches": 16}}))
    assert err.value.field == "parallel.pp" and "repeats every 8 layers" in err.value.message


@pytest.mark.parametrize("kernel", ["cuda", "torch"])
def test_the_planner_keeps_to_whole_blocks_and_agrees_with_the_estimate(kernel: str) -> None:
    from memsim_widget.plan import plan

    p = plan("jamba-v0.1", "h100-sxm-80gb", (8, 64), base={"seq_len": 256, "ssm_kernel": kernel}, top=20)
    assert p.listed > 0 and p.mismatches() == []
    assert {32 // pp % 8 for pp in set(p.frame["pp"])} == {0}
    assert set(p.frame["tp"]) == {1} and set(p.frame["cp"]) == {1}
