"""How memory per GPU scales with the number of GPUs: one scenario, data parallelism grown, per ZeRO stage.

The scenario's tensor/pipeline/context layout and knobs are kept; ``dp`` takes every value that makes a GPU
count of the range, and each ZeRO stage gets a line. Plain data parallelism (ZeRO-0) is flat: every replica
holds everything. ZeRO-1/2/3 shard optimizer states, then gradients, then weights over ``dp x cp`` ranks
(Rajbhandari et al. 2020), so their lines fall towards what never shards: activations, the gathered layers,
workspaces, the CUDA context. Figures come from ``plan.vector`` (equal to ``estimate`` to the byte).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from memsim_widget.charts import gpu_label, model_label, to_altair
from memsim_widget.charts.parts import SCHEMA, capacity_layers
from memsim_widget.engine.context import Context
from memsim_widget.engine.estimate import DEFAULT_HEADROOM
from memsim_widget.errors import ScenarioError
from memsim_widget.plan.space import gpu_counts
from memsim_widget.plan.vector import OFFLOADS, evaluate, scenario_columns
from memsim_widget.scenario import Scenario
from memsim_widget.units import GiB

if TYPE_CHECKING:
    import altair as alt
    import pandas as pd

ZERO_COLORS = ("#bab0ac", "#4c78a8", "#f58518", "#54a24b")


def gpu_scaling(
    scenario: Scenario | Mapping[str, Any],
    gpus: int | tuple[int, int] | Sequence[int] = (1, 1024),
    zero: Sequence[int] = (0, 1, 2, 3),
    headroom: float = DEFAULT_HEADROOM,
) -> pd.DataFrame:
    """Memory per GPU (nvidia-smi, allocated, reserved) for each GPU count and ZeRO stage.

    Counts that the scenario's ``tp x pp x cp`` does not divide are skipped; optimizer offload is kept
    only where the ZeRO stage allows it. Under hybrid sharding (``parallel.dp_shard``) the ZeRO lines keep the
    shard group and add replicas (counts whose dp the shard degree does not divide are left out of them).
    """
    import pandas as pd

    if not isinstance(scenario, Scenario):
        scenario = Scenario.from_dict(scenario)
    par = scenario.parallel
    other = par.tp * par.pp * par.cp
    counts = [n for n in gpu_counts(gpus) if n % other == 0]
    bad = [z for z in zero if z not in (0, 1, 2, 3)]
    if bad or not zero:
        raise ScenarioError("zero", f"got {list(zero)}; allowed values: 0, 1, 2, 3")
    if not counts:
        raise ScenarioError("gpus", f"no GPU count in {gpus!r} is a multiple of tp*pp*cp = {other}")
    rows = []
    shard = par.dp_shard or 0
    for n in counts:
        dp = n // other
        for z in zero:
            if z and dp * par.cp == 1:
                continue  # one replica: nothing to shard
            if z and shard and dp % shard:
                continue  # hybrid sharding: replicas of the scenario's shard group only
            off = par.offload if z else "none"
            if off == "optimizer+params" and z != 3:
                off = "optimizer"
            if par.ep > 1 and (dp * par.cp) % par.ep:
                continue
            rows.append((n, dp, z, OFFLOADS.index(off)))
    cols = {k: np.full(len(rows), v) for k, v in scenario_columns(scenario).items()}
    cols["dp"] = np.array([r[1] for r in rows])
    cols["zero"] = np.array([r[2] for r in rows])
    cols["offload"] = np.array([r[3] for r in rows])
    cols["dp_shard"] = np.where(cols["zero"] > 0, shard, 0)
    ev = evaluate(scenario, cols, (scenario.optimizer,))
    card = Context(scenario).gpu.memory_bytes
    return pd.DataFrame(
        {
            "num_gpus": [r[0] for r in rows],
            "dp": cols["dp"],
            "zero": cols["zero"],
            "offload": [OFFLOADS[r[3]] for r in rows],
            "device_total_gib": ev.device_total_bytes / GiB,
            "peak_reserved_gib": ev.peak_reserved_bytes / GiB,
            "peak_allocated_gib": ev.peak_allocated_bytes / GiB,
            "peak_phase": ev.peak_phase,
            "fits": ev.fits(card * (1 - headroom)),
        }
    )


def gpu_scaling_spec(
    scenario: Scenario | Mapping[str, Any],
    gpus: int | tuple[int, int] | Sequence[int] = (1, 1024),
    headroom: float = DEFAULT_HEADROOM,
) -> dict[str, Any]:
    """Vega-Lite: memory per GPU (nvidia-smi) against the GPU count (log 2), one line per ZeRO stage."""
    if not isinstance(scenario, Scenario):
        scenario = Scenario.from_dict(scenario)
    frame = gpu_scaling(scenario, gpus, headroom=headroom)
    ctx = Context(scenario)
    records = [
        {
            "num_gpus": int(r.num_gpus),
            "stage": f"ZeRO-{r.zero}",
            "device_total_gib": round(float(r.device_total_gib), 3),
            "fits": "fits" if r.fits else "does not fit",
            "peak_phase": r.peak_phase,
        }
        # itertuples yields namedtuples (pandas' stubs say plain tuples): the columns are read as attributes
        for r in cast("Iterable[Any]", frame.itertuples(index=False))
    ]
    stages = [f"ZeRO-{z}" for z in (0, 1, 2, 3)]
    lines = {
        "data": {"values": records},
        "mark": {"type": "line", "point": {"filled": True, "size": 50}},
        "encoding": {
            "x": {
                "field": "num_gpus",
                "type": "quantitative",
                "scale": {"type": "log", "base": 2},
                "axis": {"values": sorted({r["num_gpus"] for r in records})},
                "title": "GPUs (data parallelism grown, the rest of the layout kept)",
            },
            "y": {
                "field": "device_total_gib",
                "type": "quantitative",
                "title": "memory per GPU (GiB, nvidia-smi)",
            },
            "color": {
                "field": "stage",
                "type": "nominal",
                "scale": {"domain": stages, "range": list(ZERO_COLORS)},
                "legend": {"title": None, "orient": "bottom"},
            },
            "tooltip": [
                {"field": k} for k in ("num_gpus", "stage", "device_total_gib", "fits", "peak_phase")
            ],
        },
    }
    label = gpu_label(scenario.gpu) if not isinstance(scenario.gpu, str) else ctx.gpu.name
    return {
        "$schema": SCHEMA,
        "title": {
            "text": f"{model_label(scenario.model)}: memory per GPU as GPUs are added",
            "subtitle": f"tp={scenario.parallel.tp} pp={scenario.parallel.pp} cp={scenario.parallel.cp}, "
            f"micro-batch {scenario.micro_batch_size} x {scenario.seq_len} tokens; red: {ctx.gpu.name}",
        },
        "width": 460,
        "height": 280,
        "layer": [*capacity_layers(ctx.gpu.memory_bytes, headroom, label), lines],
    }


def gpu_scaling_chart(
    scenario: Scenario | Mapping[str, Any],
    gpus: int | tuple[int, int] | Sequence[int] = (1, 1024),
    headroom: float = DEFAULT_HEADROOM,
) -> alt.LayerChart:
    """The GPU-count scaling chart as an Altair chart."""
    return to_altair(gpu_scaling_spec(scenario, gpus, headroom))  # type: ignore[return-value]
