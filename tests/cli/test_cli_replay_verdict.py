"""``memsim estimate`` under ``reserved_model: replay``: the verdict line is followed by the replay on the card in
words (runs / runs only by releasing the cache / out of memory, naming the request and the largest free range);
the default output has no such line."""

from __future__ import annotations

import json

from memsim_widget.cli import main
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.counters.alloc_stream import pool_replay
from memsim_widget.units import GiB

BASE = {"model": "qwen2.5-0.5b", "seq_len": 512, "reserved_model": "replay"}
MiB = 2**20


def _card(below: int) -> dict:
    """A custom card whose allocator room is ``below`` bytes under the unlimited replay's peak reserved."""
    est = estimate(BASE)
    ctx = Context(est.scenario)
    outside = sum(i.bytes for i in est.worst.device)
    return {"memory_gib": (outside + pool_replay(ctx, ctx.stages[0]).peak_reserved - below) / GiB}


def _lines(capsys, tmp_path, scenario: dict, *flags: str) -> list[str]:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario))
    assert main(["estimate", str(path), *flags]) == 0
    return capsys.readouterr().out.splitlines()


def test_the_verdict_line_says_what_the_replay_on_the_card_found(capsys, tmp_path):
    for below in (2 * MiB, 1000 * MiB):
        sc = {**BASE, "gpu": _card(below)}
        lines = _lines(capsys, tmp_path, sc, "--headroom", "0")
        est = estimate(sc)
        i = next(k for k, line in enumerate(lines) if line.startswith("verdict   "))
        assert lines[i].startswith(f"verdict   {est.verdict(0.0)} (0% headroom; ")
        assert lines[i + 1] == f"          {est.verdict_text}"
        assert lines[i + 1].startswith("          replayed on the card (")
        if est.card_replay.runs:
            assert "runs only because failed cudaMallocs make the allocator free its cache" in lines[i + 1]
        else:
            f = est.card_replay.failure
            assert lines[i].startswith("verdict   does not fit")
            assert f"{f.request / MiB:.2f} MiB asked" in lines[i + 1]


def test_json_names_the_reason(capsys, tmp_path):
    sc = {**BASE, "gpu": _card(1000 * MiB)}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(sc))
    assert main(["estimate", str(path), "--json", "--headroom", "0"]) == 0
    d = json.loads(capsys.readouterr().out)
    est = estimate(sc)
    assert d["verdict_reason"] == est.verdict_reason and d["verdict_text"] == est.verdict_text
    assert d["card_replay"]["capacity_bytes"] == est.gpu.memory_bytes - (
        est.device_total_bytes - d["peak_reserved_bytes"]
    )


def test_the_fitted_default_prints_no_replay_line(capsys, tmp_path):
    lines = _lines(capsys, tmp_path, {**BASE, "reserved_model": "fitted", "gpu": _card(1000 * MiB)})
    assert not any("replayed on the card" in line for line in lines)


def test_recommend_json_gives_the_same_reason_as_estimate_and_none_under_the_fitted_rule(capsys, tmp_path):
    """``memsim recommend --json`` names the replay's reason and words for the scenario's verdict (the same as
    ``memsim estimate --json``), and under the fitted default its JSON has neither key."""
    for model, expect in (("replay", True), ("fitted", False)):
        sc = {**BASE, "reserved_model": model, "gpu": _card(1000 * MiB)}
        path = tmp_path / "s.json"
        path.write_text(json.dumps(sc))
        assert main(["recommend", str(path), "--json", "--headroom", "0"]) == 0
        d = json.loads(capsys.readouterr().out)
        assert ("verdict_reason" in d) is expect
        if expect:
            est = estimate(sc)
            assert d["verdict_reason"] == est.verdict_reason and d["verdict_text"] == est.verdict_text
            assert d["verdict_reason"] in ("fragmentation", "total")
