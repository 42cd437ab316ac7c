"""benchmarks/gpu_oom_boundary.py and oom_boundary_compare.py without a GPU: the boundary search against runners
whose boundary is known, the comparator against a synthetic CSV built here (not measured data), and the script's
whole loop on CPU (``--cpu-smoke``: tiny model, OOM simulated at a known token limit)."""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_oom_boundary as gob  # noqa: E402
import oom_boundary_compare as obc  # noqa: E402

from memsim_widget import Scenario, estimate  # noqa: E402
from memsim_widget.catalog.gpus import resolve_gpu  # noqa: E402

GiB = 2**30


@pytest.fixture(autouse=True)
def _catalog_restored() -> Iterator[None]:
    """The comparator registers capped copies of the host's card (``room_gpu``): each test leaves the catalog as
    it found it, so a later test in the same process lists only the catalog's cards."""
    from memsim_widget.catalog.gpus import GPUS, register_gpu

    before = set(GPUS)
    yield
    for gid in [g for g in GPUS if g not in before]:
        del GPUS[gid]
    register_gpu(
        GPUS["h100-sxm-80gb"]
    )  # rebuilds the printed-name table and drops the engine's cached figures


# ----- the search ---------------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(
    lo=st.integers(1, 50),
    span=st.integers(0, 5000),
    boundary=st.integers(0, 6000),
    start=st.one_of(st.none(), st.integers(-10, 7000)),
)
def test_search_finds_a_known_boundary_from_any_start(
    lo: int, span: int, boundary: int, start: int | None
) -> None:
    hi = lo + span
    s = gob.search(lambda n: n <= boundary, start, lo, hi)
    if boundary < lo:
        assert (s.status, s.good, s.bad) == ("none_fit", None, lo)
    elif boundary >= hi:
        assert (s.status, s.good) == ("at_top", hi)
    else:
        assert (s.status, s.good, s.bad) == ("exact", boundary, boundary + 1)
    assert all(lo <= n <= hi for n, _ in s.probes)
    assert len({n for n, _ in s.probes}) == len(s.probes), "no value probed twice"


@settings(max_examples=200, deadline=None)
@given(boundary=st.integers(1, 4000), miss=st.integers(-64, 64))
def test_a_prediction_near_the_boundary_costs_few_probes(boundary: int, miss: int) -> None:
    start = max(1, boundary + miss)
    s = gob.search(lambda n: n <= boundary, start, 1, 4096)
    # doubling steps to cross the boundary, then bisecting the last step: about 2 log2(|miss| + 1) + 2
    assert len(s.probes) <= 2 * math.ceil(math.log2(abs(miss) + 1)) + 2
    if miss in (0, -0):
        assert len(s.probes) == 2  # the prediction runs and one more fails: the exact boundary


def test_a_search_out_of_time_reports_its_bracket() -> None:
    calls = iter(range(100))
    s = gob.search(lambda n: n <= 700, 10, 1, 4096, time_left=lambda: next(calls) < 3)
    assert s.status == "bracket"
    assert s.good is not None and s.good <= 700 and len(s.probes) == 4


def test_the_smoke_limit_gives_the_boundary_the_smoke_run_must_find() -> None:
    cap = 24 * GiB + 5
    assert gob.smoke_limit_tokens(cap) == 24 * gob.SMOKE_TOKENS_PER_GIB


def test_cases_are_valid_scenarios_and_enough_of_them() -> None:
    names = [c.name for c in gob.CASES]
    assert len(names) == len(set(names)) and len(gob.CASES) >= 10
    for c in gob.CASES:
        sc = Scenario.from_dict({**c.scenario, "gpu": "h100-sxm-80gb"})
        assert max(c.lengths(sc)) == sc.seq_len and len(c.lengths(sc)) == 3
    kinds = {Scenario.from_dict(c.scenario).method for c in gob.CASES}
    assert kinds == {"full", "lora", "qlora"}
    assert any(Scenario.from_dict(c.scenario).activation_checkpointing == "full" for c in gob.CASES)
    assert any(c.variable for c in gob.CASES)
    caps = sorted(resolve_gpu(c).memory_bytes / GiB for c in gob.CARDS)
    assert [round(x) for x in caps] == [
        24,
        39,
        45,
        79,
    ]  # 24, 40, 48, 80 GB cards as total_memory reports them


# ----- the comparator -----------------------------------------------------------------------------------------
def _room_gpu_reserved_cap(sc: Scenario, cap: int) -> int:
    """The allocator room the engine sees on the comparator's room card."""
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.counters.overhead import reserved_cap

    gid = obc.room_gpu("h100-sxm-80gb", cap + obc._outside(sc))
    on = sc.replace(gpu=gid)
    return reserved_cap(Context(on), obc._outside(on))


def test_the_room_card_gives_the_engine_exactly_the_measured_allocator_room() -> None:
    sc = Scenario.from_dict({"model": "llama-3.2-1b", "gpu": "h100-sxm-80gb", "seq_len": 1024})
    cap = 20 * GiB + 12345
    assert _room_gpu_reserved_cap(sc, cap) == cap


def test_predicted_max_is_the_largest_that_the_engine_says_fits() -> None:
    sc = Scenario.from_dict({"model": "llama-3.2-1b", "gpu": "h100-sxm-80gb", "seq_len": 1024})
    cap = 24 * GiB
    best = obc.predicted_max(sc, "micro_batch_size", "room", cap, "rtx-4090", "h100-sxm-80gb")
    assert best is not None and best >= 1

    def fits(b: int) -> bool:
        return obc.predicted_fits(sc.replace(micro_batch_size=b), "room", cap, "rtx-4090", "h100-sxm-80gb")

    assert fits(best) and not fits(best + 1)
    # and on the room card the reserved replay sits under the cap at the boundary, over it one past
    gid = obc.room_gpu("h100-sxm-80gb", cap + obc._outside(sc))
    assert estimate(sc.replace(micro_batch_size=best, gpu=gid)).peak_reserved_bytes <= cap
    seq = obc.predicted_max(sc, "seq_len", "card", 0, "rtx-4090", "h100-sxm-80gb")
    assert seq is not None and seq % obc.SEQ_STEP == 0


def _synthetic_csv(path: Path, offsets: list[int | None]) -> list[int]:
    """A CLEARLY SYNTHETIC boundary CSV (not measured): one micro-batch row per offset, whose "measured" maximum
    is the engine's own prediction plus the offset (None: a row that is not exact). Returns the predictions."""
    sc = Scenario.from_dict({"model": "qwen2.5-0.5b", "gpu": "h100-sxm-80gb", "seq_len": 1024})
    preds = []
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=obc.COLUMNS, lineterminator="\n")
        w.writeheader()
        for i, off in enumerate(offsets):
            cap = (16 + 4 * i) * GiB
            pred = obc.predicted_max(sc, "micro_batch_size", "room", cap, "rtx-4090", "h100-sxm-80gb")
            assert pred is not None
            preds.append(pred)
            row = dict.fromkeys(obc.COLUMNS, "")
            row.update(id=f"synthetic-{i}", scenario="synthetic", dim="micro_batch_size", card="rtx-4090",
                       card_id="rtx-4090", host_gpu="h100-sxm-80gb", cap_bytes=str(cap), hi="4096",
                       status="exact" if off is not None else "bracket",
                       measured_max=str(pred + (off or 0)), first_oom=str(pred + (off or 0) + 1),
                       scenario_json=json.dumps(sc.to_dict()), note="SYNTHETIC test fixture, not measured")  # fmt: skip
            w.writerow(row)
    return preds


def test_the_comparator_scores_equal_below_above_and_the_bar(tmp_path: Path) -> None:
    path = tmp_path / "oom_boundary_synthetic.csv"
    _synthetic_csv(path, [0] * 9 + [1])  # nine equal, one measured above the prediction (engine below)
    res = [obc.compare_row(r, "room") for r in obc.read_rows([path])]
    s = obc.summarise(res)
    assert (s["scored"], s["equal"], s["below"], s["above"], s["met"]) == (10, 9, 1, 0, True)
    _synthetic_csv(path, [0] * 9 + [-1, None])  # the engine above one row: the bar fails whatever the share
    res = [obc.compare_row(r, "room") for r in obc.read_rows([path])]
    s = obc.summarise(res)
    assert (s["scored"], s["equal"], s["above"], s["met"]) == (10, 9, 1, False)
    assert res[-1]["verdict"] == "not scored"
    _synthetic_csv(path, [0] * 8 + [1, 2])  # 80% equal: under the bar
    s = obc.summarise([obc.compare_row(r, "room") for r in obc.read_rows([path])])
    assert (s["share_equal"], s["met"]) == (0.8, False)


def test_rows_whose_boundary_is_known_without_a_bracket_are_scored_too() -> None:
    sc = Scenario.from_dict({"model": "qwen2.5-0.5b", "gpu": "h100-sxm-80gb", "seq_len": 1024})
    base = dict.fromkeys(obc.COLUMNS, "")
    base.update(scenario="synthetic", dim="micro_batch_size", card="rtx-4090", card_id="rtx-4090",
                host_gpu="h100-sxm-80gb", scenario_json=json.dumps(sc.to_dict()))  # fmt: skip
    # nothing ran on a 1 GiB room (SYNTHETIC): the engine must say nothing fits either, else it is above
    tiny = obc.compare_row({**base, "cap_bytes": str(GiB), "hi": "4096", "status": "none_fit"}, "room")
    assert (tiny["predicted"], tiny["verdict"]) == (None, "equal")
    roomy = {**base, "cap_bytes": str(70 * GiB), "hi": "2", "measured_max": "2", "status": "at_top"}
    assert obc.compare_row(roomy, "room")["verdict"] == "equal"  # the engine reaches the top too
    over = {**base, "cap_bytes": str(70 * GiB), "hi": "4096", "status": "none_fit"}
    assert obc.compare_row(over, "room")["verdict"] == "above"
    cut = {**base, "cap_bytes": str(70 * GiB), "hi": "4096", "measured_max": "3", "status": "bracket"}
    assert obc.compare_row(cut, "room")["verdict"] == "not scored"


def test_the_comparator_refuses_another_csv_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "oom_boundary_x.csv"
    bad.write_text("id,counter\n1,allocated\n")
    assert obc.main(["--csv", str(bad)]) == 2
    assert "not an oom_boundary CSV" in capsys.readouterr().err


def test_gpu_oom_boundary_fails_fast_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert gob.main(["--out-dir", "/nonexistent/never"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.slow
def test_cpu_smoke_runs_the_whole_loop_and_finds_the_simulated_boundary(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    cards = ["rtx-4090", "l40s"]
    args = ["--cpu-smoke", "--out-dir", str(tmp_path), "--only", "smoke-lora-longest", "--cards", *cards]
    assert gob.main([*args, "--budget", "300"]) == 0
    for card in cards:
        rows = obc.read_rows([tmp_path / f"oom_boundary_{card}.csv"])
        assert {r["dim"] for r in rows} == {"micro_batch_size", "seq_len"}
        limit = gob.smoke_limit_tokens(int(rows[0]["cap_bytes"]))
        assert int(rows[0]["cap_bytes"]) == resolve_gpu(card).memory_bytes - gob.SMOKE_HOST["context"]
        for r in rows:
            assert r["status"] == "exact", r
            # micro-batch x the longest step (64 tokens) <= limit; the sequence a multiple of 128 with mb 1
            want = limit // 64 if r["dim"] == "micro_batch_size" else limit // obc.SEQ_STEP * obc.SEQ_STEP
            assert int(r["measured_max"]) == want
    # resumed: every search already exact, nothing probed again, the rows kept
    assert gob.main([*args, "--budget", "300", "--resume"]) == 0
    assert len(obc.read_rows([tmp_path / "oom_boundary_l40s.csv"])) == 2


# ----- benchmarks/fidelity_measured.py reads no boundary file as a measured row --------------------------------
def test_measured_rows_leave_the_boundary_csvs_to_their_comparator(tmp_path: Path) -> None:
    import fidelity_measured as fm

    (tmp_path / "oom_boundary_rtx-4090.csv").write_text(",".join(obc.COLUMNS) + "\n")
    fm.write_csv([dict.fromkeys(fm.COLUMNS, "x")], tmp_path / "gpu_x.csv")
    assert [r["id"] for r in fm.load_rows(tmp_path)] == ["x"]


def test_after_a_crash_the_case_is_given_up_and_a_new_subprocess_takes_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []

    def fake_child(cases, cards, end, smoke, skip, on_row):  # type: ignore[no-untyped-def]
        names = [c.name for c in cases]
        calls.append(names)
        finished = []
        for n in names:
            if n == "llama1b-lora":  # this case kills its subprocess half-way
                return finished, "exit -9: killed"
            on_row({"id": f"{n}|rtx-4090|micro_batch_size", "scenario": n, "card": "rtx-4090",
                    "dim": "micro_batch_size", "status": "exact", "measured_max": 3, "probes": 2, "seconds": 1})  # fmt: skip
            finished.append(n)
        return finished, ""

    monkeypatch.setattr(gob, "run_child", fake_child)
    cases = [c for c in gob.CASES if c.name in ("llama1b-bf16", "qwen05b-bf16", "llama1b-lora")]
    assert gob.parent(cases, ["rtx-4090"], tmp_path, 100, smoke=True, resume=False) == 0
    assert calls == [["llama1b-bf16", "llama1b-lora", "qwen05b-bf16"], ["qwen05b-bf16"]]
    rows = obc.read_rows([tmp_path / "oom_boundary_rtx-4090.csv"])
    assert [r["scenario"] for r in rows] == ["llama1b-bf16", "qwen05b-bf16"]


def test_a_case_whose_library_is_missing_is_skipped_and_said_so() -> None:
    try:
        import bitsandbytes  # noqa: F401

        pytest.skip("bitsandbytes imports here")
    except ImportError:
        pass
    out: list[dict] = []
    qlora = [c for c in gob.SMOKE_CASES if c.needs == "bitsandbytes"]
    gob.child(qlora, ["rtx-4090"], 0.0, "cpu", True, set(), out.append)
    assert out == [{"done": "smoke-qlora", "why": "skipped: bitsandbytes does not import"}]


@pytest.mark.slow
def test_the_qlora_builder_quantises_every_linear_but_the_head_and_trains() -> None:
    pytest.importorskip("bitsandbytes")
    from memsim_widget import measure

    case = next(c for c in gob.SMOKE_CASES if c.needs == "bitsandbytes")
    sc = Scenario.from_dict(case.scenario)
    model, _, _ = gob.qlora_build(sc, "cpu")
    kinds = {type(m).__name__ for n, m in model.named_modules() if n.endswith(("k_proj", "down_proj"))}
    assert kinds == {"Linear4bit"} and type(model.base_model.model.lm_head).__name__ == "Linear"
    try:  # three steps through measure's loop, the builder standing in as in the child
        measure.build_model = gob.qlora_build
        assert gob.probe_runs(case, sc, "cpu") == (True, 0)
    finally:
        measure.build_model = gob.BASE_BUILD


# ----- the CUDA branch, with torch.cuda stood in for ---------------------------------------------------------
class FakeCuda:
    """torch.cuda as the boundary search uses it: a fraction cap on a fake allocator whose step needs
    ``PER_TOKEN`` bytes per token (micro-batch x the longest step), and the calls recorded."""

    TOTAL = 85045477376  # an H100 80GB's total_memory
    CONTEXT = 600 * 2**20
    PER_TOKEN = 2**20

    def __init__(self) -> None:
        self.fractions: list[float] = []

    def fits(self, sc: Scenario, lengths: list[int]) -> bool:
        cap = self.fractions[-1] * self.TOTAL if self.fractions and self.fractions[-1] < 1 else self.TOTAL
        return sc.micro_batch_size * max(lengths) * self.PER_TOKEN <= cap

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import torch

        from memsim_widget import measure

        def train_steps(sc: Scenario, lengths: list[int], device: str, on_phase=None) -> None:  # type: ignore[no-untyped-def]
            assert device == "cuda"
            if not self.fits(sc, lengths):
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (fake)")

        monkeypatch.setattr(measure, "train_steps", train_steps)
        monkeypatch.setattr(measure, "device_used_bytes", lambda t: self.CONTEXT)
        for name, fn in {
            "set_per_process_memory_fraction": self.fractions.append,
            "synchronize": lambda *a: None,
            "empty_cache": lambda: None,
            "reset_peak_memory_stats": lambda *a: None,
            "memory_allocated": lambda *a: 0,
            "memory_reserved": lambda *a: 0,
            "get_device_name": lambda *a: "NVIDIA H100 80GB HBM3",
            "get_device_properties": lambda *a: type("P", (), {"total_memory": self.TOTAL})(),
        }.items():
            monkeypatch.setattr(torch.cuda, name, fn)


def test_the_cuda_branch_caps_each_card_and_finds_the_fake_allocators_boundary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    fake = FakeCuda()
    fake.install(monkeypatch)
    rows: list[dict] = []
    case = next(c for c in gob.CASES if c.name == "qwen05b-bf16-longest")
    cards = ["rtx-4090", "h100-sxm-80gb"]
    gob.run_case(case, cards, time.time() + 120, "cuda", False, set(), rows.append)
    assert fake.fractions[0] == 1.0  # the warm-up ran uncapped
    assert [(r["dim"], r["card"]) for r in rows] == [(d, c) for d in gob.DIMS for c in cards]
    for r in rows:
        cap = resolve_gpu(r["card"]).memory_bytes - FakeCuda.CONTEXT
        assert (int(r["cap_bytes"]), int(r["context_bytes"]), r["host_gpu"]) == (
            cap,
            FakeCuda.CONTEXT,
            "h100-sxm-80gb",
        )
        assert float(r["fraction"]) == pytest.approx(cap / FakeCuda.TOTAL, abs=1e-6)
        tokens = int(cap // FakeCuda.PER_TOKEN)  # the fake allocator's boundary
        want = tokens // 1024 if r["dim"] == "micro_batch_size" else tokens // obc.SEQ_STEP * obc.SEQ_STEP
        assert (r["status"], int(r["measured_max"])) == ("exact", want), r
        assert r["start"] != ""  # searched from the engine's prediction


def test_a_room_card_leaves_the_hosts_printed_name_to_the_host() -> None:
    from memsim_widget.catalog.gpus import canonical_gpu_id

    obc.room_gpu("h100-sxm-80gb", 30 * GiB)
    assert canonical_gpu_id("NVIDIA H100 80GB HBM3") == "h100-sxm-80gb"
