"""The step time of a resolved scenario with its breakdown: each item's seconds and its formula, numbers in."""

from __future__ import annotations

from memsim_widget.engine.context import Context
from memsim_widget.engine.speed.step_time import (
    TIME_CATEGORIES,
    TimeCategory,
    TimeModel,
    method_flops_per_token,
    optimizer_step_bytes,
    scenario_columns,
    step_parts,
    time_model,
)
from memsim_widget.engine.states.weights import fetched_bytes_per_parameter
from memsim_widget.fast_dataclass import dataclass


@dataclass(frozen=True)
class TimeItem:
    """Seconds per step one part of the work takes on the slowest rank, and how."""

    category: TimeCategory
    item: str
    seconds: float
    formula: str


@dataclass(frozen=True)
class StepTime:
    """One step's time, throughput and MFU, and where the time goes."""

    step_time_s: float
    tokens_per_second_per_gpu: float
    mfu: float
    items: tuple[TimeItem, ...]
    model_flops_per_token: float

    def categories(self) -> dict[str, float]:
        """Seconds per category (``TIME_CATEGORIES`` order)."""
        out: dict[str, float] = dict.fromkeys(TIME_CATEGORIES, 0.0)
        for i in self.items:
            out[i.category] += i.seconds
        return out


def context_time_model(ctx: Context) -> TimeModel:
    """The fixed part of the time model of a resolved scenario."""
    adapters = sum(a.numel for a in ctx.adapters)
    io = sum((a.in_features + a.out_features) * a.base.count for a in ctx.adapters)
    return time_model(ctx.scenario, ctx.arch, ctx.recipe, ctx.gpu, ctx.trainable_parameters, adapters, io,
                      fetched_bytes_per_parameter(ctx))  # fmt: skip


def step_time(ctx: Context) -> StepTime:
    """The modelled time of one training step of ``ctx``'s scenario."""
    k = context_time_model(ctx)
    parts = step_parts(k, scenario_columns(ctx.scenario, optimizer_step_bytes(ctx.recipe, ctx.opt)))
    return StepTime(
        step_time_s=parts["step_time_s"],
        tokens_per_second_per_gpu=parts["tokens_per_gpu_s"],
        mfu=parts["mfu"],
        items=_items(k, parts),
        model_flops_per_token=method_flops_per_token(k),
    )


def _g(x: float) -> str:
    """A compact number for formulas."""
    return f"{x:.4g}"


def _items(k: TimeModel, p: dict) -> tuple[TimeItem, ...]:
    """The breakdown items of ``step_parts``' result, with their formulas."""
    v = p["_"]
    m = v["m"]
    eff = f"{_g(k.peak_flops / 1e12)} TFLOP/s x {k.efficiency}"
    mm = v["lin"] + v["ada"] + v["head"]
    att_b = m * v["t_att"] * k.attention_backward
    out = [
        TimeItem(TimeCategory.FORWARD, "matmuls (Linear, adapters, head)", m * v["t_lin"],
                 f"{_g(m)} micro-batches x ({_g(mm)} FLOP / ({eff}) + {_g(v['io'])} B GEMM reads and writes / "
                 f"{_g(v['hbm'] / 1e9)} GB/s)"),
        TimeItem(TimeCategory.FORWARD, "attention (causal)", m * v["t_att"],
                 f"{_g(m)} x {_g(v['att'])} FLOP / ({eff} x {k.attention_efficiency} attention kernels)"),
        TimeItem(TimeCategory.BACKWARD, "matmuls (Linear, adapters, head)", p["backward"] - att_b,
                 "2x forward for trained weights (activation and weight gradients), 1x for frozen ones"),
        TimeItem(TimeCategory.BACKWARD, "attention", att_b,
                 f"{k.attention_backward} x the forward's attention (FlashAttention-2's 5 matmuls for 2)"),
        TimeItem(TimeCategory.RECOMPUTE, "checkpointed forward and chunked loss", p["recompute"],
                 "forward FLOPs rerun in backward (full: the layer, selective: attention, selective-op: half the "
                 "matmuls; chunked loss: the head)"),
        TimeItem(TimeCategory.MEMORY_BOUND, "norms, residuals, activations, RoPE", m * v["el"] / v["hbm"],
                 f"{_g(m)} x {_g(v['el'])} B / {_g(v['hbm'] / 1e9)} GB/s (80% of HBM)"),
        TimeItem(TimeCategory.MEMORY_BOUND, "cross-entropy over the logits", m * v["loss_b"] / v["hbm"],
                 f"{_g(m)} x {_g(v['t'])} tokens x {k.vocab} logits x 30 B / {_g(v['hbm'] / 1e9)} GB/s"),
        TimeItem(TimeCategory.MEMORY_BOUND, "autocast weight copies", m * v["cast_b"] / v["hbm"],
                 "fp32 -> 16-bit copy of the local weights each forward, 6 B per parameter"),
        TimeItem(TimeCategory.MEMORY_BOUND, "QLoRA dequantisation", m * v["deq_b"] / v["hbm"],
                 "NF4 -> bf16 before each matmul that reads the weight, 2.5 B per element"),
        TimeItem(TimeCategory.MEMORY_BOUND, "torchao float8 casts", m * v["f8_b"] / v["hbm"],
                 f"amax + cast of each Linear's input (twice), output gradient and weight (forward and backward), "
                 f"{k.fp8_cast_bytes:g} B per element{' x 0.5 (compile)' if k.compile else ''}"),
        TimeItem(TimeCategory.TENSOR_CONTEXT_PARALLEL, "tensor parallel all-reduces", m * v["t_tp"],
                 "4 collectives per layer and micro-batch (6 with full recomputation) of t x hidden, ring 2(tp-1)/tp"),
        TimeItem(TimeCategory.TENSOR_CONTEXT_PARALLEL, "context parallel K/V ring (exposed)", m * v["t_cp"],
                 "3 x (cp-1) K/V chunks per layer, less the attention compute it overlaps"),
        TimeItem(TimeCategory.TENSOR_CONTEXT_PARALLEL, "expert all-to-all", m * v["t_ep"],
                 "dispatch and combine, forward and backward, (ep-1)/ep of t x top-k x hidden"),
        TimeItem(TimeCategory.TENSOR_CONTEXT_PARALLEL, "pipeline send/receive",
                 p["tensor/context parallel"] - m * (v["t_tp"] + v["t_cp"] + v["t_ep"]),
                 "activations forward and gradients backward between stages, per micro-batch"),
        TimeItem(TimeCategory.DATA_PARALLEL, "exposed data-parallel / FSDP communication", p["data parallel"],
                 (f"ZeRO-3 gathers {_g(v['z3'])} s per micro-batch ({_g(v['z3x'])} s exposed), "
                  if v["z3x"] else "")
                 + f"gradient reduce {_g(v['red'])} s, hidden behind compute but for one layer's share and any excess"),
        TimeItem(TimeCategory.PIPELINE_BUBBLE, "pipeline bubble", p["pipeline bubble"],
                 f"{_g(v['bubble_mbs'])} micro-batch times idle ((pp-1)/virtual stages) x {_g(v['t_pipe'])} s"),
        TimeItem(TimeCategory.OPTIMIZER_STEP, "optimizer step (memory-bound)", p["optimizer step"],
                 f"{_g(v['tr_sh'])} trained parameters on this rank x bytes read and written / HBM"),
        TimeItem(TimeCategory.OFFLOAD, "offloaded optimizer (PCIe + host Adam)", p["offload"],
                 f"{_g(v['tr_sh'])} parameters: gradients down, weights up over PCIe, CPU Adam at 1e9/s"
                 + (f"; offloaded weights fetched {k.gathers} x per micro-batch at {_g(k.fetch_bytes)} B per "
                    "parameter" if v["offload_params"] else "")),
    ]  # fmt: skip
    return tuple(out)
