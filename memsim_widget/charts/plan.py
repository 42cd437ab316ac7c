"""The candidate-layouts chart of a plan: memory per GPU against the modelled throughput (step-time model), fits in colour.

``candidates_spec`` builds a plain Vega-Lite dict (the widget sends it as is); ``candidates_chart`` wraps
it as an Altair chart for notebooks. Each point is one candidate; the dashed line is the usable memory
(the card less the headroom), the solid one the card.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from memsim_widget.charts import to_altair
from memsim_widget.charts.parts import CAPACITY_COLOR, SCHEMA
from memsim_widget.plan.search import Plan
from memsim_widget.units import GiB

if TYPE_CHECKING:
    import altair as alt

FIT_COLORS = {"fits": "#54a24b", "does not fit": "#bab0ac", "best": "#e45756"}
#: Points drawn at most (a reproducible sample of the rest; the best candidates are always drawn).
MAX_POINTS = 3000
TOOLTIP = ("layout", "num_gpus", "zero", "micro_batch_size", "activation_checkpointing", "loss", "optimizer",
           "offload", "device_total_gib", "tokens_per_gpu_s")  # fmt: skip


def candidate_records(plan: Plan, limit: int = MAX_POINTS, best: int = 10) -> list[dict[str, Any]]:
    """One record per drawn candidate: a sample of all of them plus the ``best`` ranked ones."""
    frame = plan.all_frame(limit=limit)
    top = plan.frame.head(best)
    frame = frame[~frame.candidate.isin(top.candidate)]
    rows = []
    for tag, f in (("other", frame), ("best", top)):
        # itertuples yields namedtuples (pandas' stubs say plain tuples): the columns are read as attributes
        for r in cast("Iterable[Any]", f.itertuples(index=False)):
            rows.append(
                {
                    "candidate": int(r.candidate),
                    "layout": f"dp={r.dp} tp={r.tp} pp={r.pp} cp={r.cp}"
                    + (f" ep={r.ep}" if r.ep > 1 else ""),
                    "num_gpus": int(r.num_gpus),
                    "zero": int(r.zero),
                    "micro_batch_size": int(r.micro_batch_size),
                    "activation_checkpointing": r.activation_checkpointing,
                    "loss": r.loss,
                    "optimizer": r.optimizer,
                    "offload": r.offload,
                    "device_total_gib": round(float(r.device_total_gib), 3),
                    "tokens_per_gpu_s": round(float(r.tokens_per_gpu_s), 2),
                    "status": "best" if tag == "best" else ("fits" if r.fits else "does not fit"),
                }
            )
    return rows


def candidates_spec(plan: Plan, limit: int = MAX_POINTS, best: int = 10) -> dict[str, Any]:
    """Vega-Lite: memory per GPU (nvidia-smi, GiB) against modelled tokens/s per GPU, one point each."""
    card = plan.columns["gpu_memory_bytes"] / GiB
    usable = card * (1 - plan.headroom)
    records = candidate_records(plan, limit, best)
    points = {
        "mark": {"type": "point", "filled": True, "opacity": 0.7, "size": 40},
        "encoding": {
            "x": {
                "field": "tokens_per_gpu_s",
                "type": "quantitative",
                "title": "modelled tokens/s per GPU",
            },
            "y": {
                "field": "device_total_gib",
                "type": "quantitative",
                "title": "memory per GPU (GiB, nvidia-smi, log scale)",
                "scale": {"type": "log"},
            },
            "color": {
                "field": "status",
                "type": "nominal",
                "scale": {"domain": list(FIT_COLORS), "range": list(FIT_COLORS.values())},
                "legend": {"title": None, "orient": "bottom"},
            },
            "order": {"field": "status", "sort": "ascending"},
            "tooltip": [{"field": k} for k in TOOLTIP],
        },
    }
    rules = {
        "data": {
            "values": [{"y": float(card), "what": "GPU memory"}, {"y": float(usable), "what": "usable"}]
        },
        "mark": {"type": "rule", "color": CAPACITY_COLOR},
        "encoding": {
            "y": {"field": "y", "type": "quantitative", "scale": {"type": "log"}},
            "strokeDash": {
                "field": "what",
                "type": "nominal",
                "scale": {"domain": ["GPU memory", "usable"], "range": [[1, 0], [4, 3]]},
                "legend": {"title": None, "orient": "bottom"},
            },
        },
    }
    counts = ", ".join(map(str, plan.gpu_counts)) + (" GPU" if plan.gpu_counts == (1,) else " GPUs")
    return {
        "$schema": SCHEMA,
        "title": {
            "text": f"{plan.evaluated:,} candidate layouts on {counts}: {plan.fitting:,} fit",
            "subtitle": "each point one layout and knob setting; red: the best ranked",
        },
        "width": 460,
        "height": 300,
        "data": {"values": records},
        "layer": [points, rules],
    }


def candidates_chart(plan: Plan, limit: int = MAX_POINTS, best: int = 10) -> alt.LayerChart:
    """The candidate-layouts chart as an Altair chart."""
    return to_altair(candidates_spec(plan, limit, best))  # type: ignore[return-value]
