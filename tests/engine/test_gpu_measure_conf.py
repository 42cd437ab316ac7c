"""benchmarks/gpu_measure.py's allocator-setting rerun and benchmarks/gpu_session.py, without a GPU: the rows'
tags and scenarios, the refusal of an unknown setting, the setting reaching the subprocess (``--cpu-smoke``), and
the session's stages within their budget."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_measure as gm  # noqa: E402
import gpu_session as gsess  # noqa: E402

from memsim_widget import Scenario, estimate  # noqa: E402

EXP = "expandable_segments:True"


def test_rows_under_a_setting_are_tagged_and_carry_it_in_their_scenario() -> None:
    m = next(x for x in gm.MEASUREMENTS if x.name == "llama1b-bf16")
    t = gm.under_conf(m, EXP)
    assert (
        t.name == "llama1b-bf16-expandable" and "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in t.note
    )
    sc = Scenario.from_dict(t.scenario)
    assert sc.allocator_conf == EXP
    # the engine reads it: its expandable mode differs from the default on the same steps
    assert estimate(sc).peak_reserved_bytes != estimate(Scenario.from_dict(m.scenario)).peak_reserved_bytes
    reading = {"allocated": 1, "reserved": 2, "device": 3}
    rows = gm.rows_for(t, reading, {"device": "NVIDIA H100 80GB HBM3"})
    assert [r["id"] for r in rows] == [
        f"g-llama1b-bf16-expandable-{c}" for c in ("allocated", "reserved", "nvidia-smi")
    ]
    assert json.loads(rows[0]["scenario_json"])["allocator_conf"] == EXP
    assert gm.under_conf(m, "") is m and gm.conf_tag("max_split_size_mb:128") == "max-split-size-mb-128"


def test_an_unknown_setting_is_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert gm.main(["--alloc-conf", "expandable:True", "--cpu-smoke"]) == 2
    ours = [x for x in capsys.readouterr().err.splitlines() if x.startswith("gpu_measure:")]
    assert len(ours) == 1 and "'expandable'" in ours[0] and "--alloc-conf" in ours[0]


def test_the_expandable_list_names_measurements_and_the_session_fits_its_time() -> None:
    names = {m.name for m in gm.MEASUREMENTS}
    assert set(gsess.EXPANDABLE_FIRST) <= names
    assert sum(s.seconds for s in gsess.STAGES) <= gsess.TOTAL_SECONDS < 600
    assert [s.name for s in gsess.STAGES] == ["oom", "snapshots", "expandable", "parallel"]  # priority order
    for s in gsess.STAGES:
        cmd = s.command(Path("/o"), 100, "h100-sxm-80gb", smoke=False)
        assert Path(cmd[1]).exists() and "--cpu-smoke" not in cmd


@pytest.mark.slow
def test_cpu_smoke_the_setting_reaches_the_subprocess_and_tags_the_rows(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "gpu_x_expandable.csv"
    assert (
        gm.main(["--cpu-smoke", "--alloc-conf", EXP, "--only", "qwen05b-bf16-longest", "--out", str(out)])
        == 0
    )
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    # written only when the subprocess saw PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    assert [r["id"] for r in rows][0] == "g-qwen05b-bf16-longest-expandable-allocated" and len(rows) == 3


@pytest.mark.slow
def test_cpu_smoke_session_runs_its_stages_and_writes_under_out(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    assert (
        gsess.main(
            ["--cpu-smoke", "--out", str(tmp_path), "--only", "snapshots", "parallel", "--total", "300"]
        )
        == 0
    )
    status = json.loads((tmp_path / "status.json").read_text())
    assert status == {"snapshots": "exit 0", "parallel": "exit 0"}
    assert (tmp_path / "snapshots" / "smoke-tiny.json").exists() and (tmp_path / "env.json").exists()
    assert "fsdp2 dp8 bf16" in (tmp_path / "session.log").read_text()
    ranks = [json.loads(x) for x in (tmp_path / "parallel.jsonl").read_text().splitlines()]
    assert len(ranks) == 6 and all("error" not in r for r in ranks)  # every layout ran (CPU, a tiny model)


def test_rows_name_the_card_they_ran_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    m = next(x for x in gm.MEASUREMENTS if x.name == "llama1b-bf16")
    assert m.scenario["gpu"] == "h200" and gm.on_local_card(m).scenario["gpu"] == "h100-sxm-80gb"


def test_a_later_session_measures_only_what_the_committed_data_lacks(tmp_path: Path) -> None:
    import gpu_snapshots

    assert gsess.pending("snapshots", tmp_path) == [s.name for s in gpu_snapshots.SNAPSHOTS]
    (tmp_path / "snapshots").mkdir()
    (tmp_path / "snapshots" / "llama1b-bf16.json").write_text("{}")
    assert "llama1b-bf16" not in gsess.pending("snapshots", tmp_path)
    order = gsess.expandable_order()
    assert order[: len(gsess.EXPANDABLE_FIRST)] == list(gsess.EXPANDABLE_FIRST)
    assert sorted(order) == sorted(m.name for m in gm.MEASUREMENTS)  # all 27, each once
    rows = gm.rows_for(
        gm.under_conf(gm.MEASUREMENTS[0], EXP), {"allocated": 1, "reserved": 2, "device": 3}, {}
    )
    gm.write_csv(rows, tmp_path / "gpu_h100-sxm-80gb_expandable.csv")
    assert gsess.pending("expandable", tmp_path) == [n for n in order if n != gm.MEASUREMENTS[0].name]
    (tmp_path / "oom_boundary_rtx-4090.csv").write_text("committed rows\n")
    gsess.seed_boundary(tmp_path / "out", tmp_path)
    assert (tmp_path / "out" / "measured" / "oom_boundary_rtx-4090.csv").read_text() == "committed rows\n"
    cmd = gsess.STAGES[0].command(tmp_path / "out", 100, "h100-sxm-80gb", smoke=False, data=tmp_path)
    assert cmd is not None and "--resume" in cmd


def test_the_session_refuses_to_start_without_what_its_stages_import(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert gsess.preflight() == ""
    monkeypatch.setattr(gsess, "NEEDED", (*gsess.NEEDED, "no_such_module_here"))
    assert gsess.main(["--cpu-smoke", "--out", str(tmp_path)]) == 2
    # one line of its own (libraries may warn on stderr while the check imports them)
    ours = [x for x in capsys.readouterr().err.splitlines() if x.startswith("gpu_session:")]
    assert len(ours) == 1 and "no_such_module_here" in ours[0]
    assert not (tmp_path / "status.json").exists()  # nothing ran
