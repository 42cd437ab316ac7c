"""Architecture builders: exact parameter counts, groupings, TP/LoRA metadata and input errors.

No torch needed: counts are checked against closed forms written out here, and against the
published parameter counts of every preset.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget.architecture import FAMILIES, PARAM_KINDS, Architecture, ParamGroup, build_architecture
from memsim_widget.catalog.models import (
    PRESET_INFO,
    PRESETS,
    architecture_for,
    preset_ids,
    resolve_model_config,
)
from memsim_widget.errors import ScenarioError

SMALL_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}


def llama_closed_form(V: int, h: int, L: int, a: int, kv: int, d: int, inter: int, tied: bool) -> int:
    """Llama parameter count: embedding, per-layer q/k/v/o + SwiGLU + 2 RMSNorms, final norm, head."""
    per_layer = h * a * d + 2 * h * kv * d + a * d * h + 3 * h * inter + 2 * h
    return V * h + L * per_layer + h + (0 if tied else V * h)


def group(arch: Architecture, suffix: str) -> ParamGroup:
    """The one ParamGroup whose name ends with ``suffix``."""
    found = [g for g in arch.params if g.name.endswith(suffix)]
    assert len(found) == 1, [g.name for g in found]
    return found[0]


# ----------------------------------------------------------------------------- exact counts


def test_small_llama_count_is_the_closed_form() -> None:
    """A 3-layer GQA llama: every tensor counted once, per the written-out formula."""
    arch = build_architecture(SMALL_LLAMA)
    V, h, L, a, kv, d, inter = 1000, 64, 3, 8, 2, 8, 160
    embedding = V * h
    attention = L * (h * a * d + h * kv * d + h * kv * d + a * d * h)
    mlp = L * 3 * h * inter
    norms = L * 2 * h + h
    head = V * h
    assert arch.parameters == embedding + attention + mlp + norms + head == 251_328
    assert arch.parameters == llama_closed_form(V, h, L, a, kv, d, inter, tied=False)
    by_kind = arch.parameters_by_kind()
    assert by_kind == {
        "embedding": embedding,
        "position": 0,
        "attention": attention,
        "ssm": 0,
        "mlp": mlp,
        "experts": 0,
        "router": 0,
        "norm": norms,
        "head": head,
        "other": 0,
    }
    assert list(by_kind) == list(PARAM_KINDS)


def test_small_llama_fields() -> None:
    """Shape facts come straight from the config; defaults are LlamaConfig's."""
    arch = build_architecture(SMALL_LLAMA)
    assert (arch.family, arch.model_type) == ("llama", "llama")
    assert (arch.hidden_size, arch.num_layers, arch.num_heads, arch.num_kv_heads, arch.head_dim) == (
        64,
        3,
        8,
        2,
        8,
    )
    assert (arch.intermediate_size, arch.vocab_size, arch.tied_embeddings) == (160, 1000, False)
    assert (arch.mlp_activation, arch.norm, arch.position, arch.causal) == ("swiglu", "rmsnorm", "rope", True)
    assert (arch.num_experts, arch.is_moe, arch.fixed_seq_len) == (0, False, None)
    assert arch.decoder_layers == 3 and arch.encoder_layers == 0
    assert arch.extra["hf_class"] == "LlamaForCausalLM"
    assert arch.extra["rope_theta"] == 10000.0


def test_tied_llama_drops_the_head_and_biases_add_up() -> None:
    """tie_word_embeddings removes lm_head; attention_bias/mlp_bias add one bias per Linear."""
    tied = build_architecture({**SMALL_LLAMA, "tie_word_embeddings": True})
    assert tied.parameters == 251_328 - 1000 * 64
    assert tied.parameters_by_kind()["head"] == 0
    biased = build_architecture({**SMALL_LLAMA, "attention_bias": True, "mlp_bias": True})
    h, L, a, kv, d, inter = 64, 3, 8, 2, 8, 160
    assert biased.parameters - 251_328 == L * (a * d + 2 * kv * d + h + 2 * inter + h)


def test_gpt2_count_is_the_closed_form() -> None:
    """GPT-2 small: wte + wpe, per layer 2 LayerNorms + c_attn + c_proj + c_fc + c_proj, ln_f, tied head."""
    arch = architecture_for("gpt2")
    V, P, h, L = 50257, 1024, 768, 12
    embeddings = V * h + P * h
    per_layer = (2 * h) + (h * 3 * h + 3 * h) + (h * h + h) + (2 * h) + (h * 4 * h + 4 * h) + (4 * h * h + h)
    assert arch.parameters == embeddings + L * per_layer + 2 * h == 124_439_808
    kinds = arch.parameters_by_kind()
    assert kinds["embedding"] == V * h
    assert kinds["position"] == P * h
    assert kinds["head"] == 0
    assert (arch.mlp_activation, arch.norm, arch.position) == ("gelu_tanh", "layernorm", "learned")
    assert (arch.attention_dropout, arch.hidden_dropout) == (0.1, 0.1)
    assert arch.extra["n_positions"] == 1024


def test_gpt2_accepts_generic_key_aliases() -> None:
    """hidden_size/num_hidden_layers/num_attention_heads work like n_embd/n_layer/n_head."""
    generic = dict(PRESETS["gpt2"])
    for old, new in (
        ("n_embd", "hidden_size"),
        ("n_layer", "num_hidden_layers"),
        ("n_head", "num_attention_heads"),
    ):
        generic[new] = generic.pop(old)
    assert build_architecture(generic) == architecture_for("gpt2")


#: Exact totals of every preset (``sum(p.numel() for p in model.parameters())`` of the training class;
#: these equal the published counts, e.g. Llama-3.1-8B 8,030,261,248 and GPT-2 124,439,808).
EXPECTED_TOTALS = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "bert-base-uncased": 109_514_298,
    "bert-large-uncased": 335_174_458,
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "mistral-7b": 7_248_023_552,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-3b": 3_085_938_688,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-14b": 14_770_033_664,
    "qwen2.5-32b": 32_763_876_352,
    "qwen2.5-72b": 72_706_203_648,
    "gemma-2-2b": 2_614_341_888,
    "gemma-2-9b": 9_241_705_984,
    "gemma-2-27b": 27_227_128_320,
    "phi-3-mini": 3_821_079_552,
    "phi-3-medium": 13_960_238_080,
    "t5-base": 222_903_552,
    # the published checkpoint's 783,150,080 less its separate lm_head (32128 x 1024): transformers 5 ties it
    "flan-t5-large": 750_251_008,
    "vit-base-patch16-224": 86_567_656,
    "vit-large-patch16-224": 304_326_632,
    "vit-huge-patch14-224": 632_045_800,
}


def test_catalog_has_every_required_preset_with_info() -> None:
    """The catalog lists the required ids, each with a description and a published size label."""
    assert set(EXPECTED_TOTALS) <= set(preset_ids())
    assert set(PRESET_INFO) == set(PRESETS) == set(preset_ids())
    for info in PRESET_INFO.values():
        assert info["description"] and info["params_label"]


@pytest.mark.parametrize("preset", sorted(EXPECTED_TOTALS))
def test_preset_totals(preset: str) -> None:
    """Each preset's total parameter count is the published one."""
    assert architecture_for(preset).parameters == EXPECTED_TOTALS[preset]


def test_family_specific_facts() -> None:
    """Spot checks of per-family facts the engine relies on."""
    mixtral = architecture_for("mixtral-8x7b")
    assert (mixtral.num_experts, mixtral.experts_per_token, mixtral.is_moe) == (8, 2, True)
    # transformers 5's MixtralExperts: w1 and w3 fused into gate_up_proj [E, 2I, h], plain parameters (no Linear)
    gate_up = group(mixtral, "experts.gate_up_proj")
    assert (gate_up.shape, gate_up.count, gate_up.expert, gate_up.kind, gate_up.module) == (
        (2 * 14336, 4096),
        32 * 8,
        True,
        "experts",
        None,
    )
    router = group(mixtral, "block_sparse_moe.gate.weight")
    assert (router.kind, router.shape, router.tp_dim) == ("router", (8, 4096), None)

    gemma = architecture_for("gemma-2-27b")
    assert (gemma.head_dim, gemma.num_heads * gemma.head_dim, gemma.hidden_size) == (128, 4096, 4608)
    assert gemma.tied_embeddings and gemma.mlp_activation == "geglu"
    assert gemma.extra["norms_per_layer"] == 4
    assert gemma.extra["attn_logit_softcapping"] == 50.0 and gemma.extra["sliding_window"] == 4096

    phi = architecture_for("phi-3-medium")
    qkv = group(phi, "qkv_proj.weight")
    assert qkv.shape == ((40 + 2 * 10) * 128, 5120) and qkv.module == "qkv_proj"
    assert group(phi, "gate_up_proj.weight").shape == (2 * 17920, 5120)

    t5 = architecture_for("flan-t5-large")
    assert (t5.encoder_layers, t5.decoder_layers, t5.num_layers) == (24, 24, 48)
    assert (t5.mlp_activation, t5.position, t5.norm) == ("geglu", "relative", "rmsnorm")
    assert {g.stack for g in t5.params} == {"encoder", "decoder"}
    assert architecture_for("t5-base").mlp_activation == "relu"

    vit = architecture_for("vit-huge-patch14-224")
    assert vit.fixed_seq_len == (224 // 14) ** 2 + 1 == 257
    assert (vit.causal, vit.vocab_size, vit.extra["num_labels"]) == (False, 0, 1000)
    assert group(vit, "classifier.weight").shape == (1000, 1280)

    bert = architecture_for("bert-base-uncased")
    assert (bert.causal, bert.tied_embeddings, bert.extra["type_vocab_size"]) == (False, True, 2)
    assert (bert.attention_dropout, bert.hidden_dropout) == (0.1, 0.1)
    assert group(bert, "cls.predictions.bias").shape == (30522,)

    llama32 = architecture_for("llama-3.2-1b")
    assert llama32.head_dim == 64 and llama32.tied_embeddings
    assert llama32.extra["rope_scaling"]["rope_type"] == "llama3"


# ----------------------------------------------------------------------------- grouping invariants


@pytest.mark.parametrize("preset", preset_ids())
def test_grouping_invariants(preset: str) -> None:
    """Groups are well-formed: kinds, scopes, per-stack layer counts, TP dims and LoRA module names."""
    arch = architecture_for(preset)
    assert sum(g.numel for g in arch.params) == arch.parameters
    assert sum(arch.parameters_by_kind().values()) == arch.parameters
    assert len({g.name for g in arch.params}) == len(arch.params)
    stack_layers = {"encoder": arch.encoder_layers, "decoder": arch.decoder_layers}
    assert arch.num_layers == (arch.encoder_layers + arch.decoder_layers)
    vision = arch.extra.get("vision")
    for g in arch.params:
        assert g.kind in PARAM_KINDS and g.kind != "other"
        assert g.scope in ("pre", "layer", "post")
        assert all(n > 0 for n in g.shape) and g.count >= 1
        if g.stack in ("vision", "vision_unused", "projector"):
            # a multimodal model's tower and projector run before the language model's layers (one stage, the
            # tower's own layers inside: count = its layers); the tower is an Architecture of its own
            assert vision and (g.scope == "pre" or g.kind == "head") and g.module != "lm_head"
            if g.name.split(" ")[0].endswith(".weight") and ".encoder.layers." in g.name:
                assert g.count <= vision["tower"].num_layers
            continue
        assert g.stack in ("encoder", "decoder")
        assert g.tp_dim is None or 0 <= g.tp_dim < len(g.shape)
        if g.scope == "layer":
            per_layer = stack_layers[g.stack] * (arch.num_experts if g.expert else 1)
            mixed = "moe_layers" in arch.extra and arch.extra["moe_layers"] < stack_layers[g.stack]
            if mixed:  # dense first-k layers (DeepSeek) or mlp_only_layers: a group covers some layers only
                moe = arch.extra["moe_layers"] * (arch.num_experts if g.expert else 1)
                dense = stack_layers[g.stack] - arch.extra["moe_layers"]
                # a hybrid stack (Jamba): attention groups cover its attention layers, state-space ones the others
                kinds = (arch.extra.get("attention_layers"), arch.extra.get("ssm", {}).get("layers"))
                assert g.count in (per_layer, moe, dense, *kinds) or g.kind == "router", g.name
            elif (
                g.kind == "norm" and "first_layer_norms" in arch.extra
            ):  # ModernBERT: layer 0 has no attn_norm
                assert g.count in (per_layer, per_layer - 1), g.name
            else:
                assert g.count == per_layer, g.name
        else:
            assert g.count == 1 and not g.expert
        assert g.expert == (g.kind == "experts")
        if g.kind == "norm" or g.name.endswith(".bias"):
            assert g.module is None
        if g.kind == "norm":
            assert g.tp_dim is None
        if g.module is not None:
            assert g.name.endswith(f"{g.module}.weight")


def test_tensor_parallel_dims_follow_megatron() -> None:
    """Column-parallel split dim 0 (weight [out, in]) and bias; row-parallel dim 1, bias replicated."""
    qwen = architecture_for("qwen2.5-7b")
    for name, dim in (("q_proj", 0), ("k_proj", 0), ("v_proj", 0), ("o_proj", 1)):
        assert group(qwen, f"{name}.weight").tp_dim == dim
    for name, dim in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
        assert group(qwen, f"{name}.weight").tp_dim == dim
    assert group(qwen, "q_proj.bias").tp_dim == 0
    assert group(qwen, "embed_tokens.weight").tp_dim == 0
    assert group(qwen, "lm_head.weight").tp_dim == 0
    assert group(qwen, "input_layernorm.weight").tp_dim is None

    gpt2 = architecture_for("gpt2")  # Conv1D weights are [in, out]: split dims swap
    c_attn = group(gpt2, "attn.c_attn.weight")
    assert (c_attn.shape, c_attn.tp_dim) == ((768, 2304), 1)
    assert group(gpt2, "attn.c_proj.weight").tp_dim == 0
    assert group(gpt2, "mlp.c_fc.weight").tp_dim == 1
    assert group(gpt2, "mlp.c_proj.weight").tp_dim == 0
    assert group(gpt2, "attn.c_attn.bias").tp_dim == 0
    assert group(gpt2, "attn.c_proj.bias").tp_dim is None

    bert = architecture_for("bert-base-uncased")
    assert group(bert, "attention.output.dense.weight").tp_dim == 1
    assert group(bert, "intermediate.dense.weight").tp_dim == 0
    assert group(bert, "intermediate.dense.bias").tp_dim == 0
    assert group(bert, "layer.*.output.dense.bias").tp_dim is None


def test_scopes_place_embeddings_first_and_head_last() -> None:
    """Embeddings are 'pre', the final norm and head 'post', blocks 'layer'."""
    arch = architecture_for("llama-2-7b")
    assert group(arch, "embed_tokens.weight").scope == "pre"
    assert group(arch, "model.norm.weight").scope == "post"
    assert group(arch, "lm_head.weight").scope == "post"
    assert group(arch, "q_proj.weight").scope == "layer"


# ----------------------------------------------------------------------------- property


@st.composite
def llama_configs(draw: st.DrawFn) -> dict[str, Any]:
    """Random small but valid llama configs (GQA, optional explicit head_dim, tied or not)."""
    kv = draw(st.integers(1, 4))
    heads = kv * draw(st.integers(1, 4))
    cfg: dict[str, Any] = {
        "model_type": "llama",
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "hidden_size": heads * draw(st.integers(1, 16)),
        "intermediate_size": draw(st.integers(1, 300)),
        "num_hidden_layers": draw(st.integers(1, 6)),
        "vocab_size": draw(st.integers(1, 5000)),
        "tie_word_embeddings": draw(st.booleans()),
    }
    if draw(st.booleans()):
        cfg["head_dim"] = draw(st.integers(1, 32))
    return cfg


@settings(max_examples=200, deadline=None)
@given(llama_configs())
def test_random_llama_count_equals_closed_form(cfg: dict[str, Any]) -> None:
    """For any small llama config the grouped count equals the closed form."""
    arch = build_architecture(cfg)
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    d = cfg.get("head_dim", h // heads)
    expected = llama_closed_form(
        cfg["vocab_size"],
        h,
        cfg["num_hidden_layers"],
        heads,
        cfg["num_key_value_heads"],
        d,
        cfg["intermediate_size"],
        cfg["tie_word_embeddings"],
    )
    assert arch.parameters == expected
    assert sum(g.numel for g in arch.params) == expected


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"])
def test_missing_required_key_names_the_field(key: str) -> None:
    """A config without a structural key is rejected, naming ``model.<key>``."""
    cfg = {k: v for k, v in SMALL_LLAMA.items() if k != key}
    with pytest.raises(ScenarioError) as err:
        build_architecture(cfg)
    assert err.value.field == f"model.{key}"
    assert "required" in err.value.message


@pytest.mark.parametrize("value", [-4, 0, "64", 64.0, True, [64]])
def test_bad_integer_values_name_the_field(value: object) -> None:
    """Negative, zero, non-integer (incl. bool and float) values are rejected, naming the key."""
    with pytest.raises(ScenarioError) as err:
        build_architecture({**SMALL_LLAMA, "hidden_size": value})
    assert err.value.field == "model.hidden_size"


def test_gpt2_missing_key_uses_gpt2_name() -> None:
    """GPT-2 errors name its own keys (n_embd), not the aliases."""
    cfg = {k: v for k, v in PRESETS["gpt2"].items() if k != "n_embd"}
    with pytest.raises(ScenarioError) as err:
        build_architecture(cfg)
    assert err.value.field == "model.n_embd"


def test_inconsistent_heads_are_rejected() -> None:
    """KV heads must divide query heads; hidden size must divide by heads without explicit head_dim."""
    with pytest.raises(ScenarioError) as err:
        build_architecture({**SMALL_LLAMA, "num_key_value_heads": 3})
    assert err.value.field == "model.num_key_value_heads"
    with pytest.raises(ScenarioError) as err:
        build_architecture({**SMALL_LLAMA, "num_attention_heads": 6, "num_key_value_heads": 6})
    assert err.value.field == "model.num_attention_heads"
    fine = build_architecture(
        {**SMALL_LLAMA, "num_attention_heads": 6, "num_key_value_heads": 6, "head_dim": 10}
    )
    assert fine.head_dim == 10


def test_unknown_model_type_lists_families() -> None:
    """An unsupported model_type names the field and every supported type; a spelling slip gets its hint."""
    with pytest.raises(ScenarioError) as err:
        build_architecture({**SMALL_LLAMA, "model_type": "lama"})
    assert err.value.field == "model.model_type"
    assert "did you mean 'llama'?" in err.value.message
    assert all(mt in err.value.message for mt in FAMILIES)
    with pytest.raises(ScenarioError) as err:
        build_architecture({"hidden_size": 64})
    assert err.value.field == "model.model_type"


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("lama", "llama"),
        ("Llama", "llama"),
        ("GPT-NeoX", "gpt_neox"),
        ("mitsral", "mistral"),
        ("qwen3-moe", "qwen3_moe"),
    ],
)
def test_a_spelling_slip_of_a_supported_type_gets_one_hint(typed: str, meant: str) -> None:
    """Case, separators, a doubled letter dropped, two letters swapped: the type meant, and only it."""
    with pytest.raises(ScenarioError) as err:
        build_architecture({**SMALL_LLAMA, "model_type": typed})
    assert f"(did you mean {meant!r}?)" in err.value.message


@pytest.mark.parametrize(
    "model_type",
    # other architectures one edit or a suffix away from a supported type (Zamba2 and Bamba are state-space
    # hybrids other than Jamba, Falcon Mamba and Mamba 3 other state-space layouts, Qwen3-VL vision models,
    # BART/OPT/mT5 other layouts), and invented names
    [
        "zamba2",
        "bamba",
        "falcon_mamba",
        "mamba3",
        "qwen3_vl",
        "bart",
        "opt",
        "mt5",
        "llama_moe_x",
        "blorfnik",
    ],
)
def test_another_architecture_is_never_hinted_as_a_supported_family(
    model_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Following a hint from Jamba to llama gave -85% parameters: an unknown type gets no hint, one line.
    (Without transformers: with it, a type it knows is calibrated from a trace instead, tests/engine/test_calibrated.py.)"""
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ScenarioError) as err:
        build_architecture({**SMALL_LLAMA, "model_type": model_type})
    msg = str(err.value)
    assert err.value.field == "model.model_type" and "\n" not in msg
    assert "did you mean" not in msg
    assert f"{model_type!r} is not a supported model type; supported: " in msg


def test_every_required_family_is_registered() -> None:
    """All ten families (plus the gemma alias) have a builder."""
    families = {
        "llama",
        "mistral",
        "qwen2",
        "mixtral",
        "gemma",
        "gemma2",
        "phi3",
        "gpt2",
        "bert",
        "t5",
        "vit",
    }
    assert families <= set(FAMILIES)


def test_unknown_activation_and_t5_projection_are_rejected() -> None:
    """Activations outside the supported set fail on their own key."""
    with pytest.raises(ScenarioError) as err:
        build_architecture({**SMALL_LLAMA, "hidden_act": "tanh"})
    assert err.value.field == "model.hidden_act"
    t5 = {**PRESETS["t5-base"], "feed_forward_proj": "gated-tanh"}
    with pytest.raises(ScenarioError) as err:
        build_architecture(t5)
    assert err.value.field == "model.feed_forward_proj"


# ----------------------------------------------------------------------------- resolving model inputs


def test_unknown_preset_suggests_close_ids() -> None:
    """A misspelt preset id fails on field ``model`` with 'did you mean' suggestions."""
    with pytest.raises(ScenarioError) as err:
        resolve_model_config("llama-3.1-8")
    assert err.value.field == "model"
    assert "did you mean" in err.value.message and "'llama-3.1-8b'" in err.value.message
    with pytest.raises(ScenarioError) as err:
        architecture_for("qwen2.5-7")
    assert "'qwen2.5-7b'" in err.value.message


def test_config_json_path_is_loaded(tmp_path: Path) -> None:
    """A local config.json (file or folder) resolves to its JSON, and builds like the same dict."""
    file = tmp_path / "config.json"
    file.write_text(json.dumps(SMALL_LLAMA), encoding="utf-8")
    assert resolve_model_config(str(file)) == SMALL_LLAMA
    assert resolve_model_config(str(tmp_path)) == SMALL_LLAMA
    assert architecture_for(str(file)) == build_architecture(SMALL_LLAMA)


def test_config_file_errors_name_model_with_reason(tmp_path: Path) -> None:
    """Missing, malformed, non-object and model_type-less files fail on ``model`` with the reason."""
    missing = tmp_path / "nope.json"
    with pytest.raises(ScenarioError) as err:
        resolve_model_config(str(missing))
    assert err.value.field == "model" and "cannot read" in err.value.message

    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ScenarioError) as err:
        resolve_model_config(str(bad))
    assert err.value.field == "model" and "not valid JSON" in err.value.message

    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ScenarioError, match="JSON object"):
        resolve_model_config(str(listed))

    untyped = tmp_path / "untyped.json"
    untyped.write_text(json.dumps({"hidden_size": 4}), encoding="utf-8")
    with pytest.raises(ScenarioError, match="model_type"):
        resolve_model_config(str(untyped))


def test_inline_configs() -> None:
    """Inline dicts need a model_type, are copied, and build (cached) like any config."""
    with pytest.raises(ScenarioError) as err:
        resolve_model_config({"hidden_size": 64})
    assert err.value.field == "model.model_type"
    cfg = dict(SMALL_LLAMA)
    resolved = resolve_model_config(cfg)
    resolved["hidden_size"] = 1
    assert cfg["hidden_size"] == 64
    assert architecture_for(cfg) is architecture_for(dict(SMALL_LLAMA))
    with pytest.raises(ScenarioError):
        resolve_model_config(42)  # type: ignore[arg-type]


def test_presets_resolve_to_fresh_copies_and_cached_architectures() -> None:
    """Resolving a preset never exposes the catalog dict; preset architectures are built once."""
    cfg = resolve_model_config("llama-3.1-8b")
    cfg["rope_scaling"]["factor"] = 1.0
    assert PRESETS["llama-3.1-8b"]["rope_scaling"]["factor"] == 8.0
    assert architecture_for("llama-3.1-8b") is architecture_for("llama-3.1-8b")


@pytest.mark.parametrize("preset", preset_ids())
def test_extra_facts_the_engine_reads(preset: str) -> None:
    """Every architecture says its norms per block and HF class; only GPT-2 has [in, out] Conv1D weights."""
    arch = architecture_for(preset)
    # LayerNorm has weight and bias (ModernBERT's only a weight, without norm_bias)
    tensors_per_norm = 2 if arch.norm == "layernorm" and arch.extra.get("norm_bias", True) else 1
    # norms absent from layer 0 (ModernBERT's attn_norm is nn.Identity there)
    missing = arch.extra["norms_per_layer"] - arch.extra.get(
        "first_layer_norms", arch.extra["norms_per_layer"]
    )

    def norm_tensors(stack: str) -> int:
        """Norm tensors of the residual stream inside the blocks of one stack (q/k norms are not counted)."""
        return sum(
            g.count
            for g in arch.params
            if g.kind == "norm" and g.scope == "layer" and g.stack == stack and ".self_attn." not in g.name
        )

    per_block = arch.extra["norms_per_layer"] * tensors_per_norm
    if arch.family == "t5":
        assert norm_tensors("encoder") == per_block * arch.encoder_layers
        assert norm_tensors("decoder") == arch.extra["decoder_norms_per_layer"] * arch.decoder_layers
    else:
        assert norm_tensors("encoder") + norm_tensors("decoder") == (
            per_block * arch.num_layers - missing * tensors_per_norm
        )
    assert arch.extra["hf_class"]
    assert bool(arch.extra.get("conv1d")) == (arch.family == "gpt2")
