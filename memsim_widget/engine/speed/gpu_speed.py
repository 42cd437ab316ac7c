"""Speeds of each card: peak FLOP/s, HBM bandwidth, links (read from the card's record, catalog/gpus.json), and
the matmul efficiency fitted per generation.

Peaks and bandwidths are vendor datasheet figures (dense, no sparsity; per direction for links), one record
per card with its source (docs/gpus.md). The one fitted number per GPU generation is ``MATMUL_EFFICIENCY``:
the share of peak that the model's matmul and attention FLOPs reach on a saturated GPU, fitted by
``memsim_widget.fidelity_speed.fit_constants`` on the rows named in ``FIT_ROWS`` of
data/throughput/published.csv (benchmarks/fidelity_speed.py reports the rest).
"""

from __future__ import annotations

from memsim_widget.catalog.gpus import DEFAULT_NVLINK_DOMAIN, GPU, GPUS, GPUSpeed

__all__ = ["GPUSpeed", "GPU_SPEEDS", "DEFAULT_SPEED", "SPEED_ASSUMED_FROM", "gpu_speed", "speed_known"]

#: GPUs of one DGX/HGX node (the planner keeps tensor parallelism inside one); the step time reads each card's
#: own NVLink domain (``GPUSpeed.nvlink_domain``: 72 on a GB200 NVL72).
GPUS_PER_NODE = DEFAULT_NVLINK_DOMAIN

#: Each catalog card's datasheet speeds (its record's ``speed``), for the cards whose speeds are known.
GPU_SPEEDS: dict[str, GPUSpeed] = {gid: g.speed for gid, g in GPUS.items() if g.speed is not None}
#: The card whose speeds stand in for a card whose speeds are unknown (custom sizes, cards registered without
#: them); ``engine/caveats.time_caveats`` says so beside the step time.
SPEED_ASSUMED_FROM = "h100-sxm-80gb"
DEFAULT_SPEED = GPU_SPEEDS[SPEED_ASSUMED_FROM]

#: Fitted share of peak FLOP/s the matmuls reach per generation (``fidelity_speed.fit_constants``, rows in
#: ``FIT_ROWS``). Generations without published rows borrow the nearest fitted one (``EFFICIENCY_BORROWED``).
MATMUL_EFFICIENCY: dict[str, float] = {
    "ampere": 0.73,
    "hopper": 0.644,
}
#: Published rows (data/throughput/published.csv ``row_id``) each generation's efficiency is fitted on.
FIT_ROWS: dict[str, tuple[str, ...]] = {
    "ampere": ("tp0290", "tp0301", "tp0323"),
    "hopper": ("tp0143", "tp0140"),
}
#: Generations with no published row: the fitted generation each borrows (stated, not fitted).
EFFICIENCY_BORROWED: dict[str, str] = {
    "volta": "ampere",
    "turing": "ampere",
    "ada": "ampere",
    "blackwell": "hopper",
    "cdna2": "ampere",
    "cdna3": "hopper",
    "cdna4": "hopper",
    "custom": "hopper",
}


def speed_known(gpu: GPU) -> bool:
    """Whether the card's record gives its speeds (else an H100 SXM's are used, labelled)."""
    return gpu.speed is not None


def gpu_speed(gpu: GPU) -> GPUSpeed:
    """The card's datasheet speeds, from its record; an H100 SXM's (``DEFAULT_SPEED``) when they are unknown,
    which ``time_caveats`` states beside every figure made from them."""
    return gpu.speed if gpu.speed is not None else DEFAULT_SPEED


def matmul_efficiency(generation: str) -> float:
    """The fitted matmul efficiency of a generation (or of the one it borrows from)."""
    if generation in MATMUL_EFFICIENCY:
        return MATMUL_EFFICIENCY[generation]
    return MATMUL_EFFICIENCY[EFFICIENCY_BORROWED.get(generation, "hopper")]
