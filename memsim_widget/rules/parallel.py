"""Rules on the parallel layout alone (``parallel.*``), checked when a ``ParallelConfig`` is built."""

from __future__ import annotations

from memsim_widget.rules.rule import Rule, inert

PIPELINE_ONLY = "pipeline settings need pp > 1"

RULES: tuple[Rule, ...] = (
    Rule(
        "sequence parallel needs tp > 1",
        "parallel.sequence_parallel",
        "parallel",
        broken=lambda v: v["parallel.sequence_parallel"] & (v["parallel.tp"] == 1),
        message="needs tp > 1",
        reset=lambda v: False,
        disabled=lambda v: v["parallel.tp"] == 1,
    ),
    Rule(
        "ep divides dp x cp x tp",
        "parallel.ep",
        "parallel",
        broken=lambda v: (
            (v["parallel.ep"] > 1)
            & ((v["parallel.dp"] * v["parallel.cp"] * v["parallel.tp"]) % v["parallel.ep"] != 0)
        ),
        message=lambda v: (
            f"must divide dp*cp*tp = {v['parallel.dp'] * v['parallel.cp'] * v['parallel.tp']} (experts "
            f"spread over dp x cp, and over the TP group beyond it), got {v['parallel.ep']}"
        ),
    ),
    # before the virtual-stage rules: the widget resets the schedule first, then the stages follow it
    inert(
        "pp schedule needs pp > 1",
        "parallel.pp_schedule",
        lambda v: v["parallel.pp"] == 1,
        PIPELINE_ONLY,
        "1f1b",
        resets=True,
    ),  # fmt: skip
    inert(
        "pp micro-batches need pp > 1",
        "parallel.pp_microbatches",
        lambda v: v["parallel.pp"] == 1,
        PIPELINE_ONLY,
    ),
    inert(
        "virtual stages need pp > 1",
        "parallel.virtual_stages",
        lambda v: v["parallel.pp"] == 1,
        PIPELINE_ONLY,
    ),
    Rule(
        "interleaved schedule needs virtual stages",
        "parallel.virtual_stages",
        "parallel",
        broken=lambda v: (v["parallel.pp_schedule"] == "interleaved") & (v["parallel.virtual_stages"] < 2),
        message="the interleaved schedule needs virtual_stages >= 2",
        reset=lambda v: 2,
    ),
    Rule(
        "virtual stages need the interleaved schedule",
        "parallel.virtual_stages",
        "parallel",
        broken=lambda v: (v["parallel.virtual_stages"] > 1) & (v["parallel.pp_schedule"] != "interleaved"),
        message="virtual_stages > 1 needs pp_schedule 'interleaved'",
        reset=lambda v: 1,
        disabled=lambda v: v["parallel.pp_schedule"] != "interleaved",
    ),
    Rule(
        "offload needs ZeRO",
        "parallel.offload",
        "parallel",
        broken=lambda v: (v["parallel.offload"] != "none") & (v["parallel.zero"] == 0),
        message="offload needs ZeRO stage >= 1 (DeepSpeed ZeRO-Offload / FSDP)",
        reset=lambda v: "none",
        disabled=lambda v: v["parallel.zero"] == 0,
    ),
    Rule(
        "parameter offload needs ZeRO-3",
        "parallel.offload",
        "parallel",
        broken=lambda v: (v["parallel.offload"] == "optimizer+params") & (v["parallel.zero"] != 3),
        message="offloading parameters needs zero 3",
        reset=lambda v: "optimizer",
        refused=lambda v: [] if v["parallel.zero"] == 3 else ["optimizer+params"],
    ),
    inert(
        "reshard after forward is FSDP's",
        "parallel.reshard_after_forward",
        lambda v: (v["parallel.zero"] != 3) | (v["parallel.dp"] * v["parallel.cp"] == 1),
        "resharding after forward is FSDP's (ZeRO-3 with dp > 1)",
    ),
)
