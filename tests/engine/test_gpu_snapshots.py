"""benchmarks/gpu_snapshots.py without a GPU: the summary of a PyTorch snapshot (its documented keys), the
segment-by-segment comparison with the replay, and the whole loop on CPU (``--cpu-smoke``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_snapshots as gs  # noqa: E402

MiB = 2**20


def _seg(size: int, stream: int = 0, pool: str = "large", allocated: int = 0) -> dict:
    """A segment as ``torch.cuda.memory._snapshot()`` lists it (the keys the summary reads)."""
    return {"total_size": size, "stream": stream, "segment_type": pool, "allocated_size": allocated,
            "active_size": allocated, "requested_size": allocated, "is_expandable": False, "blocks": []}  # fmt: skip


def test_the_summary_keeps_each_segment_compact_and_counts_step_3s_events() -> None:
    segs = [_seg(2 * MiB, pool="small", allocated=512), _seg(20 * MiB, allocated=20 * MiB), _seg(40 * MiB)]
    events = [{"action": "alloc", "size": 512}, {"action": "segment_alloc", "size": 20 * MiB},
              {"action": "free_completed", "size": 512}, {"action": "segment_free", "size": 2 * MiB}]  # fmt: skip
    got = gs.summarise_segments(segs)
    assert [(s["pool"], s["size"]) for s in got] == [
        ("large", 40 * MiB),
        ("large", 20 * MiB),
        ("small", 2 * MiB),
    ]
    assert set(got[0]) == {"size", "stream", "pool", "allocated", "active", "requested", "expandable"}
    ev = gs.summarise_events(events)
    assert ev["counts"] == {"alloc": 1, "segment_alloc": 1, "free_completed": 1, "segment_free": 1}
    assert ev["segment_sizes"] == {"segment_alloc": [20 * MiB], "segment_free": [2 * MiB]}


def test_the_comparison_pairs_segments_per_stream_and_pool_largest_first() -> None:
    gpu = {"name": "x", "segments": gs.summarise_segments([_seg(40 * MiB), _seg(20 * MiB), _seg(2 * MiB, pool="small"),
                                                           _seg(20 * MiB, stream=7)]),
           "peak_reserved": 100 * MiB, "reserved_at_snapshot": 82 * MiB}  # fmt: skip
    replay = {"segments_torch": [_seg(20 * MiB), _seg(40 * MiB), _seg(22 * MiB), _seg(2 * MiB, pool="small")],
              "peak_reserved": 110 * MiB, "reserved_at_end": 84 * MiB}  # fmt: skip
    c = gs.compare(gpu, replay)
    # large on stream 0: gpu [40, 20] vs replay [40, 22, 20]: 40 equal, 20/22 not, one unpaired; small: equal;
    # stream 7's segment has no replay counterpart
    assert (c["segments_equal"], c["segments_paired"]) == (2, 5)
    assert c["peak_reserved_error"] == pytest.approx(0.10)
    by = {(g["stream"], g["pool"]): g for g in c["groups"]}
    assert by[(0, "large")]["replay"] == [40 * MiB, 22 * MiB, 20 * MiB] and by[(7, "large")]["replay"] == []


def test_snapshots_cover_eight_scenarios_and_the_expandable_mode() -> None:
    names = [s.name for s in gs.SNAPSHOTS]
    assert len(set(names)) == len(names) >= 8
    for s in gs.SNAPSHOTS:
        s.scenario()  # every one a valid scenario (gpu_measure's, with the allocator setting)
    assert any(s.scenario().allocator_conf == gs.EXPANDABLE for s in gs.SNAPSHOTS)


@pytest.mark.slow
def test_cpu_smoke_runs_both_halves_and_the_replay_matches_itself(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    assert gs.main(["--cpu-smoke", "--out-dir", str(tmp_path)]) == 0
    assert gs.main(["--compare", str(tmp_path)]) == 0
    rows = [json.loads(x) for x in (tmp_path / "compare.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for r in rows:
        assert r["segments_equal"] == r["segments_paired"] > 0 and r["peak_reserved_error"] == 0


def test_the_cuda_branch_records_step_3_only_and_keeps_its_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from memsim_widget import measure

    calls: list[tuple] = []
    snapshot = {"segments": [_seg(20 * MiB, allocated=MiB)],
                "device_traces": [[{"action": "alloc", "size": MiB}, {"action": "segment_alloc", "size": 20 * MiB}]]}  # fmt: skip

    def train_steps(sc, lengths, device, on_phase):  # type: ignore[no-untyped-def]
        calls.append(("steps", tuple(lengths), device))
        for step in (1, 2, 3):
            for phase in ("forward", "backward", "optimizer step"):
                on_phase(step, phase)

    monkeypatch.setattr(measure, "train_steps", train_steps)
    monkeypatch.setattr(
        torch.cuda.memory, "_record_memory_history", lambda *a, **k: calls.append(("record", k))
    )
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: calls.append(("snapshot",)) or snapshot)
    for name, value in {"synchronize": None, "max_memory_reserved": 30 * MiB, "max_memory_allocated": 25 * MiB,
                        "memory_reserved": 20 * MiB, "memory_allocated": MiB, "get_device_name": "NVIDIA H100"}.items():  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, lambda *a, v=value: v)
    snap = next(s for s in gs.SNAPSHOTS if s.measurement == "qwen05b-bf16-longest" and s.alloc_conf)
    got = gs.take(snap, "cuda")
    # recording starts after step 2's optimizer step and stops after step 3's snapshot
    assert [c[0] for c in calls] == ["steps", "record", "snapshot", "record"]
    assert calls[0] == ("steps", (512, 2048, 1280), "cuda") and calls[-1][1] == {"enabled": None}
    assert (got["peak_reserved"], got["reserved_at_snapshot"], got["lengths"]) == (
        30 * MiB,
        20 * MiB,
        [512, 2048, 1280],
    )
    assert (
        got["name"] == "qwen05b-bf16-longest-expandable"
        and got["scenario"]["allocator_conf"] == gs.EXPANDABLE
    )
    assert got["segments"][0]["size"] == 20 * MiB and got["step3_events"]["counts"] == {
        "alloc": 1,
        "segment_alloc": 1,
    }
