"""Mamba and Mamba-2 (issue 12, state-space models): exact parameter counts against transformers' meta-device build, the two
scan paths (``ssm_kernel``: mamba-ssm's CUDA kernels, the default, vs transformers' torch path), the torch path
held to a fake-tensor trace, and what is refused rather than guessed."""

from __future__ import annotations

from typing import Any

import pytest

from memsim_widget.architecture import build_architecture, unknown_model_type
from memsim_widget.catalog.models import PRESETS, architecture_for
from memsim_widget.engine.core import estimate
from memsim_widget.engine.speed.flops import model_flops
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

TINY: dict[str, Any] = {
    "model_type": "mamba",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "vocab_size": 101,
    "state_size": 8,
    "expand": 3,
    "conv_kernel": 3,
    "use_bias": True,
    "use_conv_bias": False,
    "tie_word_embeddings": False,
    "time_step_rank": 5,
}
MAMBA_PRESETS = [p for p in PRESETS if PRESETS[p]["model_type"] == "mamba"]
MAMBA2_PRESETS = [p for p in PRESETS if PRESETS[p]["model_type"] == "mamba2"]
TINY2: dict[str, Any] = {
    "model_type": "mamba2",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "vocab_size": 101,
    "num_heads": 8,
    "head_dim": 16,
    "state_size": 8,
    "n_groups": 2,
    "conv_kernel": 3,
    "use_bias": True,
    "use_conv_bias": False,
    "tie_word_embeddings": True,
}


_LORA2: dict[str, Any] = {"method": "lora", "lora": {"targets": ["in_proj"]}}
_CKPT_FULL: dict[str, Any] = {"activation_checkpointing": "full"}


def _est(model: Any = "mamba-1.4b", **keys: Any):  # noqa: ANN202
    return estimate(Scenario.from_dict({"model": model, "micro_batch_size": 1, "seq_len": 2048, **keys}))


@pytest.mark.parametrize("cfg", [*(PRESETS[p] for p in MAMBA_PRESETS + MAMBA2_PRESETS), TINY, TINY2], ids=str)
def test_parameters_match_transformers_tensor_for_tensor(cfg: dict[str, Any]) -> None:
    pytest.importorskip("transformers")
    from _family_meta import assert_matches_transformers

    assert_matches_transformers(build_architecture(cfg), cfg)


def test_presets_are_the_published_sizes() -> None:
    sizes = {p: round(architecture_for(p).parameters / 1e6) for p in MAMBA_PRESETS}
    assert sizes == {
        "mamba-130m": 129,
        "mamba-370m": 372,
        "mamba-790m": 793,
        "mamba-1.4b": 1372,
        "mamba-2.8b": 2768,
    }


def test_intermediate_size_is_expand_times_hidden_and_rank_auto() -> None:
    """MambaConfig overwrites intermediate_size with expand x hidden; time_step_rank 'auto' = ceil(h / 16)."""
    arch = build_architecture({**TINY, "intermediate_size": 7, "time_step_rank": "auto"})
    assert arch.extra["ssm"]["inner"] == 192
    assert arch.extra["ssm"]["time_step_rank"] == 4
    assert arch.parameters_by_kind()["ssm"] > 0 and arch.parameters_by_kind()["attention"] == 0


def test_default_kernel_is_cuda_and_the_estimate_says_it_is_a_formula() -> None:
    est = _est()
    assert any("mamba-ssm's saved tensors, not traced" in c for c in est.caveats)
    torch_path = _est(ssm_kernel="torch", micro_batch_size=1, seq_len=512)
    kernel_path = _est(ssm_kernel="cuda", micro_batch_size=1, seq_len=512)
    assert any("held to a CPU fake-tensor trace" in c for c in torch_path.caveats)
    # the torch path keeps every step's (I x N) fp32 state: several times the kernel path's activations
    act = lambda e: sum(i.bytes for i in e.worst.items if i.category == "activations")  # noqa: E731
    assert act(torch_path) > 5 * act(kernel_path)


def test_kernel_path_keeps_one_scan_pair_per_2048_steps() -> None:
    """mamba-ssm's selective_scan_cuda saves fp32 (b, I, ceil(s/2048), 2N) intermediates: a step at s = 2049."""

    def scan(s: int) -> float:
        from memsim_widget.engine.activations import activations
        from memsim_widget.engine.context import Context

        ctx = Context(Scenario.from_dict({"model": "mamba-130m", "seq_len": s}))
        return next(t.bytes for t in activations(ctx).per_layer if "scan intermediates" in t.name)

    assert scan(2048) == scan(1) == 4 * 1536 * 2 * 16
    assert scan(2049) == 2 * scan(2048)


@pytest.mark.parametrize(
    ("keys", "field"),
    [
        ({"method": "qlora", "lora": {"targets": ["in_proj"]}}, "method"),
        # peft refuses out_proj and conv1d on Mamba-based models (and all-linear reaches out_proj)
        ({"method": "lora", "lora": {"targets": ["in_proj", "out_proj"]}}, "lora.targets"),
        ({"method": "lora", "lora": {"targets": ["all-linear"]}}, "lora.targets"),
        # MambaMixer reads dt_proj.weight (both paths) and x_proj.weight (kernel path) itself: nothing would train
        ({"method": "lora", "lora": {"targets": ["dt_proj"]}, "ssm_kernel": "torch"}, "lora.targets"),
        ({"method": "lora", "lora": {"targets": ["x_proj", "dt_proj"]}}, "lora.targets"),
        # Mamba-2 checkpointing: traced in bf16, fp16, fp32 and under autocast, full and LoRA; not FSDP2-style mixed
        (
            {"model": "mamba2-130m", "activation_checkpointing": "full", "precision": "mixed-bf16"},
            "activation_checkpointing",
        ),
        ({"activation_checkpointing": "selective-op"}, "activation_checkpointing"),
        ({"activation_checkpointing": "selective"}, "activation_checkpointing"),
        ({"framework": "megatron"}, "framework"),
        ({"ssm_kernel": "triton"}, "ssm_kernel"),
    ],
)
def test_untraced_combinations_are_refused(keys: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        _est(**keys)
    assert err.value.field == field


@pytest.mark.parametrize(
    "keys",
    [
        {"precision": "amp-bf16"},
        {"activation_checkpointing": "full"},
        {"activation_checkpointing": "full", "precision": "amp-bf16"},
        {"method": "lora", "lora": {"targets": ["in_proj"]}, "precision": "fp32"},
        {"method": "lora", "lora": {"targets": ["in_proj"]}, "precision": "amp-bf16"},
        {"method": "lora", "lora": {"targets": ["x_proj"]}, "ssm_kernel": "torch"},
        {"model": "mamba2-130m", "method": "lora", "lora": {"targets": ["in_proj"]}, "precision": "fp32"},
        {"model": "mamba2-130m", "precision": "amp-bf16"},
        {"model": "mamba2-130m", "activation_checkpointing": "full"},
        {"model": "mamba2-130m", "activation_checkpointing": "full", "precision": "fp32"},
        {"model": "mamba2-130m", "activation_checkpointing": "full", **_LORA2},
        {"model": "mamba2-130m", "method": "lora", "lora": {"targets": ["in_proj"]}, "precision": "amp-bf16"},
        {"model": "mamba2-130m", "activation_checkpointing": "full", "precision": "amp-bf16"},
        {"model": "mamba2-130m", "activation_checkpointing": "full", "precision": "amp-fp16"},
        {"model": "mamba2-130m", "activation_checkpointing": "full", "precision": "amp-bf16", **_LORA2},
        {"model": "mamba2-130m", "activation_checkpointing": "full", "precision": "fp32", **_LORA2},
    ],
    ids=str,
)
def test_traced_combinations_are_estimated(keys: dict[str, Any]) -> None:
    """Autocast, full checkpointing and LoRA in every precision on Mamba and Mamba-2: held to the traces in
    docs/fidelity.md (issue 26), so estimated, not refused."""
    assert _est(**keys).peak_tensor_bytes > 0


def test_mamba2_under_autocast_keeps_the_einsum_operands_in_bf16() -> None:
    """Autocast runs the SSD's einsums in bf16: their operand copies and G are 2 B where bf16 training keeps them
    in fp32 (the scan upcasts first), and the conv keeps a bf16 copy of its input, not in_proj's whole output.
    b2 s512 on MAMBA2 (b=2, H=8, s'=512, l=64, N=16, I=512, c=8 chunks, G=2): per layer the SSD saves
    4 b H s' l + 8 b s' H N + 6 b s' I + 2 b c I N + 2 b (c + 1) I N + 2 b H (c + 1)^2 bytes fewer, the conv
    2 B x T x (proj - (I + 2GN)) fewer (traced: +19.02% -> -0.02%)."""
    from fidelity_cases import MAMBA2

    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    def term(precision: str, prefix: str) -> float:
        sc = Scenario.from_dict(
            {
                "model": MAMBA2,
                "ssm_kernel": "torch",
                "micro_batch_size": 2,
                "seq_len": 512,
                "precision": precision,
            }
        )
        (t,) = [t for t in activations(Context(sc)).per_layer if t.name.startswith(prefix)]
        return t.bytes

    b, H, sp, l, N, inner, c, T = 2, 8, 512, 64, 16, 512, 8, 1024
    ssd = "Mamba-2 torch path: SSD chunk tensors"
    fewer = 4 * b * H * sp * l + 8 * b * sp * H * N + 6 * b * sp * inner + 2 * b * c * inner * N
    fewer += 2 * b * (c + 1) * inner * N + 2 * b * H * (c + 1) ** 2
    assert term("bf16", ssd) - term("amp-bf16", ssd) == fewer == 6_851_104
    conv_in = term("bf16", "Mamba-2 torch path: in_proj output") - term(
        "amp-bf16", "Mamba-2 torch path: conv input"
    )
    assert conv_in == 2 * T * (1096 - 576)  # in_proj's 2I + 2GN + H columns against the conv's I + 2GN


def test_autocast_runs_softplus_in_fp32_so_dt_is_saved_in_fp32() -> None:
    """softplus is on CUDA autocast's fp32 list: under amp the scan's dt + bias and softplus(dt) are saved as
    fp32, 2 x 4 B x T x I, against 2 x 2 B x T x I in bf16 (mamba amp b2 s64: -1.08% -> -0.18% of the trace)."""
    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    def term(precision: str) -> float:
        sc = Scenario.from_dict(
            {"model": "mamba-130m", "ssm_kernel": "torch", "seq_len": 64, "precision": precision}
        )
        return next(t.bytes for t in activations(Context(sc)).per_layer if "softplus" in t.name)

    T, inner = 64, 1536  # mamba-130m: hidden 768, expand 2
    assert term("amp-bf16") - term("bf16") == (4 - 2) * 2 * T * inner


def test_step_time_counts_the_scan_not_attention() -> None:
    arch = architecture_for("mamba-130m")
    f = model_flops(arch)
    assert f.attention_layers == 0
    inner, n = 1536, 16
    assert (
        f.attention_per_layer(2048) == f.attention_per_layer(1) == 9 * inner * n + 2 * inner + 2 * 4 * inner
    )
    # A_log [I, N] is a parameter, not a matmul weight: the layer's Linears are in_proj, x_proj, dt_proj, out_proj
    linears = 2 * inner * 768 + (48 + 32) * inner + inner * 48 + 768 * inner
    assert f.linear_per_layer == 2 * linears
    est = _est("mamba-130m")
    assert est.step_time_s > 0 and any("state-space scan" in c for c in est.time_caveats)


def test_mamba2_presets_are_the_published_sizes_and_heads_must_fill_the_inner_width() -> None:
    sizes = {p: round(architecture_for(p).parameters / 1e6) for p in MAMBA2_PRESETS}
    assert sizes == {
        "mamba2-130m": 129,
        "mamba2-370m": 368,
        "mamba2-780m": 780,
        "mamba2-1.3b": 1344,
        "mamba2-2.7b": 2703,
        "mamba-codestral-7b": 7285,
    }
    with pytest.raises(ScenarioError) as err:
        build_architecture({**TINY2, "num_heads": 4})
    assert err.value.field == "model.num_heads"


def test_mamba2_kernel_path_saves_inputs_only_and_torch_path_grows_with_the_chunk() -> None:
    """mamba-ssm's fused Mamba-2 function saves zxbcdt, out_x and rstd: linear in s, chunk size irrelevant; the
    torch SSD keeps b x H x s x l fp32 decays, so a longer chunk costs more."""
    act = lambda e: sum(i.bytes for i in e.worst.items if i.category == "activations")  # noqa: E731

    def est(kernel: str, chunk: int, s: int = 1024):  # noqa: ANN202
        model = {**PRESETS["mamba2-130m"], "chunk_size": chunk}
        return _est(model, ssm_kernel=kernel, seq_len=s, micro_batch_size=4)

    assert act(est("cuda", 64)) == act(est("cuda", 256))
    assert act(est("torch", 256)) > act(est("torch", 64)) > act(est("cuda", 64))
    assert any("not traced" in c for c in est("cuda", 64).caveats)


@pytest.mark.parametrize("typed", ["bamba", "zamba2", "Mamba", "falcon_mamba", "mamba3", "Mamba-2"])
def test_no_hint_maps_another_structure_to_mamba(typed: str) -> None:
    msg = str(unknown_model_type(typed))
    if typed == "Mamba":
        assert "did you mean 'mamba'" in msg
    elif typed == "Mamba-2":
        assert "did you mean 'mamba2'" in msg
    else:
        assert "did you mean" not in msg


def test_trace_refuses_the_cuda_path_and_runs_the_torch_path() -> None:
    pytest.importorskip("torch")
    from memsim_widget.trace.traceable import check_traceable

    with pytest.raises(ScenarioError) as err:
        check_traceable(Scenario.from_dict({"model": "mamba-130m", "seq_len": 64}))
    assert err.value.field == "ssm_kernel"


@pytest.mark.parametrize(
    "name",
    [
        "mamba torch bf16 b2 s64",
        "mamba2 torch bf16 b2 s512",
        "mamba2 torch bf16 lora in_proj b2 s512",
        "mamba2 torch V32k bf16 b2 s256 (outputs kept: backward; the model returns fp32 logits)",
        "mamba torch amp-bf16 b2 s64",
        "mamba torch bf16 ckpt b2 s64",
        "mamba torch fp32 ckpt b2 s64",
        "mamba torch amp-bf16 ckpt b2 s64",
        "mamba torch fp32 lora in_proj b2 s64",
        "mamba torch amp-bf16 lora in_proj b2 s64",
        "mamba torch bf16 lora in_proj b1 s128",
        "mamba torch bf16 lora in_proj ckpt b2 s64",
        "mamba torch V50280 amp-bf16 b2 s64 (the real vocabulary; outputs kept: step, fp32 logits)",
        "mamba2 torch fp32 lora in_proj b2 s256",
        "mamba2 torch amp-bf16 b2 s512",
        "mamba2 torch amp-bf16 b2 s256 (16 heads of 32, N=24, chunks of 32)",
        "mamba2 torch amp-bf16 lora in_proj b2 s512",
        "mamba2 torch V50288 amp-bf16 b2 s256 (the real vocabulary; outputs kept: backward, fp32 logits)",
        "mamba2 torch bf16 ckpt b2 s512",
        "mamba2 torch fp32 ckpt b2 s256",
        "mamba2 torch bf16 lora in_proj ckpt b2 s512",
    ],
)
@pytest.mark.slow
def test_torch_path_within_three_percent_of_trace(name: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r


def test_lora_on_mamba_keeps_no_input_of_a_frozen_matmul() -> None:
    """Mamba (v1) under LoRA on in_proj, torch path: the frozen x_proj, D skip and out_proj keep none of their
    inputs (ec B x T x I each) and A = -exp(A_log) is kept once (4 B x I x N fewer); traced: fp32 +3.59% ->
    -0.19%, in_proj + x_proj bf16 +0.74% -> -0.00%."""
    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    base = {"model": "mamba-130m", "ssm_kernel": "torch", "micro_batch_size": 2, "seq_len": 64}
    lora = {**base, "method": "lora", "lora": {"targets": ["in_proj"]}}

    def mixer(keys: dict[str, Any]) -> float:
        terms = activations(Context(Scenario.from_dict(keys))).per_layer
        return sum(t.bytes for t in terms if t.name.startswith("Mamba torch path"))

    T, inner, N = 128, 1536, 16  # mamba-130m: hidden 768, expand 2, state 16
    assert mixer(base) - mixer(lora) == 3 * 2 * T * inner + 4 * inner * N


def test_cli_takes_ssm_kernel_and_prints_which_path(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from memsim_widget.cli import main

    assert (
        main(["estimate", "--model", "mamba-130m", "--seq-len", "512", "--ssm-kernel", "torch", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["ssm_kernel"] == "torch"
    assert any("held to a CPU fake-tensor trace" in c for c in out["caveats"])
    assert main(["estimate", "--model", "mamba-130m", "--seq-len", "512"]) == 0
    assert "not traced" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("model", "precision", "logit_bytes"),
    [
        ("mamba2-130m", "bf16", 4),
        ("mamba-130m", "bf16", 4),
        ("jamba-v0.1", "bf16", 2),
        ("mamba2-130m", "amp-bf16", 4),
        ("mamba-130m", "amp-bf16", 4),
        ("jamba-v0.1", "amp-bf16", 2),
    ],
)
def test_a_kept_model_output_holds_the_logits_in_the_dtype_the_model_returns(
    model: str, precision: str, logit_bytes: int
) -> None:
    """MambaForCausalLM and Mamba2ForCausalLM return ``lm_head(h).float()``: a loop that keeps the output keeps
    4 B x T x V (traced: mamba2 V32k b2 s256 -7.38% before, -0.06% after), under autocast too (traced at the real
    vocabularies, 50280 and 50288); Jamba returns the matmul's output, bf16 in both (traced at 65536)."""
    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    sc = Scenario.from_dict(
        {
            "model": model,
            "micro_batch_size": 2,
            "seq_len": 256,
            "output_lifetime": "backward",
            "precision": precision,
        }
    )
    ctx = Context(sc)
    (term,) = activations(ctx).output_logits
    assert term.bytes == logit_bytes * 2 * 256 * ctx.arch.vocab_size


def test_lora_on_mamba2_drops_what_only_the_frozen_weights_gradients_read() -> None:
    """Per layer, on the torch path (saved-tensor hooks on transformers' Mamba2Mixer, then traced): the D skip's
    fp32 x and the norm's fp32 normalised tensor (4 B x T x I each), one fp32 dt (4 B x T x H), out_proj's input
    (2 B x T x I) and one fp32 A (4 B x H); adapters on in_proj are tiny beside them."""
    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    model = {**PRESETS["mamba2-130m"]}
    base = {"model": model, "ssm_kernel": "torch", "micro_batch_size": 2, "seq_len": 512}
    full = activations(Context(Scenario.from_dict(base)))
    lora = activations(
        Context(Scenario.from_dict({**base, "method": "lora", "lora": {"targets": ["in_proj"]}}))
    )
    mixer = lambda b: sum(t.bytes for t in b.per_layer if t.name.startswith("Mamba-2 torch path"))  # noqa: E731
    T, inner, H = 1024, 1536, 24  # mamba2-130m: hidden 768, expand 2, 24 heads of 64
    assert mixer(full) - mixer(lora) == (4 + 4 + 2) * T * inner + 4 * T * H + 4 * H


def _mamba2_ckpt_terms(**keys: Any) -> dict[str, int]:
    """The checkpointed Mamba-2 (fidelity shape: h=256, 4 layers, I=512, G=2; b2 s512, torch path) at the top
    layer's backward, item by item."""
    from fidelity_cases import MAMBA2

    sc = {"model": MAMBA2, "ssm_kernel": "torch", "micro_batch_size": 2, "seq_len": 512, **keys}
    est = estimate(Scenario.from_dict({**sc, "activation_checkpointing": "full"}))
    top = next(m for m in est.worst.moments if m.name == "backward_top")
    return {it.item: it.bytes for it in top.items}


def test_checkpointed_mamba2_keeps_fp32_block_outputs_and_the_gated_norms_backward() -> None:
    """Full checkpointing, bf16, b2 s512 (T=1024): every Mamba2Block returns residual.float() + mixer(...), so the
    top layer's backward sees the embedding's bf16 output and three fp32 block outputs as checkpoint inputs
    (traced: 524,288 + 3 x 1,048,576); its recomputed gated RMSNorm's backward holds five fp32 (b, s, G, I/G)
    gradients (5 x 4 B x T x I) once out_proj's bf16 input (2 B x T x I), one fp32 T x I of the chain and rstd
    (4 B x T x G) are freed, beside out_proj's and the norm's bf16 weight gradients and the fp32 residual gradient
    (the listing of the trace's live tensors at its peak, op mul)."""
    T, h, inner, G = 1024, 256, 512, 2
    items = _mamba2_ckpt_terms()
    kept = next(v for k, v in items.items() if k.startswith("checkpointed layer inputs"))
    assert kept == 2 * T * h + 3 * 4 * T * h == 3_670_016
    bwd = next(v for k, v in items.items() if k.startswith("Mamba-2 torch path backward"))
    freed = 2 * T * inner + 4 * T * inner + 4 * T * G
    grads = 2 * (h * inner + inner)
    assert bwd == 5 * 4 * T * inner - freed + grads + 4 * T * h == 8_643_584
    # fp32: the residual stream is already fp32, every input 4 B x T x h
    items32 = _mamba2_ckpt_terms(precision="fp32")
    kept32 = next(v for k, v in items32.items() if k.startswith("checkpointed layer inputs"))
    assert kept32 == 4 * 4 * T * h


def test_checkpointed_mamba2_under_lora_frees_only_rstd_before_the_norms_backward_peak() -> None:
    """LoRA on in_proj, bf16, b2 s512: the frozen out_proj and norm keep neither out_proj's input nor the fp32
    normalised tensor, so nothing of them is freed before the gated norm's backward peak but rstd, and no weight
    gradient is made (traced: the five fp32 (b, s, G, I/G) gradients beside the fp32 residual gradient, +0.02%)."""
    T, h, inner, G = 1024, 256, 512, 2
    items = _mamba2_ckpt_terms(method="lora", lora={"rank": 8, "targets": ["in_proj"]})
    bwd = next(v for k, v in items.items() if k.startswith("Mamba-2 torch path backward"))
    assert bwd == 5 * 4 * T * inner - 4 * T * G + 4 * T * h == 11_526_144


def test_checkpointed_mamba_keeps_fp32_block_outputs_like_mamba2() -> None:
    """MambaBlock returns residual.float() + mixer(...) under residual_in_fp32 as Mamba2Block does: with full
    checkpointing in bf16 layers 1..3 keep fp32 inputs (4 B x T x h) and layer 0 the embedding's bf16 output;
    at the top of backward (LoRA b2 s64, T=128: its peak) the four inputs are 65,536 + 3 x 131,072 B, the
    activations the trace lists there (-0.51% -> -0.00%; the engine counted 2 B for all)."""
    from fidelity_cases import MAMBA

    T, h = 128, 256
    sc = {"model": MAMBA, "ssm_kernel": "torch", "micro_batch_size": 2, "seq_len": 64, **_LORA2}
    est = estimate(Scenario.from_dict({**sc, "activation_checkpointing": "full"}))
    top = next(m for m in est.worst.moments if m.name == "backward_top")
    kept = next(it.bytes for it in top.items if it.item.startswith("checkpointed layer inputs"))
    assert kept == 2 * T * h + 3 * 4 * T * h == 458_752


_TIED_HEAD = (
    "the tied embedding's gradient made by the head (held by autograd until the embedding's backward)"
)
_TIED_SUM = "the tied embedding's two gradients (the head's and its own) beside their sum"


def _moment_items(sc: dict[str, Any], moment: str) -> dict[str, int]:
    est = estimate(Scenario.from_dict(sc))
    return {it.item: it.bytes for it in next(m for m in est.worst.moments if m.name == moment).items}


def test_a_tied_embeddings_gradient_is_made_at_the_head_and_summed_at_the_bottom() -> None:
    """Tied Mamba-2: the head's mm backward makes a V x h gradient at the top of backward that autograd holds until
    the embedding's backward makes the other and sums them out of place (traced: the [V, h] mm temporary live at
    the gated norm's peak, bf16 ckpt b1 s1000 -0.82% -> +0.01%; at V=32000 the peak is the sum, op add, where
    the two parts stand beside every gradient: -11.70% -> +0.00%). Untied, or under LoRA, no such gradient."""
    from fidelity_cases import MAMBA2

    V, h = 1000, 256
    tied = {**MAMBA2, "tie_word_embeddings": True, "conv_kernel": 3, "use_bias": True}
    sc = {"model": tied, "ssm_kernel": "torch", "micro_batch_size": 1, "seq_len": 1000, **_CKPT_FULL}
    for moment in ("backward_top", "backward_end"):
        assert _moment_items(sc, moment)[_TIED_HEAD] == 2 * V * h == 512_000
    big = {
        "model": {**tied, "vocab_size": 32000},
        "ssm_kernel": "torch",
        "micro_batch_size": 1,
        "seq_len": 64,
    }
    bottom = _moment_items({**big, **_CKPT_FULL}, "backward_end")
    assert bottom[_TIED_SUM] == 2 * 2 * 32000 * h == 32_768_000
    assert bottom["gradients"] > 2 * 32000 * h  # every gradient made, the sum among them
    untied = _moment_items({**sc, "model": {**tied, "tie_word_embeddings": False}}, "backward_top")
    lora = _moment_items({**sc, **_LORA2}, "backward_top")
    assert _TIED_HEAD not in untied and _TIED_HEAD not in lora


#: The SSD's locals live at its output copy (b2 s512 on MAMBA2: T=1024, h=256, I=512, G=2, N=16, H=8, l=64,
#: c=8, s'=512; in_proj's output 2I + 2GN + H = 1096 wide, the conv's I + 2GN = 576): the trace's listing of
#: the recomputed layer's tensors alive at the peak and freed before its recompute ends (17 tensors; the conv
#: bias's 1,152 B bf16 copy is not counted)
_SSD_LOCALS = (
    4 * 1024 * 256  # the block norm's fp32 output
    + 2 * 1024 * (1096 + 576)  # in_proj's output, the conv's SiLU output
    + 4 * 2 * 512 * (2 * 512 + 2 * 8 + 2 * 8 * 16 + 8 * 64)  # D skip, x dt; A dt, cumsum; C, B x decay; M
    + 2 * 2 * (512 * 512 + 512 * 16 + 9 * 512 * 16)  # Y_diag, the zero initial state, the recurrence's output
    + 3 * 4 * 2 * 512 * 512  # Y_off, Y_diag + Y_off, its contiguous copy
)


def _item(items: dict[str, int], start: str) -> int:
    return next(v for k, v in items.items() if k.startswith(start))


def test_checkpointed_mamba2_under_autocast_peaks_at_the_recomputed_ssd_output() -> None:
    """amp-bf16, full checkpointing, b2 s512: the peak is in the bottom layer's recompute, at the .contiguous()
    copy of Y_diag + Y_off (traced, op clone), not in the gated norm's backward: the SSD's locals (19,546,112 B)
    beside what the recompute saved so far, i.e. the layer's saved set less what the gated norm and out_proj
    save after it (the norm's fp32 chain, rstd, out_proj's bf16 input and weight copy: the trace's 11,804,672 B
    saved after the peak), with the incoming fp32 residual gradient and its bf16 cast for the mixer's output."""
    T, h, inner, G = 1024, 256, 512, 2
    assert _SSD_LOCALS == 19_546_112
    items = _mamba2_ckpt_terms(precision="amp-bf16")
    later = 5 * 4 * T * inner + 2 * T * inner + 4 * T * G + 2 * h * inner
    assert later == 11_804_672
    ssd = _item(items, "Mamba-2 torch path: the recomputed layer at its SSD output")
    assert ssd == _SSD_LOCALS - later + (4 + 2) * T * h == 9_314_304
    # the gated norm's backward (8,643,584 B, as in bf16) is the smaller: not an item then
    assert not any(k.startswith("Mamba-2 torch path backward") for k in items)
    # under LoRA the norm and out_proj keep less (no out_proj input, no normalised tensor, no weight copy of
    # theirs), and the frozen in_proj's bf16 weight copy is live (a frozen Linear's copy is not in the saved set)
    lora = _mamba2_ckpt_terms(precision="amp-bf16", method="lora", lora={"rank": 8, "targets": ["in_proj"]})
    ssd_lora = _item(lora, "Mamba-2 torch path: the recomputed layer at its SSD output")
    assert ssd_lora == _SSD_LOCALS - (4 * 4 * T * inner + 4 * T * G) + 2 * h * 1096 + 6 * T * h == 13_283_328


@pytest.mark.parametrize("keys", [{"precision": "amp-bf16"}, {"precision": "fp32", **_LORA2}], ids=str)
def test_checkpointed_fp32_stream_counts_the_recomputed_norms_input_once(keys: dict[str, Any]) -> None:
    """With an fp32 residual stream (autocast, fp32) the recomputed block's RMSNorm saves its fp32 input as is,
    the checkpointed input itself: at the top of backward every layer's input is kept (4 x 4 B x T x h) and the
    recomputed layer adds the rsqrt only (4 B x T), where it counted the input a second time (traced, LoRA fp32
    b2 s256: +1.52% -> -0.04%); at the bottom layer 0's input once, as before."""
    T, h = 1024, 256
    sc = {"model": _mamba2_model(), "ssm_kernel": "torch", "micro_batch_size": 2, "seq_len": 512}
    est = estimate(Scenario.from_dict({**sc, "activation_checkpointing": "full", **keys}))
    for moment, inputs in (("backward_top", 4), ("backward_end", 1)):
        items = {it.item: it.bytes for it in next(m for m in est.worst.moments if m.name == moment).items}
        assert items["checkpointed layer inputs"] == inputs * 4 * T * h
        assert items["RMSNorm rsqrt (its fp32 input is the checkpointed input, kept once)"] == 4 * T
        assert not any(k.startswith("RMSNorm fp32 inputs") for k in items)


def _mamba2_model() -> dict[str, Any]:
    from fidelity_cases import MAMBA2

    return MAMBA2


@pytest.mark.parametrize(
    "name",
    [
        "mamba2 torch bf16 ckpt b2 s512",
        "mamba2 torch fp32 ckpt b2 s256",
        "mamba2 torch bf16 lora in_proj ckpt b2 s512",
        "mamba2 torch V64 bf16 b2 s512 (peak in a layer's backward)",
        "mamba2 torch amp-bf16 ckpt b2 s512",
        "mamba2 torch amp-fp16 ckpt b2 s512",
        "mamba2 torch amp-bf16 ckpt b2 s256 (16 heads of 32, N=24, chunks of 32)",
        "mamba2 torch amp-bf16 lora in_proj ckpt b2 s512",
        "mamba2 torch amp-bf16 lora in_proj ckpt b1 s1000 (padded last chunk)",
        "mamba2 torch fp32 lora in_proj ckpt b2 s256",
        "mamba2 torch fp32 lora in_proj ckpt b1 s1000 (padded last chunk)",
    ],
)
@pytest.mark.slow
def test_checkpointed_mamba2_within_one_percent_of_trace(name: str) -> None:
    """The lifted checkpointed Mamba-2 combinations (and the uncheckpointed row whose peak is in the same gated
    norm backward) held to 1% of the fake-tensor trace of Mamba2ForCausalLM with HF gradient checkpointing."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.01, r


@pytest.mark.parametrize(
    "name",
    [
        "mamba2 torch bf16 ckpt b1 s1000 (padded last chunk, tied, K=3, biases)",
        "mamba2 torch amp-bf16 ckpt b1 s1000 (padded last chunk, tied, K=3, biases)",
        "mamba2 torch V32k tied bf16 ckpt b1 s64 (peak at the tied gradients' sum)",
        "mamba2 torch V32k tied amp-bf16 sgd b1 s64 (peak at the tied gradients' sum)",
        "mamba torch V32k tied bf16 ckpt sgd b1 s16 (peak at the tied gradients' sum)",
    ],
)
@pytest.mark.slow
def test_tied_embeddings_within_one_percent_of_trace(name: str) -> None:
    """Tied state-space models held to 1% of the trace where the head's gradient of the tied weight is live (the
    gated norm's backward, the recomputed SSD output) and where the peak is the embedding's backward summing it."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.01, r
