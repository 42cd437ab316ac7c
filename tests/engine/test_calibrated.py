"""Issue 12 item 3: a transformers model type no family models, counted on the meta device and calibrated from
tiny fake-tensor traces; held to a full trace of the whole model at a (b, s) not used in the fit.

Model types chosen because no family here models them and none is being added (OPT: LayerNorm, ReLU, learned
positions, tied head; GPT-J: parallel attention/MLP, partial rotary, untied head with bias; StableLM: SwiGLU, GQA,
LayerNorm, partial rotary).
"""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from memsim_widget import calibrate  # noqa: E402
from memsim_widget.architecture import FAMILIES, build_architecture  # noqa: E402
from memsim_widget.cli import main  # noqa: E402
from memsim_widget.engine.core import estimate  # noqa: E402
from memsim_widget.errors import ScenarioError  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

OPT = dict(model_type="opt", hidden_size=128, num_hidden_layers=5, ffn_dim=512, num_attention_heads=4,
           vocab_size=3000, word_embed_proj_dim=128, max_position_embeddings=2048)  # fmt: skip
GPTJ = dict(
    model_type="gptj", n_embd=128, n_layer=4, n_head=4, vocab_size=3000, rotary_dim=16, n_positions=2048
)
STABLELM = dict(model_type="stablelm", hidden_size=128, num_hidden_layers=4, intermediate_size=320,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=3000)  # fmt: skip
#: Largest error of the calibrated peak against a full trace of the whole model at a held-out (b, s).
TOLERANCE = 0.01


def _trace(cfg: dict, sc: dict):  # noqa: ANN202
    from memsim_widget.trace.hf import trace_hf

    kw = {"precision": sc.get("precision", "bf16"), "attention": sc.get("attention", "sdpa")}
    kw["gradient_checkpointing"] = sc.get("activation_checkpointing") == "full"
    if sc.get("method") == "lora":
        kw["lora"] = {
            "r": 16,
            "lora_alpha": 32,
            "target_modules": ["q_proj", "v_proj"],
            "adapter_dtype": "fp32",
        }
    return trace_hf(
        dict(cfg), micro_batch_size=sc["micro_batch_size"], seq_len=sc["seq_len"], progress=False, **kw
    )


def test_test_types_are_not_modelled_by_a_family():
    assert not {"opt", "gptj", "stablelm"} & set(FAMILIES)


@pytest.mark.parametrize(
    ("cfg", "sc"),
    [
        (OPT, {"micro_batch_size": 4, "seq_len": 640}),
        (GPTJ, {"micro_batch_size": 2, "seq_len": 448, "activation_checkpointing": "full"}),
        (GPTJ, {"micro_batch_size": 3, "seq_len": 320, "precision": "fp32", "attention": "eager"}),
        (STABLELM, {"micro_batch_size": 3, "seq_len": 704, "method": "lora"}),
        (STABLELM, {"micro_batch_size": 2, "seq_len": 384, "precision": "amp-bf16"}),
    ],
    ids=["opt-bf16", "gptj-ckpt", "gptj-fp32-eager", "stablelm-lora", "stablelm-amp"],
)
@pytest.mark.slow
def test_calibrated_peak_matches_a_full_trace(cfg, sc):
    est = estimate(Scenario.from_dict({"model": cfg, "precision": "bf16", **sc}))
    tr = _trace(cfg, sc)
    adapters = tr.trainable_parameters if sc.get("method") == "lora" else 0
    assert (
        est.parameters == tr.parameters - adapters
    )  # exact, tied weights once (the trace counts the adapters)
    assert est.trainable_parameters == tr.trainable_parameters
    assert est.calibration["residual"] < 0.02
    err = (est.peak_tensor_bytes - tr.peak_bytes) / tr.peak_bytes
    assert abs(err) < TOLERANCE, (est.peak_tensor_bytes, tr.peak_bytes, err)


def test_parameters_by_role_from_the_meta_model():
    arch = build_architecture(STABLELM)
    by = arch.parameters_by_kind()
    h, inter, kv, layers, v = 128, 320, 64, 4, 3000
    assert by["embedding"] == v * h and by["head"] == v * h  # untied
    assert by["attention"] == layers * (h * h * 2 + 2 * h * kv)
    assert by["mlp"] == layers * 3 * h * inter
    assert by["norm"] == layers * 2 * 2 * h + 2 * h  # LayerNorm weight and bias
    assert {g.module for g in arch.params if g.module} >= {"q_proj", "k_proj", "v_proj", "o_proj", "up_proj"}
    assert build_architecture(OPT).tied_embeddings and arch.family == "calibrated"


@pytest.mark.slow
def test_labels_in_caveats_json_frame_and_cli(tmp_path, capsys):
    sc = {"model": GPTJ, "micro_batch_size": 2, "seq_len": 512}
    est = estimate(Scenario.from_dict(sc))
    assert any(c.startswith("calibrated from a trace") and "saved bytes/layer = " in c for c in est.caveats)
    d = est.to_dict()
    assert d["model"]["calibration"]["source"] == "calibrated from a trace"
    assert "calibrated from a trace" in d["caveats"][0]
    frame = est.frame
    assert (
        set(frame["source"]) == {"calibrated from a trace"} and frame.attrs["calibration"]["residual"] < 0.02
    )
    path = tmp_path / "sc.json"
    path.write_text(json.dumps(sc))
    assert main(["estimate", str(path)]) == 0
    assert "calibrated from a trace" in capsys.readouterr().out
    assert main(["estimate", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["family"] == "calibrated" and out["model"]["calibration"]["held_out"]["s"] == 512


@pytest.mark.slow
def test_fit_cached_per_config_and_recipe():
    cfg = {**GPTJ, "n_layer": 3}
    estimate(Scenario.from_dict({"model": cfg, "micro_batch_size": 1, "seq_len": 256}))
    before = dict(calibrate.TRACE_COUNT)
    est = estimate(Scenario.from_dict({"model": cfg, "micro_batch_size": 5, "seq_len": 999}))
    assert est.peak_tensor_bytes > 0 and before == calibrate.TRACE_COUNT  # no new trace: same config, recipe


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [("parallel", {"tp": 2}, "parallel.tp"), ("parallel", {"pp": 2}, "parallel.pp"),
     ("method", "qlora", "method"), ("framework", "torchtitan", "framework")],
)  # fmt: skip
def test_what_needs_module_structure_is_refused(key, value, field):
    with pytest.raises(ScenarioError) as e:
        estimate(Scenario.from_dict({"model": GPTJ, key: value, "seq_len": 256}))
    assert e.value.field == field


def test_zero_sharding_works_from_counts():
    one = estimate(Scenario.from_dict({"model": GPTJ, "seq_len": 256}))
    z3 = estimate(Scenario.from_dict({"model": GPTJ, "seq_len": 256, "parallel": {"dp": 4, "zero": 3}}))
    assert z3.peak_tensor_bytes < one.peak_tensor_bytes


def test_unknown_to_transformers_keeps_the_refusal():
    with pytest.raises(ScenarioError, match="not a supported model type; supported: bert") as e:
        build_architecture({"model_type": "notamodel"})
    assert "did you mean" not in str(e.value)
    with pytest.raises(ScenarioError, match="did you mean 'llama'"):
        build_architecture({"model_type": "lama"})


@pytest.mark.parametrize("missing", ["transformers", "torch"])
def test_without_transformers_a_clear_refusal(monkeypatch, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # importing it raises ImportError
    with pytest.raises(ScenarioError, match="'xglm' is not a supported model type; supported: .*llama") as e:
        build_architecture({"model_type": "xglm", "d_model": 64})
    assert "did you mean" not in str(e.value)


def test_planner_refuses_a_calibrated_model():
    from memsim_widget.plan.search import plan

    with pytest.raises(ScenarioError, match="calibrated from a trace: the planner is not") as e:
        plan(model=GPTJ, gpus=2, seq_len=256)
    assert e.value.field == "model"


def test_widget_verdict_carries_the_label():
    pytest.importorskip("anywidget")
    from memsim_widget.widget import MemSim

    sim = MemSim(model=GPTJ, seq_len=256, charts_js=False)
    assert any("calibrated from a trace" in c for c in sim.result["caveats"])


@pytest.mark.slow
def test_disk_cache_serves_a_new_process(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMSIM_CALIBRATION_CACHE", str(tmp_path))
    cfg = {**STABLELM, "num_hidden_layers": 3}
    key = ("bf16", "sdpa", None, False)
    fit = build_architecture(cfg).extra["calibration"].fit(key)
    assert len(list(tmp_path.glob("*.json"))) == 1
    monkeypatch.setattr(calibrate, "_FITS", {})  # as a fresh process: only the disk copy is left
    before = dict(calibrate.TRACE_COUNT)
    assert build_architecture(cfg).extra["calibration"].fit(key) == fit and before == calibrate.TRACE_COUNT


def test_blocks_that_differ_are_refused():
    """Qwen2-MoE with a dense first block: a 2- and 3-block copy would stand for blocks it never traced."""
    cfg = {"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "moe_intermediate_size": 32,
           "shared_expert_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 1000,
           "mlp_only_layers": [0]}  # fmt: skip
    with pytest.raises(ScenarioError, match="blocks are not all alike"):
        build_architecture(cfg)


@pytest.mark.slow
def test_the_layer_count_alias_shrinks_too():
    """GPT-J's config reads num_hidden_layers as n_layer: the 2- and 3-block copies must replace either spelling."""
    alias = {k: v for k, v in GPTJ.items() if k != "n_layer"} | {"num_hidden_layers": GPTJ["n_layer"]}
    sc = {"micro_batch_size": 2, "seq_len": 512}
    a = estimate(Scenario.from_dict({"model": alias, **sc}))
    b = estimate(Scenario.from_dict({"model": GPTJ, **sc}))
    assert a.peak_tensor_bytes == b.peak_tensor_bytes and a.calibration["held_out"]["blocks"] == 4


def test_preference_objectives_are_refused():
    with pytest.raises(ScenarioError) as e:
        estimate(Scenario.from_dict({"model": GPTJ, "seq_len": 256, "objective": "dpo"}))
    assert e.value.field == "objective" and "calibrated" in str(e.value)
