"""The optimizer on one rank: the fp32 master weights and the optimizer states (ZeRO-1 sharded, offloaded to the
host, or paged), and what its step allocates (foreach, for-loop, fused;
docs/memory-facts.md#the-optimizer-step)."""

from __future__ import annotations

from memsim_widget.engine.context import Context
from memsim_widget.engine.items import Item
from memsim_widget.engine.states.budget import StateBudget, shard_note, shard_why
from memsim_widget.engine.states.trained import Trained
from memsim_widget.optimizers import PAGED_MIN_NUMEL
from memsim_widget.units import fmt_int

#: The item name of the fp32 master weights (the ZeRO-1/2 replay writes DeepSpeed's own master partition instead)
MASTER_ITEM = "fp32 master weights"


def _sharding(ctx: Context) -> tuple[int, str, str]:
    """The optimizer's ZeRO shard divisor (over dp x cp, or dp_shard x cp; stage 1 on), its note, and its level (host when offloaded)."""
    par = ctx.par
    z = par.zero
    o_div = par.shard_degree if z >= 1 else 1
    o_note = shard_note(o_div, shard_why(par, f"ZeRO-{z}"))
    level = "host" if par.offload != "none" else "tensor"
    return o_div, o_note, level


def optimizer_states(ctx: Context, tr: Trained, b: StateBudget) -> None:
    """The fp32 master weights and the optimizer's states."""
    opt = ctx.opt
    trainable, state_b, master_b, what = tr.entries, tr.state_b, tr.master_b, tr.what
    n_train, tensors_train = tr.n, tr.tensors
    o_div, o_note, level = _sharding(ctx)
    on_host_opt = ctx.par.offload != "none"
    if master_b:
        b.persistent.append(
            Item(
                "optimizer_states",
                MASTER_ITEM,
                n_train * master_b // o_div,
                f"{fmt_int(n_train)} x {master_b} B{o_note}",
                level,
                tensors_train,
            )
        )
    if opt.states:
        sbytes = sum(opt.state_bytes(shape, state_b) * c for shape, c, _ in trainable) // o_div
        paged = (
            0
            if on_host_opt
            else sum(opt.paged_bytes(shape, state_b) * c for shape, c, _ in trainable) // o_div
        )
        formula = f"{fmt_int(n_train)} {what} x {opt.state_formula(state_b)}{o_note}"
        if paged:
            # bitsandbytes pages the state buffers of parameters of 1e5 elements or more (cudaMallocManaged,
            # torch.frombuffer over unified memory: outside PyTorch's caching allocator, resident on the device
            # until it is paged out); the blocks' absmax and smaller parameters' states are ordinary tensors
            b.persistent.append(
                Item(
                    "optimizer_states",
                    f"{opt.name} states (paged)",
                    paged,
                    f"state buffers of parameters >= {fmt_int(PAGED_MIN_NUMEL)} elements of {formula} (paged: "
                    "unified memory outside the caching allocator, can spill to host)",
                    "device",
                    tensors_train * opt.states,
                )
            )
            formula = (
                f"{formula} - the paged buffers (absmax blocks, parameters < {fmt_int(PAGED_MIN_NUMEL)})"
            )
        if sbytes - paged:
            b.persistent.append(
                Item(
                    "optimizer_states",
                    f"{opt.name} states",
                    sbytes - paged,
                    formula,
                    level,
                    tensors_train * opt.states,
                )
            )


def step_temporaries(ctx: Context, tr: Trained, b: StateBudget) -> None:
    """What the optimizer step allocates beside the states (per group, per tensor, or nothing when fused)."""
    sc, opt = ctx.scenario, ctx.opt
    trainable, state_b = tr.entries, tr.state_b
    n_train, tensors_train = tr.n, tr.tensors
    o_div, o_note, level = _sharding(ctx)
    impl = "fused" if opt.impls == ("fused",) else sc.optimizer_impl
    if sc.optimizer != "none":
        largest = max(e for _, _, e in trainable)
        if sc.optimizer_in_backward:
            factor = {"foreach": 1.0, "fused": 0.0, "for-loop": opt.temp_for_loop}.get(impl, 1.0)
            if opt.temp_foreach == 0 and impl == "foreach":
                factor = 0.0
            tbytes = int(factor * largest * state_b)
            formula = f"{factor:g} x largest param {fmt_int(largest)} x {state_b} B (per-parameter step)"
        elif impl == "foreach" and 0 < tr.unsplit < n_train:
            # tp > 1 with parameters the plan leaves as plain tensors (transformers' plan: the untied
            # embedding, the norms): a foreach optimizer refuses a param group that mixes them with DTensors
            # (DTensor's foreach ops need every operand a DTensor), so a TP run gives it one group per kind
            # and each group's kernels run apart (trace/run.param_groups does so; traced): the buffer is the
            # larger group's
            group = max(tr.unsplit, n_train - tr.unsplit)
            tbytes = int(opt.temp_foreach * group * state_b // o_div)
            formula = (
                f"{opt.temp_foreach:g} x max({fmt_int(n_train - tr.unsplit)} split by tp, "
                f"{fmt_int(tr.unsplit)} whole) x {state_b} B (foreach buffer of the larger group){o_note}"
            )
        elif impl == "foreach":
            tbytes = int(opt.temp_foreach * n_train * state_b // o_div)
            formula = f"{opt.temp_foreach:g} x {fmt_int(n_train)} x {state_b} B (foreach buffer of the group){o_note}"
        elif impl == "for-loop":
            repeated = max((e for _, c, e in trainable if c >= 2), default=0)
            if opt.temp_fp32_copies and state_b < 4:
                tbytes = opt.temp_fp32_copies * 4 * -(-largest // o_div)
                formula = f"{opt.temp_fp32_copies} fp32 copies x largest param {fmt_int(largest)} x 4 B"
            else:
                elems = max(opt.temp_for_loop * largest, (opt.temp_for_loop + 1) * repeated)
                tbytes = int(-(-elems // o_div) * state_b)
                formula = (
                    f"max({opt.temp_for_loop:g} x largest param {fmt_int(largest)}, "
                    f"{opt.temp_for_loop + 1:g} x largest repeated {fmt_int(repeated)}) x {state_b} B "
                    "(per-tensor step; the previous tensor's buffer still alive)"
                )
        else:
            tbytes = int(opt.temp_fused * n_train * state_b // o_div)
            formula = "fused kernel: no temporaries"
        if tbytes:
            b.step_temps.append(
                Item(
                    "temporaries",
                    f"optimizer step ({impl})",
                    tbytes,
                    formula,
                    level if not sc.optimizer_in_backward else "tensor",
                    1 if impl != "foreach" else tensors_train,
                )
            )
