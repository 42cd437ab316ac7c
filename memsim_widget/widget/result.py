"""The ``result`` trait: verdict, peaks with the counters they predict, bottleneck, per-rank bytes, breakdown."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget import charts as charts_mod
from memsim_widget.engine.estimate import COUNTERS, Estimate
from memsim_widget.units import GiB, fmt_bytes


def _peak(key: str, label: str, nbytes: int) -> dict[str, Any]:
    """One headline peak with the counter it predicts."""
    return {
        "key": key,
        "label": label,
        "bytes": nbytes,
        "gib": round(nbytes / GiB, 3),
        "size": fmt_bytes(nbytes),
        "counter": COUNTERS[key],
    }


def build_result(est: Estimate, headroom: float, scaling: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``result`` trait: verdict, peaks with their counters, bottleneck, per-rank bytes and the breakdown."""
    cap = est.gpu.memory_bytes
    b = est.bottleneck()
    top = b["items"][0] if b["items"] else None
    bottleneck_text = (
        f"{b['category']} dominate {b['rank']} at {b['moment']}: {fmt_bytes(b['bytes'])} ({b['share']:.0%})"
        + (f"; largest item {top['item']} = {top['formula']}" if top else "")
    )
    summary_scaling = {}
    for axis, d in (scaling or {}).items():
        if "crosses_capacity" in d:
            summary_scaling[axis] = {
                "max_fit": d["crosses_headroom"]["max_fit"],
                "exceeds_at": d["crosses_capacity"]["at"],
                "invalid": [i["value"] for i in d["invalid"]],
            }
        elif d.get("fixed"):
            summary_scaling[axis] = {"fixed": d["fixed"]}
    return {
        "verdict": est.verdict(headroom),
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
            _peak("device_total_bytes", "nvidia-smi", est.device_total_bytes),
            _peak("peak_reserved_bytes", "reserved", est.peak_reserved_bytes),
            _peak("peak_allocated_bytes", "allocated", est.peak_allocated_bytes),
            _peak("peak_tensor_bytes", "tensors", est.peak_tensor_bytes),
        ],
        "recommended_bytes": est.recommended_memory_bytes(headroom),
        "host_bytes": max((r.host_bytes for r in est.ranks), default=0),
        "bottleneck": {**b, "text": bottleneck_text},
        "per_rank": [
            {
                "rank": r.label,
                "stage": r.stage.index,
                "peak_moment": r.peak_phase,
                "device_total_bytes": r.device_total_bytes,
                "components": r.components(),
            }
            for r in est.ranks
        ],
        "rows": [{**row, "gib": round(row["gib"], 4)} for row in est.rows()],
        "scaling": summary_scaling,
        "summary": est.summary(),
    }
