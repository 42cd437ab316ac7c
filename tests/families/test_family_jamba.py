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
from memsim_widget.engine.activations.hybrid import stack_context
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.speed.flops import model_flops
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
    from memsim_widget.engine.activations.hybrid import jamba_mixer

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


def test_under_full_checkpointing_the_recomputed_layer_is_a_whole_mamba_layer() -> None:
    """The layer recomputed for its backward (the lowest, the highest) is a Mamba layer: one whole mixer (not
    4/6 of one) and no attention terms; the rest of the layer (norms, MLP) is the stack's average (traced:
    jamba bf16 ckpt b2 s64 -3.56% with the averaged layer -> +1.56%)."""
    from memsim_widget.engine.activations.hybrid import jamba_mixer

    ctx = _ctx(ssm_kernel="torch", activation_checkpointing="full")
    out = activations(ctx)
    one, _ = jamba_mixer(ctx, ctx.arch.extra["ssm"])
    recomputed = {t.name: t.bytes for t in out.recomputed_layer}
    assert {t.name: t.bytes for t in one}.items() <= recomputed.items()
    assert not any(n.startswith("attention ") for n in recomputed)
    rest = [t for t in out.per_layer if not t.name.startswith("attention ") and t.name not in recomputed]
    assert all(t.name.startswith("Jamba") or "4/6 Mamba layers" in t.formula for t in rest)
    assert not activations(_ctx(ssm_kernel="torch")).recomputed_layer  # no checkpointing: nothing recomputed


def test_lora_mixer_keeps_no_input_of_a_frozen_matmul_and_no_frozen_norm_output() -> None:
    """Jamba's mixer under LoRA on in_proj, torch path: no x_proj input copy, no dt_proj input (the dt norm's
    output), no normalised tensor of the three frozen norms, no D-skip u or out_proj input, A once; in_proj's
    adapter keeps its fp32 copy of the input (traced: +5.74% -> +0.08%)."""
    from memsim_widget.engine.activations.hybrid import jamba_mixer

    full = _ctx(ssm_kernel="torch")
    lora = _ctx(ssm_kernel="torch", method="lora", lora={"targets": ["in_proj"]})
    mine = {c: sum(t.bytes for t in jamba_mixer(c, c.arch.extra["ssm"])[0]) for c in (full, lora)}
    T, h, inner, N, R, ec = 128, 64, 128, 8, 5, 2  # TINY at b2 s64
    dropped = ec * T * inner + ec * T * R + ec * T * (R + 2 * N) + 2 * ec * T * inner + 4 * inner * N
    assert mine[full] - mine[lora] == dropped - (4 - ec) * T * h


def test_default_kernel_is_cuda_and_said_to_be_a_formula() -> None:
    est = estimate(Scenario.from_dict({"model": "jamba-v0.1", "micro_batch_size": 1, "seq_len": 2048}))
    assert any("not traced" in c for c in est.caveats)


@pytest.mark.parametrize(
    ("keys", "field"),
    [
        ({"method": "lora", "lora": {"targets": ["q_proj"]}}, "lora.targets"),
        ({"method": "lora", "lora": {"targets": ["in_proj", "out_proj"]}}, "lora.targets"),
        ({"method": "lora", "lora": {"targets": ["all-linear"]}}, "lora.targets"),
        ({"method": "qlora", "lora": {"targets": ["in_proj"]}}, "method"),
        ({"activation_checkpointing": "selective-op"}, "activation_checkpointing"),
        ({"framework": "megatron"}, "framework"),
        ({"parallel": {"tp": 2}}, "parallel"),
    ],
)
def test_untraced_combinations_are_refused(keys: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        estimate(Scenario.from_dict({"model": TINY, "micro_batch_size": 1, "seq_len": 64, **keys}))
    assert err.value.field == field


def test_autocast_is_estimated_and_the_moe_layers_are_said_to_be_untraced() -> None:
    """Autocast on Jamba: traced with dense MLPs (issue 26); grouped_mm experts cannot autocast on a CPU, so the
    estimate of a Jamba with MoE layers says that part is not traced."""
    sc = {"model": TINY, "micro_batch_size": 1, "seq_len": 64, "ssm_kernel": "torch", "precision": "amp-bf16"}
    moe = estimate(Scenario.from_dict(sc))
    dense = estimate(Scenario.from_dict({**sc, "model": {**TINY, "num_experts": 1}}))
    assert any("MoE layers under autocast are not traced" in c for c in moe.caveats)
    assert not any("MoE layers under autocast" in c for c in dense.caveats)


@pytest.mark.parametrize(
    "name",
    [
        "jamba torch amp-bf16 b2 s64 (dense MLPs)",
        "jamba torch bf16 ckpt b2 s64",
        "jamba torch fp32 ckpt b2 s64 (dense MLPs)",
        "jamba torch amp-bf16 ckpt b2 s64 (dense MLPs)",
        "jamba torch bf16 lora in_proj b2 s64",
        "jamba torch bf16 lora in_proj x_proj q_proj v_proj b2 s64",
        "jamba torch fp32 lora in_proj b2 s64 (dense MLPs)",
        "jamba torch amp-bf16 lora in_proj b2 s64 (dense MLPs)",
        "jamba torch bf16 lora in_proj ckpt b2 s64",
        "jamba torch V65536 bf16 b2 s64 (the real vocabulary; outputs kept: backward, bf16 logits)",
        "jamba torch V65536 amp-bf16 b2 s64 (dense MLPs; the real vocabulary; outputs kept: step, bf16 logits)",
        "jamba torch bf16 sdpa b2 s64",
        "jamba torch fp32 b2 s64 (dense MLPs)",
        "jamba torch bf16 b1 s128 (tied, N=8, K=3, R=12, biases, attention on top, MoE at even layers)",
    ],
)
@pytest.mark.slow
def test_engine_within_one_percent_of_trace(name: str) -> None:
    """Within 1%, or within 2% above the trace under checkpointing (the recomputed lowest layer's backward counts
    the MLP and out_proj gradients of the highest Mamba layer, an MoE layer, made before its scan) and under
    autocast LoRA (+1.52%, not explained)."""
    pytest.importorskip("transformers")
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    high = "ckpt" in name or "amp-bf16 lora" in name
    assert abs(r["error"]) < 0.01 or (high and 0 <= r["error"] < 0.02), r


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

    # 8 and 16 GPUs: pipelines of 8 and 16 stages would cut its 8-layer blocks, 1, 2 and 4 keep them whole
    p = plan("jamba-v0.1", "h100-sxm-80gb", (8, 16), base={"seq_len": 256, "ssm_kernel": kernel}, top=20)
    assert p.listed > 0 and p.mismatches() == []
    assert {32 // pp % 8 for pp in set(p.frame["pp"])} == {0}
    assert set(p.frame["tp"]) == {1} and set(p.frame["cp"]) == {1}
