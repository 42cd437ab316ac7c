"""What one simulated rank holds, in words: its pipeline stage's layers and ends, and how tensor, data and
context parallelism split its share (the widget's per-rank bars and ``memsim estimate --json`` show it)."""

from __future__ import annotations

from memsim_widget.engine.context import Stage
from memsim_widget.rules.pipeline_split import chunk_layers, rank_chunks, rank_layers
from memsim_widget.scenario import Scenario

#: What ZeRO stage z shards over the data-parallel group (DeepSpeed's stages; 3 is FSDP's full shard).
ZERO_SHARDS = {
    1: "optimizer states",
    2: "optimizer states and gradients",
    3: "parameters, gradients and optimizer states",
}


def stage_span(scenario: Scenario, stage: Stage, num_layers: int) -> str:
    """The layers a stage holds, and its ends: 'layers 0-15, embeddings', 'all 32 layers, embeddings, head',
    or (an end stage of no layer) 'no layers, head and loss'."""
    par = scenario.parallel
    if stage.num_stages == 1:
        layers = f"all {num_layers} layers"
    elif par.pp_schedule == "interleaved" and par.virtual_stages > 1:
        mine = rank_chunks(chunk_layers(num_layers, par.pp, par.virtual_stages, par.pp_split, par.pp_layers),
                           par.pp, stage.index)  # fmt: skip
        sizes = "" if len(set(mine)) == 1 else f" of {'+'.join(map(str, mine))}"
        layers = f"{stage.layers} layers in {par.virtual_stages} chunks{sizes} (interleaved)"
    else:
        split = rank_layers(chunk_layers(num_layers, par.pp, 1, par.pp_split, par.pp_layers), par.pp)
        start = sum(split[: stage.index])
        layers = f"layers {start}-{start + stage.layers - 1}" if stage.layers else "no layers"
    ends = [e for e, on in (("embeddings", stage.first), ("head and loss", stage.last)) if on]
    return ", ".join([layers, *ends])


def split_words(scenario: Scenario) -> list[str]:
    """How the layout divides what each rank of a stage holds, one phrase per parallel dimension."""
    par = scenario.parallel
    words = []
    if par.tp > 1:
        sp = (
            f" and 1/{par.tp} of the sequence outside them (sequence parallel)"
            if par.sequence_parallel
            else ""
        )
        words.append(f"1/{par.tp} of each layer's matrices (tensor parallel){sp}")
    if par.cp > 1:
        words.append(f"1/{par.cp} of the sequence (context parallel)")
    if par.ep > 1:
        folded = (
            f", folded over the TP group: experts split {par.expert_tp} ways"
            if par.expert_tp < par.tp
            else ""
        )
        words.append(f"1/{par.ep} of the experts (expert parallel{folded})")
    group = par.dp * par.cp
    if group > 1:
        shard = ZERO_SHARDS.get(par.zero)
        hybrid = par.dp_replicate > 1
        over = (
            f"dp_shard x cp = {par.shard_degree}, {par.dp_replicate} replicas"
            if hybrid
            else f"dp x cp = {group}"
        )
        words.append(
            f"1/{par.shard_degree} of the {shard} (ZeRO-{par.zero} over {over})"
            if shard
            else f"a full replica of the states (data parallel, dp={par.dp})"
        )
    return words


def rank_role(scenario: Scenario, stage: Stage, num_layers: int) -> str:
    """One rank in words: 'stage 1 of 4 (layers 8-15); 1/8 of each layer's matrices (tensor parallel)'."""
    world = scenario.parallel.world_size
    head = (
        f"pipeline stage {stage.index} of {stage.num_stages}"
        if stage.num_stages > 1
        else f"each of {world} GPUs"
    )
    if world == 1:
        head = "the only GPU"
    text = f"{head} ({stage_span(scenario, stage, num_layers)})"
    words = split_words(scenario)
    return f"{text}; {'; '.join(words)}" if words else text
