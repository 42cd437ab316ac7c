"""The MemSim widget's Python side: traits follow the scenario, errors keep the last result, controls disable.

Run ``python tests/test_widget.py --write-js-fixture`` to refresh ``tests/js/fixtures/state.json`` (the traits
the node tests render) after the trait layout changes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import traitlets
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.optimizers import OPTIMIZERS
from memsim_widget.scenario import Scenario
from memsim_widget.widget import (
    MemSim,
    build_options,
    changed_keys,
    disabled_controls,
    merge,
    normalize,
)

GiB = 1024**3
ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "js" / "fixtures" / "state.json"
CHARTS_FIXTURE = ROOT / "tests" / "js" / "fixtures" / "charts.json"
REPR = re.compile(
    r"^MemSim\([\w.\- ]+ on [\w.\- ]+: (fits|tight|does not fit), peak \d+\.\d GiB at \w+(; rejected [\w.]+)?\)$"
)


def make(*args: Any, **kwargs: Any) -> MemSim:
    """A widget without the vega-embed bundle (the Python side does not need it)."""
    return MemSim(*args, charts_js=False, **kwargs)


def check_consistent(sim: MemSim) -> None:
    """Every derived trait matches a fresh engine run of ``sim.scenario``."""
    est = estimate(sim.scenario)
    assert sim.estimate.device_total_bytes == est.device_total_bytes
    res = sim.result
    assert res["verdict"] == est.verdict(sim.headroom)
    assert res["peaks"][0]["bytes"] == est.device_total_bytes
    assert res["peaks"][2]["bytes"] == est.peak_allocated_bytes
    assert res["peak_moment"] == est.peak_phase
    assert len(res["rows"]) == len(sim.frame) == len(est.rows())
    cap_rule = next(lay for lay in sim.charts["breakdown"]["layer"] if lay["mark"]["type"] == "rule")
    assert cap_rule["data"]["values"][0]["gib"] == pytest.approx(est.gpu.memory_bytes / GiB, abs=1e-3)
    bars = next(lay for lay in sim.charts["breakdown"]["layer"] if lay["mark"]["type"] == "bar")
    assert {r["rank"] for r in bars["data"]["values"]} == {r.label for r in est.ranks}


# ----- construction, API, repr ---------------------------------------------------------------------------
def test_default_widget_is_consistent_and_has_traits() -> None:
    sim = make()
    assert sim.scenario == Scenario()
    assert sim.scenario_data == Scenario().to_dict()
    assert sim.error == "" and sim.error_field == ""
    assert sim.headroom == pytest.approx(0.10)
    assert set(sim.charts) == {"breakdown", "scaling"}
    assert {p["label"] for p in sim.result["peaks"]} == {"nvidia-smi", "reserved", "allocated", "tensors"}
    assert all(p["counter"] for p in sim.result["peaks"])
    assert sim.result["bottleneck"]["text"]
    check_consistent(sim)


def test_constructors_accept_scenario_dict_and_changes(tmp_path: Path) -> None:
    sc = Scenario(model="gpt2", micro_batch_size=8)
    assert make(sc).scenario == sc
    assert make({"model": "gpt2", "micro_batch_size": 8}).scenario == sc
    assert make(model="gpt2", micro_batch_size=8).scenario == sc
    assert make(sc, parallel={"dp": 2}).scenario.parallel.dp == 2
    with pytest.raises(ScenarioError) as info:
        make(parallel={"tp": 3})
    assert info.value.field == "parallel.tp"
    path = tmp_path / "s.json"
    path.write_text(sc.to_json())
    assert MemSim.from_json(path, charts_js=False).scenario == sc
    assert MemSim.from_json(sc.to_json(), charts_js=False).scenario == sc


def test_json_round_trip_through_the_widget(tmp_path: Path) -> None:
    sim = make(
        model="llama-3.2-1b",
        method="lora",
        lora={"rank": 8, "targets": ["q_proj", "k_proj"]},
        parallel={"dp": 4, "zero": 2},
        headroom=0.2,
    )
    text = sim.to_json()
    again = MemSim.from_json(text, charts_js=False, headroom=0.2)
    assert again.scenario == sim.scenario
    assert again.scenario_data == sim.scenario_data
    assert again.result == sim.result
    assert json.loads(text) == sim.scenario_data


def test_repr_is_deterministic_and_displays_as_widget() -> None:
    a, b = make(), make()
    assert repr(a) == repr(b)
    assert REPR.match(repr(a)), repr(a)
    assert "0x" not in repr(a)
    assert repr(a).startswith("MemSim(llama-3.1-8b on h100-sxm-80gb: ")
    assert repr(
        make(
            model={
                "model_type": "llama",
                "hidden_size": 256,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 512,
                "vocab_size": 1000,
            },
            gpu={"memory_gib": 24},
        )
    ).startswith("MemSim(custom llama on custom 24 GiB: ")
    bundle = a._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/plain"] == repr(a)


def test_python_api_estimate_frame_charts(tmp_path: Path) -> None:
    import altair as alt

    sim = make(model="gpt2")
    assert list(sim.frame.columns) == [
        "rank",
        "stage",
        "moment",
        "category",
        "item",
        "bytes",
        "gib",
        "counter",
        "formula",
    ]
    assert isinstance(sim.chart(), alt.LayerChart)
    assert isinstance(sim.scaling_chart(), alt.HConcatChart)
    out = sim.save_chart(tmp_path / "b.svg")
    assert out.read_text().startswith("<svg")
    with pytest.raises(ValueError, match="which"):
        sim.save_chart(tmp_path / "x.svg", which="pie")


def test_set_recomputes_everything() -> None:
    sim = make(model="llama-3.2-1b")
    before = sim.result
    assert sim.set(micro_batch_size=16, seq_len=4096) is sim
    assert sim.scenario.micro_batch_size == 16 and sim.scenario_data["seq_len"] == 4096
    assert sim.result != before
    check_consistent(sim)
    sim.set(parallel={"tp": 2})
    assert sim.scenario.parallel.tp == 2 and sim.scenario.parallel.dp == 1, "partial parallel dict merges"
    assert sim.scenario_data["num_gpus"] == 2


def test_invalid_set_raises_names_field_and_keeps_previous_result() -> None:
    sim = make(model="llama-3.2-1b")
    result, charts, valid = sim.result, sim.charts, sim.scenario
    with pytest.raises(ScenarioError) as info:
        sim.set(parallel={"tp": 3})
    assert info.value.field == "parallel.tp"
    assert sim.error.startswith("parallel.tp: ") and sim.error_field == "parallel.tp"
    assert sim.result == result and sim.charts == charts and sim.scenario == valid
    assert sim.scenario_data["parallel"]["tp"] == 3, "the control keeps the rejected input"
    assert repr(sim).endswith("; rejected parallel.tp)")
    sim.set(parallel={"tp": 2})
    assert sim.error == "" and sim.error_field == ""
    check_consistent(sim)


def test_front_end_writes_do_not_raise() -> None:
    sim = make()
    data = json.loads(json.dumps(sim.scenario_data))
    data["parallel"]["dp"] = 4  # num_gpus in the dict is stale: it follows the layout
    sim.scenario_data = data
    assert sim.error == "" and sim.scenario_data["num_gpus"] == 4
    bad = merge(sim.scenario_data, {"precision": "bf17"})
    sim.scenario_data = bad
    assert sim.error_field == "precision" and "did you mean" in sim.error
    assert sim.scenario.precision == "bf16"


def test_unknown_key_and_num_gpus_mismatch_are_reported() -> None:
    sim = make()
    with pytest.raises(ScenarioError):
        sim.set(micro_batch=4)
    assert sim.error_field == "micro_batch" and "micro_batch_size" in sim.error
    with pytest.raises(ScenarioError):
        sim.set(num_gpus=3)
    assert sim.error_field == "num_gpus"


def test_scenario_setter_is_strict() -> None:
    sim = make()
    sim.scenario = Scenario(model="gpt2", parallel={"tp": 2, "sequence_parallel": True})
    assert sim.scenario.parallel.sequence_parallel
    with pytest.raises(ScenarioError):
        sim.scenario = {"model": "gpt2", "parallel": {"sequence_parallel": True}}
    assert sim.error_field == "parallel.sequence_parallel"
    sim.scenario = {"model": "gpt2"}
    assert sim.scenario == Scenario(model="gpt2") and sim.error == ""


def test_headroom_changes_verdict_and_band() -> None:
    sim = make()  # llama-3.1-8b on H100: about 79 GiB of 80
    sim.headroom = 0.0
    assert sim.result["verdict"] == "fits"
    sim.headroom = 0.3
    assert sim.result["verdict"] == "tight"
    band = next(lay for lay in sim.charts["breakdown"]["layer"] if lay["mark"]["type"] == "rect")
    assert band["data"]["values"][0]["lo"] == pytest.approx(80 * 0.7, abs=1e-2)
    with pytest.raises(traitlets.TraitError):
        sim.headroom = 1.5
    sim.set(micro_batch_size=64)
    assert sim.result["verdict"] == "does not fit"
    check_consistent(sim)


def test_options_list_catalogs_and_stops() -> None:
    from memsim_widget.catalog.gpus import GPUS
    from memsim_widget.catalog.models import preset_ids

    opts = make().options
    assert [p["id"] for p in opts["presets"]] == preset_ids()
    assert all(p["label"].startswith(p["id"]) for p in opts["presets"])
    assert [g["id"] for g in opts["gpus"]] == list(GPUS)
    assert opts["stops"]["micro_batch_size"] == [2**i for i in range(11)]
    assert opts["stops"]["seq_len"][0] == 128 and opts["stops"]["seq_len"][-1] == 131072
    assert opts["choices"]["optimizer"] == list(OPTIMIZERS)
    assert opts["model_dims"]["hidden_size"] == 4096
    assert "q_proj" in opts["lora_targets"] and opts["lora_targets"][0] == "all-linear"


# ----- disabled controls and dependent resets --------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "off", "on"),
    [
        (
            {},
            [
                "lora.rank",
                "lora.targets",
                "parallel.sequence_parallel",
                "parallel.offload",
                "parallel.ep",
                "model.hidden_size",
                "gpu.memory_gib",
                "parallel.pp_schedule",
            ],
            ["micro_batch_size", "seq_len"],
        ),
        ({"method": "lora"}, [], ["lora.rank", "lora.targets", "lora.alpha"]),
        ({"parallel": {"tp": 2}}, [], ["parallel.sequence_parallel"]),
        ({"parallel": {"zero": 1}}, [], ["parallel.offload"]),
        ({"model": "mixtral-8x7b"}, [], ["parallel.ep"]),
        ({"model": "vit-base-patch16-224"}, ["seq_len"], []),
        (
            {"parallel": {"pp": 2}},
            ["parallel.virtual_stages"],
            ["parallel.pp_schedule", "parallel.pp_microbatches"],
        ),
        (
            {"parallel": {"pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2}},
            [],
            ["parallel.virtual_stages"],
        ),
        ({"optimizer": "none"}, ["optimizer_impl", "optimizer_in_backward"], []),
        ({"grad_accum_steps": 4}, ["optimizer_in_backward"], []),
        ({"model": {"model_type": "llama"}}, [], ["model.hidden_size", "model.vocab_size"]),
        ({"gpu": {"memory_gib": 24}}, [], ["gpu.memory_gib"]),
    ],
)
def test_disabled_controls(changes: dict[str, Any], off: list[str], on: list[str]) -> None:
    data = merge(Scenario().to_dict(), changes)
    disabled, _ = disabled_controls(data)
    for key in off:
        assert key in disabled and disabled[key], key
    for key in on:
        assert key not in disabled, key


def test_disabled_values() -> None:
    _, values = disabled_controls(
        merge(Scenario().to_dict(), {"optimizer": "adamw-8bit", "parallel": {"zero": 2}})
    )
    assert values["optimizer_impl"] == ["foreach", "for-loop"]
    assert values["parallel.offload"] == ["optimizer+params"]
    _, values = disabled_controls(merge(Scenario().to_dict(), {"parallel": {"zero": 3}}))
    assert "parallel.offload" not in values and "optimizer_impl" not in values


@pytest.mark.parametrize(
    ("start", "change", "expect"),
    [
        (
            {"parallel": {"tp": 2, "sequence_parallel": True}},
            {"parallel": {"tp": 1}},
            {"parallel.sequence_parallel": False},
        ),
        (
            {"parallel": {"dp": 2, "zero": 3, "offload": "optimizer+params"}},
            {"parallel": {"zero": 0}},
            {"parallel.offload": "none"},
        ),
        (
            {"parallel": {"dp": 2, "zero": 3, "offload": "optimizer+params"}},
            {"parallel": {"zero": 2}},
            {"parallel.offload": "optimizer"},
        ),
        ({}, {"optimizer": "adamw-8bit"}, {"optimizer_impl": "fused"}),
        ({}, {"optimizer": "adafactor"}, {"optimizer_impl": "for-loop"}),
        ({"optimizer_in_backward": True}, {"grad_accum_steps": 4}, {"optimizer_in_backward": False}),
        (
            {"model": "mixtral-8x7b", "parallel": {"dp": 8, "ep": 8}},
            {"model": "mistral-7b"},
            {"parallel.ep": 1},
        ),
        ({"method": "lora"}, {"model": "gpt2"}, {"lora.targets": ["all-linear"]}),
        (
            {"method": "lora", "lora": {"targets": ["q_proj", "up_proj"]}},
            {"model": "vit-base-patch16-224"},
            {"lora.targets": ["q_proj"]},
        ),
        (
            {"parallel": {"pp": 2, "pp_microbatches": 4}},
            {"parallel": {"pp_schedule": "interleaved"}},
            {"parallel.virtual_stages": 2},
        ),
        (
            {"parallel": {"pp": 2, "pp_microbatches": 4, "pp_schedule": "interleaved", "virtual_stages": 2}},
            {"parallel": {"pp": 1}},
            {"parallel.pp_schedule": "1f1b", "parallel.virtual_stages": 1},
        ),
    ],
)
def test_dependent_controls_reset(
    start: dict[str, Any], change: dict[str, Any], expect: dict[str, Any]
) -> None:
    sim = make(**start)
    sim.set(**change)
    assert sim.error == ""
    flat = {
        **sim.scenario_data,
        **{f"{s}.{k}": v for s in ("parallel", "lora") for k, v in sim.scenario_data[s].items()},
    }
    for key, value in expect.items():
        assert flat[key] == value, key
    check_consistent(sim)


def test_explicit_conflict_in_one_change_is_an_error() -> None:
    sim = make(parallel={"tp": 2, "sequence_parallel": True})
    with pytest.raises(ScenarioError) as info:
        sim.set(parallel={"tp": 1, "sequence_parallel": True})
    assert info.value.field == "parallel.sequence_parallel"


def test_changed_keys_and_normalize_are_pure() -> None:
    a = Scenario().to_dict()
    b = merge(a, {"parallel": {"tp": 1}, "micro_batch_size": 4})
    assert changed_keys(a, b) == {"micro_batch_size"}
    c = merge(a, {"parallel": {"zero": 1, "offload": "optimizer"}})
    d = merge(c, {"parallel": {"zero": 0}})
    out = normalize(d, changed_keys(c, d))
    assert out["parallel"]["offload"] == "none" and d["parallel"]["offload"] == "optimizer"


# ----- a state machine over the traits ----------------------------------------------------------------------
MODELS = [
    "gpt2",
    "llama-3.2-1b",
    "mixtral-8x7b",
    "vit-base-patch16-224",
    "t5-base",
    "qwen2.5-0.5b",
    {
        "model_type": "llama",
        "hidden_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 1024,
        "vocab_size": 32000,
    },
]
CHOICES = {
    "method": ["full", "lora", "qlora"],
    "precision": ["bf16", "fp32", "amp-bf16", "mixed-bf16", "fp8"],
    "optimizer": ["adamw", "sgd", "adafactor", "adamw-8bit", "adamw-4bit", "none"],
    "optimizer_impl": ["foreach", "fused", "for-loop"],
    "activation_checkpointing": ["none", "selective", "full"],
    "attention": ["sdpa", "eager"],
    "micro_batch_size": [1, 2, 4, 64, 1024],
    "seq_len": [128, 1024, 4096, 3000],
    "grad_accum_steps": [1, 4],
    "optimizer_in_backward": [False, True],
    "gpu": ["a10", "h100-sxm-80gb", {"memory_gib": 24}],
}
PARALLEL = {
    "dp": [1, 2, 4],
    "tp": [1, 2, 3, 4],
    "pp": [1, 2, 4],
    "cp": [1, 2],
    "ep": [1, 2, 4],
    "zero": [0, 1, 2, 3],
    "sequence_parallel": [False, True],
    "offload": ["none", "optimizer", "optimizer+params"],
}


class WidgetMachine(RuleBasedStateMachine):
    """Moves controls at random, through the front-end path (trait writes) and the Python path (set)."""

    @initialize(model=st.sampled_from(MODELS[:3]))
    def start(self, model: Any) -> None:
        """A fresh widget."""
        self.sim = make(model=model)
        self.last_valid = (self.sim.result, self.sim.charts, self.sim.scenario)

    def _after(self, ok: bool) -> None:
        """Track the last valid result; a rejected change must leave it untouched."""
        if ok:
            self.last_valid = (self.sim.result, self.sim.charts, self.sim.scenario)

    def _ui_write(self, changes: dict[str, Any]) -> None:
        """What the front end does: write the whole scenario dict with one control moved."""
        self.sim.scenario_data = merge(self.sim.scenario_data, changes)
        self._after(self.sim.error == "")

    def _py_set(self, changes: dict[str, Any]) -> None:
        """The Python path: ``sim.set`` raises exactly when the widget reports an error."""
        try:
            self.sim.set(**changes)
        except ScenarioError as exc:
            assert self.sim.error == str(exc) and self.sim.error_field == exc.field
            self._after(False)
        else:
            assert self.sim.error == ""
            self._after(True)

    @rule(key=st.sampled_from(sorted(CHOICES)), data=st.data(), via_ui=st.booleans())
    def move_control(self, key: str, data: st.DataObject, via_ui: bool) -> None:
        """Set a top-level scenario key."""
        value = data.draw(st.sampled_from(CHOICES[key]))
        (self._ui_write if via_ui else self._py_set)({key: value})

    @rule(key=st.sampled_from(sorted(PARALLEL)), data=st.data(), via_ui=st.booleans())
    def move_parallel(self, key: str, data: st.DataObject, via_ui: bool) -> None:
        """Set one parallel-layout key."""
        value = data.draw(st.sampled_from(PARALLEL[key]))
        (self._ui_write if via_ui else self._py_set)({"parallel": {key: value}})

    @rule(model=st.sampled_from(MODELS), via_ui=st.booleans())
    def pick_model(self, model: Any, via_ui: bool) -> None:
        """Pick a preset or a custom model."""
        (self._ui_write if via_ui else self._py_set)({"model": model})

    @rule(
        rank=st.sampled_from([4, 16, 64]),
        modules=st.sampled_from([["q_proj", "v_proj"], ["all-linear"], ["c_attn"]]),
    )
    def move_lora(self, rank: int, modules: list[str]) -> None:
        """Set LoRA rank and targets."""
        self._py_set({"lora": {"rank": rank, "targets": modules}})

    @rule(headroom=st.sampled_from([0.0, 0.05, 0.1, 0.25]))
    def move_headroom(self, headroom: float) -> None:
        """Move the headroom slider."""
        self.sim.headroom = headroom
        if self.sim.error == "":
            self._after(True)
        else:  # the displayed result follows the headroom even while an input is rejected
            self.last_valid = (self.sim.result, self.sim.charts, self.sim.scenario)

    @invariant()
    def derived_traits_follow(self) -> None:
        """Result, frame and charts always describe the last valid scenario."""
        check_consistent(self.sim)
        assert REPR.match(repr(self.sim)), repr(self.sim)

    @invariant()
    def error_keeps_previous_result(self) -> None:
        """A rejected input names its field and leaves the last valid result on display."""
        sim = self.sim
        result, charts, scenario = self.last_valid
        assert sim.result == result and sim.charts == charts and sim.scenario == scenario
        if sim.error:
            assert sim.error_field and sim.error.startswith(sim.error_field + ": ")
        else:
            assert sim.scenario_data == sim.scenario.to_dict()

    @invariant()
    def options_follow_scenario(self) -> None:
        """Disabled controls are computed from what the controls show, and hold neutral values when valid."""
        sim = self.sim
        assert sim.options == build_options(sim.scenario_data)
        if sim.error:
            return
        par = sim.scenario.parallel
        disabled = sim.options["disabled"]
        assert ("parallel.sequence_parallel" in disabled) == (par.tp == 1)
        assert ("parallel.offload" in disabled) == (par.zero == 0)
        assert ("lora.rank" in disabled) == (sim.scenario.method == "full")
        if par.tp == 1:
            assert not par.sequence_parallel
        if par.zero == 0:
            assert par.offload == "none"
        if sim.scenario.optimizer != "none":
            assert sim.scenario.optimizer_impl in OPTIMIZERS[sim.scenario.optimizer].impls


WidgetMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=15, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_widget_state_machine = WidgetMachine.TestCase


# ----- front-end files, packaging, JS fixture -------------------------------------------------------------
def test_front_end_assets_are_found() -> None:
    sim = make()
    assert "export function render" in sim._esm
    assert sim._esm == (ROOT / "js" / "widget.js").read_text()
    assert ".memsim-error" in sim._css


def test_vega_bundle_is_offline_es_module() -> None:
    from memsim_widget.widget import vega_bundle

    src = vega_bundle()
    assert re.search(r"export\s*\{[^}]*\bas vegaEmbed\s*\}", src)
    assert "esm.sh" not in src and "cdn.jsdelivr" not in src
    sim = MemSim()
    assert sim._vega_js == src


def _js_fixture_state() -> dict[str, Any]:
    """The traits the node tests render (charts replaced by tiny specs)."""
    sim = make()
    return {
        "scenario_data": sim.scenario_data,
        "options": sim.options,
        "result": sim.result,
        "headroom": sim.headroom,
        "error": "",
        "error_field": "",
        "charts": {
            "breakdown": {"mark": "bar", "data": {"values": []}},
            "scaling": {"mark": "line", "data": {"values": []}},
        },
        "_vega_js": "",
    }


def _js_fixture_charts() -> dict[str, Any]:
    """Real chart specs (a 2-stage pipeline) for the node test that draws them with the real vega bundle."""
    return make(model="llama-3.2-1b", parallel={"pp": 2, "pp_microbatches": 2}).charts


def test_js_fixture_has_the_current_trait_layout() -> None:
    fixture = json.loads(FIXTURE.read_text())
    fresh = json.loads(json.dumps(_js_fixture_state()))
    assert set(fixture) == set(fresh)
    for key in ("scenario_data", "options", "result"):
        assert set(fixture[key]) == set(fresh[key]), (
            f"{key}: run python tests/test_widget.py --write-js-fixture"
        )
    assert set(fixture["options"]["choices"]) == set(fresh["options"]["choices"])
    charts = json.loads(CHARTS_FIXTURE.read_text())
    assert set(charts) == set(_js_fixture_charts())


def test_wheel_ships_the_front_end(tmp_path: Path) -> None:
    """Build the wheel and import the widget from it: the ESM and CSS come from memsim_widget/static/."""
    pytest.importorskip("hatchling")
    text = (ROOT / "pyproject.toml").read_text()
    if "force-include" not in text or "js/widget.js" not in text:
        pytest.skip(
            "pyproject.toml does not map js/ into the wheel yet ([tool.hatch.build.targets.wheel.force-include])"
        )
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "memsim_widget/static/widget.js" in names and "memsim_widget/static/widget.css" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import memsim_widget.widget as w, pathlib, sys; "
        "assert pathlib.Path(w.__file__).is_relative_to(pathlib.Path(sys.argv[1])), w.__file__; "
        "s = w.MemSim(charts_js=False); assert 'export function render' in s._esm; "
        "assert str(w._asset('widget.js')).endswith('memsim_widget/static/widget.js'); print(repr(s))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(site)],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("MemSim(")


if __name__ == "__main__" and "--write-js-fixture" in sys.argv:
    FIXTURE.write_text(json.dumps(_js_fixture_state(), indent=1, sort_keys=True) + "\n")
    CHARTS_FIXTURE.write_text(json.dumps(_js_fixture_charts(), separators=(",", ":")) + "\n")
    print(f"wrote {FIXTURE} and {CHARTS_FIXTURE}")
