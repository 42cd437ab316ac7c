"""``memsim measure`` on a machine without a GPU: the one-line exit, the data/measured row format, the model the
scenario builds (on the meta device: shapes only) and the peak's moment replayed from an allocation trace.
The GPU run itself is untested here (docs/measure.md)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from memsim_widget import measure
from memsim_widget.cli import main
from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

GiB = 2**30
READING = {"allocated": 20 * GiB, "reserved": 22 * GiB, "device": 23 * GiB, "peak_at": "step 1, backward"}
ENV = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.13.0", "transformers": "5.24.0", "date": "2026-12-05"}


def test_without_cuda_measure_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    if measure.require_cuda() is None:
        pytest.skip("a CUDA device is present")
    data = Path(__file__).resolve().parent / "data" / "configs" / "axolotl" / "lora-1b.yml"
    for argv in (["measure", "--model", "llama-3.2-1b"], ["measure", "--from", str(data)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("memsim: error: measure: no CUDA device")


def test_rows_are_three_counters_in_the_measured_format(tmp_path: Path) -> None:
    sc = Scenario.from_dict({"model": "llama-3.2-1b", "micro_batch_size": 4, "seq_len": 1024})
    rows = measure.rows_for("mine", sc, READING, ENV, tool="memsim measure")
    path = tmp_path / "gpu_mine.csv"
    measure.append_csv(rows, path)
    measure.append_csv(rows, path)  # a second run appends, the header stays single
    with open(path, newline="") as f:
        back = list(csv.DictReader(f))
    assert list(back[0]) == measure.COLUMNS
    assert [r["counter"] for r in back] == ["allocated", "reserved", "nvidia-smi"] * 2
    assert [int(r["measured_bytes"]) for r in back[:3]] == [20 * GiB, 22 * GiB, 23 * GiB]
    assert (
        back[0]["peak_gib"] == "20.0000" and back[0]["unit"] == "GiB" and back[0]["id"] == "g-mine-allocated"
    )
    assert Scenario.from_dict(json.loads(back[0]["scenario_json"])) == sc


def test_the_csv_is_the_one_data_measured_holds() -> None:
    data = Path(__file__).resolve().parents[1] / "data" / "measured" / "gpu_h200.csv"
    with open(data, newline="") as f:
        assert next(csv.reader(f)) == measure.COLUMNS


def test_a_csv_of_other_columns_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    sc = Scenario.from_dict({"model": "llama-3.2-1b"})
    with pytest.raises(ScenarioError, match="--csv"):
        measure.append_csv(measure.rows_for("x", sc, READING, ENV, tool="t"), path)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_model_built_has_the_parameters_memsim_counts(method: str) -> None:
    """The scenario -> model build, on the meta device (no memory, no GPU): the same parameter count (the base
    model's, plus the LoRA adapters) and the same trainable count as the engine's."""
    pytest.importorskip("transformers")
    sc = Scenario.from_dict({"model": "llama-3.2-1b", "method": method, "precision": "bf16"})
    model, _, _ = measure.build_model(sc, "meta")
    params = list(model.parameters())
    est = estimate(sc)
    adapters = est.trainable_parameters if method == "lora" else 0  # the engine counts the base model's
    assert sum(p.numel() for p in params) == est.parameters + adapters
    assert sum(p.numel() for p in params if p.requires_grad) == est.trainable_parameters
    assert {p.device.type for p in params} == {"meta"}


def test_a_torchao_float8_model_is_built_with_float8_linears_but_the_head() -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("torchao.float8")
    sc = Scenario.from_dict({"model": "llama-3.2-1b", "fp8_recipe": "rowwise"})
    model, _, _ = measure.build_model(sc, "meta")
    kinds = {name: type(m).__name__ for name, m in model.named_modules()}
    assert kinds["model.layers.0.self_attn.q_proj"] == "Float8Linear" and kinds["lm_head"] == "Linear"
    assert sum(p.numel() for p in model.parameters()) == estimate(sc).parameters


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"parallel": {"dp": 2}}, "parallel"),
        ({"method": "qlora"}, "method"),
        ({"precision": "mixed-bf16", "framework": "deepspeed", "parallel": {"zero": 1}}, "precision"),
        ({"fp8_recipe": "te-current"}, "fp8_recipe"),
    ],
)
def test_what_one_local_gpu_cannot_run_is_named(change: dict, field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        measure.check_measurable(Scenario.from_dict({"model": "llama-3.2-1b", **change}))
    assert err.value.field == field


def test_the_peak_allocation_is_replayed_from_the_trace() -> None:
    frames = [{"filename": "/x/torch/nn/functional.py", "line": 1, "name": "f"},
              {"filename": "/x/transformers/models/llama/modeling_llama.py", "line": 99, "name": "forward"}]  # fmt: skip
    events = [
        {"action": "alloc", "size": 100, "frames": []},
        {"action": "alloc", "size": 50, "frames": frames},  # 150: the peak
        {"action": "free_completed", "size": 100},
        {"action": "alloc", "size": 60, "frames": []},  # 110: below it
    ]
    assert measure.peak_frame_of(events) == "/x/transformers/models/llama/modeling_llama.py:99 forward"
    assert measure.peak_frame_of([]) is None


def test_the_report_puts_measured_next_to_predicted_with_the_error() -> None:
    sc = Scenario.from_dict({"model": "llama-3.2-1b", "gpu": "h100-sxm-80gb"})
    est = estimate(sc)
    text = measure.report(sc, READING, ENV)
    lines = text.splitlines()
    assert lines[1].startswith("allocated") and f"{est.peak_allocated_bytes / GiB:.2f} GiB" in lines[1]
    err = (est.peak_allocated_bytes - READING["allocated"]) / READING["allocated"] * 100
    assert f"{err:+.1f}%" in lines[1]
    assert "step 1, backward" in text and "torch 2.13.0" in text
