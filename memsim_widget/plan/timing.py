"""The engine's step-time model over the planner's candidate columns, with numpy: the same floats as
``estimate(plan.scenario(i)).step_time_s`` for every candidate (``engine/speed/step_time.step_parts`` is written
once, over scalars or arrays)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from memsim_widget.engine.context import Context
from memsim_widget.engine.speed.step_time import TIME_CATEGORIES, Ops, optimizer_step_bytes, step_parts
from memsim_widget.engine.speed.time_breakdown import context_time_model
from memsim_widget.optimizers import OPTIMIZERS
from memsim_widget.scenario import Scenario

NUMPY_OPS = Ops(where=np.where, maximum=np.maximum)
#: The candidate columns ``step_parts`` reads (``opt_bytes`` is derived from ``optimizer``).
TIME_COLUMNS = ("dp", "tp", "pp", "cp", "ep", "zero", "sp", "micro_batch", "grad_accum", "pp_microbatches",
                "checkpointing", "loss", "offload")  # fmt: skip


def time_columns(
    base: Scenario, cols: Mapping[str, np.ndarray], optimizers: Sequence[str]
) -> dict[str, np.ndarray]:
    """Modelled step time, tokens/s per GPU, MFU and the seconds of each category, one value per candidate
    (plus ``bubble``, ``recompute`` and ``communication_s`` for the planner's frame)."""
    ctx = Context(base)
    k = replace(context_time_model(ctx), checkpoint_every=1)  # candidates checkpoint every layer or none
    per_opt = np.array(
        [optimizer_step_bytes(ctx.recipe, OPTIMIZERS[o]) for o in optimizers], dtype=np.float64
    )
    c: dict[str, np.ndarray] = {name: np.asarray(cols[name], dtype=np.int64) for name in TIME_COLUMNS}
    c["opt_bytes"] = per_opt[np.asarray(cols["optimizer"], dtype=np.int64)]
    p = step_parts(k, c, NUMPY_OPS)
    n = c["dp"].shape[0]

    def col(key: str) -> np.ndarray:
        return np.broadcast_to(np.asarray(p[key], dtype=np.float64), (n,)).copy()

    out = {key: col(key) for key in ("step_time_s", "tokens_per_gpu_s", "mfu")}
    out.update({f"time_{cat}": col(cat) for cat in TIME_CATEGORIES})
    step = out["step_time_s"]
    out["bubble"] = out["time_pipeline bubble"] / step
    out["recompute"] = out["time_recompute"] / step
    out["communication_s"] = out["time_tensor/context parallel"] + out["time_data parallel"]
    return out
