"""Which rank of which layout a multi-GPU trace runs: the mesh, the refusals, the default rank, the role in words.

Torch-free (``check_traceable`` runs it on every widget edit); the trace itself is ``distributed.py``.
"""

from __future__ import annotations

from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

from .fake_dist import mesh_coords

#: Mesh dimensions, outermost first (torchtitan's order: pp, data parallel, cp, tp; the last varies fastest).
MESH_ORDER = ("pp", "dp", "cp", "tp")


def layout_shape(sc: Scenario) -> dict[str, int]:
    """The job's mesh: every dimension of ``MESH_ORDER`` with its size (1 where unused)."""
    par = sc.parallel
    return {"pp": par.pp, "dp": par.dp, "cp": par.cp, "tp": par.tp}


def default_rank(sc: Scenario) -> int:
    """The first global rank of the pipeline stage the engine predicts highest (ranks within it are alike)."""
    from memsim_widget.engine.core import estimate

    stage = estimate(sc).worst.stage.index
    return stage * (sc.parallel.world_size // sc.parallel.pp)


def check_rank(sc: Scenario, rank: int) -> None:
    """Raise ScenarioError("rank") unless ``rank`` is a global rank of the job."""
    world = sc.parallel.world_size
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ScenarioError("rank", f"must be an integer in 0..{world - 1} for {world} GPUs, got {rank!r}")


def check_distributed(sc: Scenario) -> None:
    """Raise ScenarioError naming the field for a multi-GPU layout this process cannot trace."""
    par = sc.parallel
    if par.dp > 1 and par.zero in (1, 2):
        raise ScenarioError(
            "parallel.zero",
            f"ZeRO-{par.zero} is DeepSpeed semantics PyTorch cannot trace here; the estimate is formula-only "
            "(zero 3 traces FSDP2, zero 0 traces replicate)",
        )
    if par.offload != "none":
        raise ScenarioError(
            "parallel.offload",
            "not traced: FSDP2's CPUOffloadPolicy would keep host copies on the same cpu device as the fake "
            "GPU (the mesh is a CPU mesh), so the tracker cannot tell offloaded from resident bytes; set none",
        )
    if par.ep > 1:
        raise ScenarioError(
            "parallel.ep",
            "expert parallelism is not traced: PyTorch has no expert-parallel API for transformers' MoE "
            "layers (torchtitan's is its own code); set ep to 1",
        )
    if par.cp > 1:
        raise ScenarioError("parallel.cp", CP_REFUSAL)
    if par.zero == 3 and par.dp_replicate > 1 and (par.shard_degree == 1 or par.pp > 1):
        raise ScenarioError(
            "parallel.dp_shard",
            "HSDP is traced with a shard group of 2 or more ranks and no pipeline (dp_shard 1 or pp > 1: not "
            "traced); leave dp_shard unset or raise it",
        )
    if par.tp > 1 and not _has_tp_plan():
        raise ScenarioError("parallel.tp", "tensor-parallel tracing is not available (no trace/tp_plan.py)")


#: Why context parallelism is refused (measured with torch 2.13.0+cpu; docs/fidelity.md says the same).
CP_REFUSAL = (
    "context parallelism is not traced: torch.distributed.tensor.experimental.context_parallel shards only "
    "CUDA's flash/efficient/cuDNN SDPA ops; on a CPU mesh SDPA runs "
    "aten._scaled_dot_product_flash_attention_for_cpu, which fails with 'does not have a sharding strategy "
    "registered'; set cp to 1"
)


def _has_tp_plan() -> bool:
    """Whether the TP plan module is present (imported lazily: it lands separately)."""
    import importlib.util

    return importlib.util.find_spec("memsim_widget.trace.tp_plan") is not None


def rank_role(sc: Scenario, rank: int) -> str:
    """The traced rank in words, e.g. 'rank 0 of 8: FSDP shard 0 of 8, pipeline stage 0 of 1 (...)'."""
    par, coords = sc.parallel, mesh_coords(rank, layout_shape(sc))
    parts = []
    if par.dp > 1:
        kind = "FSDP shard" if par.zero == 3 else "replica"
        hsdp = (
            f", HSDP: {par.dp_replicate} replicas of {par.dp_shard}"
            if par.zero == 3 and par.dp_replicate > 1
            else ""
        )
        parts.append(f"{kind} {coords['dp']} of {par.dp}" + (" (replicate)" if par.zero != 3 else hsdp))
    if par.cp > 1:
        parts.append(f"context-parallel rank {coords['cp']} of {par.cp}")
    if par.tp > 1:
        parts.append(f"tensor-parallel rank {coords['tp']} of {par.tp}")
    stage = coords["pp"]
    ends = ["embeddings" if stage == 0 else "", "head" if stage == par.pp - 1 else ""]
    span = (
        " .. ".join(e for e in ends if e) if par.pp == 1 else ", ".join(e for e in ends if e) or "layers only"
    )
    parts.append(f"pipeline stage {stage} of {par.pp} ({span})")
    return f"rank {rank} of {par.world_size}: " + ", ".join(parts)
