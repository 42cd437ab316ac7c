"""Speeds of each card: peak FLOP/s, HBM bandwidth, links, and the matmul efficiency fitted per generation.

Peaks and bandwidths are vendor datasheet figures (dense, no sparsity; per direction for links). The one
fitted number per GPU generation is ``MATMUL_EFFICIENCY``: the share of peak that the model's matmul and
attention FLOPs reach on a saturated GPU, fitted by ``memsim_widget.fidelity_speed.fit_constants`` on the
rows named in ``FIT_ROWS`` of data/throughput/published.csv (benchmarks/fidelity_speed.py reports the rest).
"""

from __future__ import annotations

from dataclasses import dataclass

from memsim_widget.catalog.gpus import GPU

#: GPUs one NVLink/xGMI domain holds (a DGX/HGX node); larger groups cross the network.
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class GPUSpeed:
    """Datasheet speeds of one card: dense 16-bit and fp32 tensor TFLOP/s, HBM GB/s, the intra-node link
    (NVLink/xGMI, or PCIe for cards without one), the per-GPU network between nodes and the host link, GB/s
    per direction."""

    tflops: float
    fp32_tflops: float
    hbm_gb_s: float
    link_gb_s: float
    net_gb_s: float
    pcie_gb_s: float


#: Datasheet figures. Network: one 400 Gb/s NIC per GPU on Hopper/Blackwell/MI300X HGX nodes (50 GB/s), one
#: 200 Gb/s on DGX A100 (25 GB/s); 100 GbE (12.5 GB/s) for workstation and PCIe cards. fp32 is the SIMT rate
#: (PyTorch keeps TF32 matmuls off by default, ``torch.backends.cuda.matmul.allow_tf32 = False``).
#: MI250X: one GCD (the catalog's card is one GCD), half the package's figures.
GPU_SPEEDS: dict[str, GPUSpeed] = {
    "v100-16gb": GPUSpeed(125, 15.7, 900, 150, 12.5, 16),
    "v100-32gb": GPUSpeed(125, 15.7, 900, 150, 12.5, 16),
    "t4": GPUSpeed(65, 8.1, 320, 16, 12.5, 16),
    "a10": GPUSpeed(125, 31.2, 600, 32, 12.5, 32),
    "l4": GPUSpeed(121, 30.3, 300, 32, 12.5, 32),
    "l40s": GPUSpeed(362, 91.6, 864, 32, 12.5, 32),
    "a100-40gb": GPUSpeed(312, 19.5, 1555, 300, 25, 32),
    "a100-80gb": GPUSpeed(312, 19.5, 2039, 300, 25, 32),
    "h100-pcie-80gb": GPUSpeed(756, 51, 2000, 64, 50, 64),
    "h100-sxm-80gb": GPUSpeed(989, 67, 3350, 450, 50, 64),
    "h200": GPUSpeed(989, 67, 4800, 450, 50, 64),
    "b200": GPUSpeed(2250, 75, 8000, 900, 50, 64),
    "rtx-3090": GPUSpeed(71, 35.6, 936, 32, 12.5, 32),
    "rtx-4090": GPUSpeed(165, 82.6, 1008, 32, 12.5, 32),
    "rtx-5090": GPUSpeed(209, 104.8, 1792, 64, 12.5, 64),
    "rtx-a6000": GPUSpeed(155, 38.7, 768, 32, 12.5, 32),
    "mi250x": GPUSpeed(191.5, 24, 1638, 100, 25, 32),
    "mi300x": GPUSpeed(1307, 163.4, 5300, 448, 50, 64),
}
#: A card not in the table (custom sizes): an H100 SXM.
DEFAULT_SPEED = GPU_SPEEDS["h100-sxm-80gb"]

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
    "custom": "hopper",
}


def gpu_speed(gpu: GPU) -> GPUSpeed:
    """The card's datasheet speeds (an H100 SXM's for cards not in ``GPU_SPEEDS``)."""
    return GPU_SPEEDS.get(gpu.id, DEFAULT_SPEED)


def matmul_efficiency(generation: str) -> float:
    """The fitted matmul efficiency of a generation (or of the one it borrows from)."""
    if generation in MATMUL_EFFICIENCY:
        return MATMUL_EFFICIENCY[generation]
    return MATMUL_EFFICIENCY[EFFICIENCY_BORROWED.get(generation, "hopper")]
