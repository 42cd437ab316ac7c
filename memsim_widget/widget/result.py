"""The ``result`` trait: verdict, peaks with the counters they predict, bottleneck, per-rank bytes, breakdown."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget import charts as charts_mod
from memsim_widget.engine.estimate import COUNTERS, Estimate
from memsim_widget.units import GiB, fmt_bytes


def _peak(est: Estimate, key: str, label: str) -> dict[str, Any]:
    """One headline peak with the counter it predicts and the rank (pipeline stage) whose figure it is."""
    rank = est.worst_for(key)
    nbytes = rank.counter(key)
    return {
        "key": key,
        "label": label,
        "bytes": nbytes,
        "gib": round(nbytes / GiB, 3),
        "size": fmt_bytes(nbytes),
        "counter": COUNTERS[key],
        "rank": rank.label,
    }


#: ``result["scaling"]`` while the scaling view of the scenario shown is computed in the background
#: (``scaling_panel``): no largest micro-batch or sequence is shown until it is published.
SCALING_PENDING: dict[str, Any] = {"pending": True}


def scaling_summary(scaling: Mapping[str, Any]) -> dict[str, Any]:
    """``result["scaling"]`` of ``charts.scaling_data``: per axis the largest stop that fits the headroom
    (``max_fit``), where the total exceeds the GPU (``exceeds_at``) and the invalid stops; or the fixed length."""
    summary: dict[str, Any] = {}
    for axis, d in scaling.items():
        if "crosses_capacity" in d:
            summary[axis] = {
                "max_fit": d["crosses_headroom"]["max_fit"],
                "exceeds_at": d["crosses_capacity"]["at"],
                "invalid": [i["value"] for i in d["invalid"]],
            }
        elif d.get("fixed"):
            summary[axis] = {"fixed": d["fixed"]}
    return summary


def build_result(est: Estimate, headroom: float, scaling: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``result`` trait: verdict, peaks with their counters, bottleneck, per-rank bytes and the breakdown.

    ``scaling``: the estimate's ``charts.scaling_data`` for the summary (``scaling_summary``); without it the
    summary is empty (the widget puts ``SCALING_PENDING`` there while a background job computes it).
    """
    cap = est.gpu.memory_bytes
    b = est.bottleneck()
    top = b["items"][0] if b["items"] else None
    bottleneck_text = (
        f"{b['category']} dominate {b['rank']} at {b['moment']}: {fmt_bytes(b['bytes'])} ({b['share']:.0%})"
        + (f"; largest item {top['item']} = {top['formula']}" if top else "")
    )
    return {
        "verdict": est.verdict(headroom),
        # under reserved_model: replay, the replay on the card: why the verdict (runs, releases cache, ...)
        **est.verdict_why(),
        "caveats": list(est.caveats),
        "headroom": headroom,
        "model": charts_mod.model_label(est.scenario.model),
        "family": est.arch.family,
        "parameters": est.parameters,
        "trainable_parameters": est.trainable_parameters,
        "gpu": {
            "id": est.gpu.id,
            "name": est.gpu.name,
            "memory_bytes": cap,
            "memory_gib": round(cap / GiB, 2),
        },
        "usable_bytes": int(cap * (1 - headroom)),
        "peak_moment": est.peak_phase,
        "peak_rank": est.worst.label,
        "peaks": [
            _peak(est, "device_total_bytes", "nvidia-smi"),
            _peak(est, "peak_reserved_bytes", "reserved"),
            _peak(est, "peak_allocated_bytes", "allocated"),
            _peak(est, "peak_tensor_bytes", "tensors"),
        ],
        "recommended_bytes": est.recommended_memory_bytes(headroom),
        "host_bytes": max((r.host_bytes for r in est.ranks), default=0),
        "bottleneck": {**b, "text": bottleneck_text},
        "per_rank": [
            {
                "rank": r.label,
                "stage": r.stage.index,
                "peak_moment": r.peak_phase,
                **{c: r.counter(c) for c in COUNTERS},
                "components": r.components(),
            }
            for r in est.ranks
        ],
        "rows": [{**row, "gib": round(row["gib"], 4)} for row in est.rows()],
        "scaling": scaling_summary(scaling or {}),
        "summary": est.summary(),
    }
