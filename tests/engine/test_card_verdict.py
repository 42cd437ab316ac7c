"""The verdict under ``reserved_model: replay`` (``card_replay.card_replay``, ``Estimate.verdict_reason``): the
step's stream replayed on the card's real capacity (its memory less what lives outside the allocator) runs,
runs only because a failed cudaMalloc made the allocator release its cache and retry (PyTorch's ``malloc``:
``release_cached_blocks`` then retry, docs/allocator.md), or runs out of memory from fragmentation (the bytes
not allocated would hold the request, no single free range does) or from the total. The fitted rule
(``reserved_model: fitted``) has no replay and its estimate keeps its keys."""

from __future__ import annotations

import pytest

from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.counters.alloc_stream import StreamWriter, pool_replay
from memsim_widget.engine.counters.allocator import DEFAULT_CONF, MiB
from memsim_widget.engine.counters.card_replay import FRAGMENTATION, RELEASES_CACHE, RUNS, TOTAL, card_outcome
from memsim_widget.engine.estimate import Verdict
from memsim_widget.units import GiB


# ----- tiny cards, from the allocator's own rules ---------------------------------------------------------
def _release_stream() -> StreamWriter:
    """A 12 MiB request (>= 10 MiB: its own 12 MiB segment, ``get_allocation_size``), freed and cached, then a
    30 MiB request no cached block holds: cudaMalloc of 30 MiB more."""
    s = StreamWriter()
    s.mark("first")
    s.free(s.alloc(12 * MiB))
    s.mark("second")
    s.alloc(30 * MiB)
    return s


def test_a_stream_that_fits_both_segments_runs_without_a_release():
    out = card_outcome(_release_stream(), DEFAULT_CONF, 42 * MiB)  # 12 + 30 MiB: both segments fit
    assert (out.runs, out.cache_releases, out.reason, out.failure) == (True, 0, RUNS, None)
    assert out.text == "replayed on the card (42.00 MiB for PyTorch): runs"


def test_a_stream_runs_on_a_tiny_card_only_by_releasing_the_cache():
    # 40 MiB: 12 cached + 30 fails cudaMalloc; release_cached_blocks frees the unsplit 12 MiB segment; the retry
    # of 30 MiB fits
    out = card_outcome(_release_stream(), DEFAULT_CONF, 40 * MiB)
    assert (out.runs, out.cache_releases, out.reason) == (True, 1, RELEASES_CACHE)
    assert out.text == (
        "replayed on the card (40.00 MiB for PyTorch): runs only because failed cudaMallocs make the allocator "
        "free its cache (1 times a step or more): slower steps"
    )


def _split_stream(last: int) -> StreamWriter:
    """A 24 MiB segment (cached after its free), split by a 12 MiB request (large pool: the 12 MiB rest is over
    1 MiB, ``should_split``), its rest taken by a second 12 MiB request, the first freed: a 12 MiB free range
    inside a segment still in use (release_cached_blocks frees only unsplit segments); then ``last`` bytes."""
    s = StreamWriter()
    s.mark("setup")
    s.free(s.alloc(24 * MiB))
    first = s.alloc(12 * MiB)
    s.alloc(12 * MiB)
    s.free(first)
    s.mark("last request")
    s.alloc(last)
    return s


def test_fragmentation_fails_a_request_the_free_bytes_would_hold():
    # 40 MiB card, 24 MiB reserved, 12 MiB allocated: 28 MiB not allocated >= 20 MiB asked, but the largest free
    # range is the 16 MiB the card has left outside the segment (the cached one is 12 MiB)
    out = card_outcome(_split_stream(20 * MiB), DEFAULT_CONF, 40 * MiB)
    assert (out.runs, out.reason, out.at) == (False, FRAGMENTATION, "last request")
    f = out.failure
    assert (f.request, f.largest_free, f.free_bytes, f.cause) == (
        20 * MiB,
        16 * MiB,
        28 * MiB,
        "fragmentation",
    )
    assert out.text == (
        "replayed on the card (40.00 MiB for PyTorch): out of memory from fragmentation: 20.00 MiB asked, the "
        "free bytes would hold it but the largest free range is 16.00 MiB (at last request)"
    )


def test_a_request_over_the_free_total_fails_on_the_total():
    out = card_outcome(_split_stream(30 * MiB), DEFAULT_CONF, 40 * MiB)  # 30 MiB > 28 MiB not allocated
    assert (out.runs, out.reason, out.failure.request) == (False, TOTAL, 30 * MiB)
    assert out.text == (
        "replayed on the card (40.00 MiB for PyTorch): out of memory: 30.00 MiB asked, more than is free "
        "(at last request)"
    )


# ----- the estimate's verdict -----------------------------------------------------------------------------
BASE = {"model": "qwen2.5-0.5b", "seq_len": 512, "reserved_model": "replay"}


def _on_room(room: int) -> tuple:
    """The estimate of ``BASE`` on a custom card whose room for the allocator is ``room`` bytes (MiB multiples:
    the GiB float is exact), with the unlimited replay's peak reserved."""
    probe = estimate(BASE)
    outside = sum(i.bytes for i in probe.worst.device)
    est = estimate({**BASE, "gpu": {"memory_gib": (outside + room) / GiB}})
    assert est.gpu.memory_bytes == outside + room
    ctx = Context(est.scenario)
    return est, pool_replay(ctx, ctx.stages[0]).peak_reserved


def test_a_card_that_holds_the_unlimited_peak_runs():
    peak = _on_room(0)[1]
    est, _ = _on_room(peak)  # the replay never passes the room: no cudaMalloc fails
    rep = est.card_replay
    assert (rep.capacity, rep.runs, rep.cache_releases, est.verdict_reason) == (peak, True, 0, RUNS)
    assert est.verdict(0.0) == Verdict.FITS and est.fits(headroom=0.0)


@pytest.mark.parametrize("below", [2 * MiB, 1000 * MiB])
def test_the_verdict_follows_the_replay_on_the_card(below):
    peak = _on_room(0)[1]
    est, _ = _on_room(peak - below)
    rep = est.card_replay
    assert rep.capacity == peak - below
    assert est.device_total_bytes == est.gpu.memory_bytes  # the reserved counter is capped at the card
    assert est.verdict_reason == rep.reason and est.verdict_text == rep.text
    if rep.runs:  # releasing the cache: it runs (slower); the headroom band makes it tight
        assert rep.reason == RELEASES_CACHE
        assert est.fits(headroom=0.0) and est.verdict(0.0) == Verdict.FITS
        assert est.verdict(0.1) == Verdict.TIGHT
    else:  # inside the card by the capped counter, yet out of memory in the replay: does not fit
        assert rep.reason in (FRAGMENTATION, TOTAL)
        assert not est.fits(headroom=0.0) and est.verdict(0.0) == Verdict.DOES_NOT_FIT
        assert est.verdict(0.1) == Verdict.DOES_NOT_FIT
    d = est.to_dict(0.0)
    assert (d["verdict_reason"], d["card_replay"]["runs"]) == (rep.reason, rep.runs)
    # the card to recommend: one whose room holds the unlimited peak (it runs there, the test above)
    outside = est.device_total_bytes - est.peak_reserved_bytes
    assert est.recommended_memory_bytes(0.0) == outside + peak


def test_two_rooms_show_a_release_and_an_out_of_memory():
    peak = _on_room(0)[1]
    reasons = {_on_room(peak - below)[0].verdict_reason for below in (2 * MiB, 1000 * MiB)}
    assert RELEASES_CACHE in reasons and reasons & {FRAGMENTATION, TOTAL}


def test_the_fitted_rule_has_no_replay_verdict():
    est = estimate({**BASE, "reserved_model": "fitted"})
    assert est.card_replay is None and est.verdict_reason == "" and est.verdict_text == ""
    d = est.to_dict()
    assert not {"verdict_reason", "verdict_text", "card_replay"} & set(d)


def test_a_step_the_stream_does_not_model_keeps_the_plain_verdict():
    est = estimate(  # the first two layers offloaded (TransformerEngine's schedule): the fitted rule
        {**BASE, "activation_offloading": True, "activation_offloading_layers": 2}
    )
    assert est.card_replay is None and "verdict_reason" not in est.to_dict()
    every = estimate({**BASE, "activation_offloading": True})  # every layer (torchtune): offload_stream.py
    assert every.card_replay is not None and every.verdict_reason == "runs"
    ddp = estimate({**BASE, "parallel": {"dp": 2}})  # a DDP rank: replayed (engine/counters/ddp_stream.py)
    assert ddp.card_replay is not None
    accumulated = estimate(
        {**BASE, "grad_accum_steps": 2}
    )  # accumulation: replayed (alloc_stream.step_stream)
    assert accumulated.card_replay is not None and accumulated.verdict_reason == "runs"


def test_the_widget_result_carries_the_replay_verdict_only_under_the_replay():
    from memsim_widget.widget.result import build_result

    peak = _on_room(0)[1]
    est, _ = _on_room(peak - 1000 * MiB)
    r = build_result(est, 0.0)
    assert (r["verdict"], r["verdict_reason"], r["verdict_text"]) == (
        est.verdict(0.0),
        est.verdict_reason,
        est.verdict_text,
    )
    plain = build_result(estimate({**BASE, "reserved_model": "fitted"}), 0.1)
    assert "verdict_reason" not in plain and "verdict_text" not in plain


def test_the_scaling_curve_crosses_where_the_replay_runs_out_of_memory():
    from memsim_widget import charts

    # stop 4's capped total is inside the limit, but its replay on the card ran out of memory
    totals = [{"x": 1, "bytes": 10}, {"x": 2, "bytes": 20}, {"x": 4, "bytes": 30, "oom": True}]
    assert charts.crossing(totals, 40) == {"max_fit": 2, "first_over": 4, "at": 4}
    assert charts.crossing(totals[:2], 40) == {"max_fit": 2, "first_over": None, "at": None}


def test_the_widget_scaling_summary_follows_the_replay_verdict():
    from memsim_widget import charts

    peak = _on_room(0)[1]
    est, _ = _on_room(peak)  # micro-batch 1 runs; larger ones pass the room
    data = charts.scaling_data(est, 0.0, axes=("micro_batch_size",))["micro_batch_size"]
    by_x = {t["x"]: t for t in data["totals"]}
    fit = data["crosses_capacity"]["max_fit"]
    assert fit is not None and not by_x[fit].get("oom")
    for x, t in by_x.items():  # every stop marked oom is one the estimate calls does not fit
        if t.get("oom"):
            e = estimate({**est.scenario.to_dict(), "micro_batch_size": x})
            assert not e.card_replay.runs and e.verdict(0.0) == Verdict.DOES_NOT_FIT
