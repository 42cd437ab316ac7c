"""``model_states``: one rank's weights, gradients, master copy, optimizer states and ZeRO-3 gathered units,
assembled kind by kind (each kind's rules in its own module)."""

from __future__ import annotations

from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.states.budget import StateBudget, local_groups
from memsim_widget.engine.states.gathered import gathered_units
from memsim_widget.engine.states.gradients import gradients, offload_staging, reduce_bucket
from memsim_widget.engine.states.optimizer import optimizer_states, step_temporaries
from memsim_widget.engine.states.trained import trained
from memsim_widget.engine.states.weights import weights


def model_states(ctx: Context, stage: Stage) -> StateBudget:
    """Weights, gradients, master weights and optimizer states of one rank of ``stage``."""
    groups = local_groups(ctx, stage)
    b = StateBudget()
    b.params_local = sum(g.numel for g in groups)
    weights(ctx, groups, b)
    tr = trained(ctx, stage, groups, b)
    b.trainable_local = tr.n
    gradients(ctx, stage, groups, tr, b)
    optimizer_states(ctx, tr, b)
    step_temporaries(ctx, tr, b)
    reduce_bucket(ctx, tr.n, b)
    offload_staging(ctx, tr, b)
    gathered_units(ctx, stage, groups, tr.grad_b, b)
    if ctx.par.offload != "none":  # the offloaded states are host memory too
        b.host.extend(i for i in b.persistent + b.step_temps if i.level == "host")
    return b
