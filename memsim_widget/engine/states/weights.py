"""Weights on one rank: plain (in the recipe's weight dtype), NF4 under QLoRA (Dettmers et al. 2023, arXiv
2305.14314: 0.5 B/param plus block absmax), and the quantised weight copies an fp8 recipe keeps (``memsim_widget/fp8.py``)."""

from __future__ import annotations

import math
from collections import defaultdict

from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import megatron_fp8_params, quantises_module
from memsim_widget.engine.items import Item
from memsim_widget.engine.states.budget import LocalGroup, StateBudget, shard_note, shard_why
from memsim_widget.fp8 import SCALED_TENSORS_PER_GEMM
from memsim_widget.units import fmt_int

#: NF4 storage per element with double quantisation: 4 bits + int8 absmax per 64 + fp32 per 256 absmaxes.
NF4_BLOCK = 64
NF4_DQ_BLOCK = 256


def nf4_bytes(numel: int) -> int:
    """Bytes of one NF4-quantised weight with double-quantised absmax (bitsandbytes Params4bit)."""
    blocks = math.ceil(numel / NF4_BLOCK)
    return math.ceil(numel / 2) + blocks + 4 * math.ceil(blocks / NF4_DQ_BLOCK) + 4


#: Parameter kinds QLoRA keeps in the weight dtype: bitsandbytes replaces Linear layers only, and transformers
#: skips the output head (``llm_int8_skip_modules`` defaults to it).
UNQUANTISED_KINDS = ("embedding", "head", "norm", "position")


def stored_in_nf4(ctx: Context, kind: str, module: str | None, shape: tuple[int, ...]) -> bool:
    """Whether QLoRA stores a parameter in NF4: a 2-D weight of a Linear the framework quantises."""
    return (
        ctx.scenario.method == "qlora"
        and kind not in UNQUANTISED_KINDS
        and quantises_module(ctx, module)
        and len(shape) >= 2
    )


def fetched_bytes_per_parameter(ctx: Context) -> float:
    """Bytes per base parameter a rank moves when it fetches the whole model's weights (parameter offload's
    host-to-device copies, ZeRO-3's all-gathers): the NF4 storage with its absmax (``nf4_bytes``) where QLoRA
    quantises, the 16-bit compute copy elsewhere. QLoRA's packed NF4 bytes are what FSDP shards, gathers and
    offloads (Answer.AI, "Enabling 70B Finetuning on Consumer GPUs", 2024,
    https://www.answer.ai/posts/2024-03-14-fsdp-qlora-deep-dive.html: quantised weights stored in a float
    dtype so that FSDP moves their bytes unchanged). Under ``fp8_all_gather`` FSDP2 gathers the layers' Linear
    weights in fp8, 1 B each (torchao ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``; the scale
    travels by an all-reduce of one amax per weight, not counted)."""
    arch, plain = ctx.arch, ctx.recipe.act_bytes
    fp8 = bool(ctx.scenario.fp8_all_gather) and ctx.par.zero >= 3

    def gathered(g) -> float:  # noqa: ANN001
        if stored_in_nf4(ctx, g.kind, g.module, g.shape):
            return nf4_bytes(g.numel_each) * g.count
        if fp8 and g.scope == "layer" and g.module and g.kind != "embedding":
            return g.numel * 1.0
        return g.numel * plain

    total = sum(gathered(g) for g in arch.params)
    return total / max(arch.parameters, 1)


def _placement(ctx: Context) -> tuple[int, str, str, str]:
    """How the weights sit on this rank: the ZeRO-3 shard divisor (over dp x cp, or dp_shard x cp) and its note, the level (host
    when parameters are offloaded) and the tensor-parallel note."""
    par = ctx.par
    w_div = (
        par.shard_degree if par.zero >= 3 else 1
    )  # ZeRO/FSDP shard over the data- (and context-) parallel group, or dp_shard x cp
    w_note = shard_note(w_div, shard_why(par, "ZeRO-3"))
    weight_level = "host" if par.offload == "optimizer+params" else "tensor"
    tp_note = f" (tp={par.tp} split)" if par.tp > 1 else ""
    return w_div, w_note, weight_level, tp_note


def _plain_weights(ctx: Context, kind: str, n: int, tensors: int) -> Item:
    """Unquantised weights of one kind on this rank."""
    recipe = ctx.recipe
    w_div, w_note, weight_level, tp_note = _placement(ctx)
    return Item(
        "parameters",
        f"{kind} weights",
        n * recipe.weight_bytes // w_div,
        f"{fmt_int(n)} params x {recipe.weight_bytes} B{tp_note}{w_note}",
        weight_level,
        tensors,
    )


def weights(ctx: Context, groups: list[LocalGroup], b: StateBudget) -> None:
    """The weights of ``groups`` by kind (NF4 where QLoRA quantises them), then the fp8 recipe's weight cache."""
    sc = ctx.scenario
    w_div, w_note, weight_level, tp_note = _placement(ctx)
    quantised = sc.method == "qlora"
    by_kind: dict[str, list[LocalGroup]] = defaultdict(list)
    for g in groups:
        by_kind[g.group.kind].append(g)
    for kind, gs in by_kind.items():
        n = sum(g.numel for g in gs)
        tensors = sum(g.count for g in gs)
        if quantised and kind not in UNQUANTISED_KINDS and any(g.group.module for g in gs):
            q = [g for g in gs if stored_in_nf4(ctx, kind, g.group.module, g.shape)]
            rest = [g for g in gs if g not in q]
            qbytes = sum(nf4_bytes(g.numel_each) * g.count for g in q)
            nq = sum(g.numel for g in q)
            b.persistent.append(
                Item(
                    "parameters",
                    f"{kind} weights (NF4)",
                    qbytes // w_div,
                    f"{fmt_int(nq)} x (0.5 B + 1 B/64 absmax + 4 B/16384){tp_note}{w_note}",
                    weight_level,
                    sum(g.count for g in q) * 2,
                )
            )
            if not q:  # nothing of this kind is quantised (torchtune: only LoRA-wrapped Linears)
                b.persistent.append(_plain_weights(ctx, kind, n, tensors))
                continue
            if rest:
                b.persistent.append(
                    _plain_weights(ctx, kind, sum(g.numel for g in rest), sum(g.count for g in rest))
                )
            continue
        b.persistent.append(_plain_weights(ctx, kind, n, tensors))

    fp8 = sc.fp8
    if fp8 is not None and fp8.scaling_rows:
        gemms = sum(g.count for g in groups if g.group.module and g.group.kind not in ("embedding", "head"))
        b.persistent.append(
            Item(
                "parameters",
                "fp8 scaling state (amax history, scales)",
                gemms * SCALED_TENSORS_PER_GEMM * fp8.scaling_rows * 4,
                f"{fmt_int(gemms)} Linear GEMMs x {SCALED_TENSORS_PER_GEMM} tensors x {fp8.scaling_rows} fp32"
                " (TransformerEngine, untraced; fused QKV / gate-up count once there, so at most 7/4 over)",
                "tensor",
                gemms * 2,
            )
        )
    if fp8 is not None and fp8.weight_cache_bytes and not megatron_fp8_params(ctx):
        nl = sum(g.numel for g in groups if g.group.module and g.group.kind not in ("embedding", "head"))
        b.persistent.append(
            Item(
                "parameters",
                "fp8 weight and transpose cache" if fp8.matmul_dtype == "fp8" else "fp4 weight cache",
                math.ceil(nl * fp8.weight_cache_bytes),
                f"{fmt_int(nl)} Linear weights {fp8.weight_cache_formula} (TransformerEngine, untraced)",
                "tensor",
                2,
            )
        )
