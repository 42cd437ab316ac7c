"""A throughput proxy to rank candidate layouts: modelled tokens per second per GPU.

It is a ranking aid, not a speed prediction: it only has to order layouts of one job sensibly. A step
of one data-parallel replica takes

    (compute x recomputation / micro-batch efficiency + tensor- and context-parallel communication)
      / (1 - pipeline bubble) + exposed data-parallel communication + optimizer offload

with these facts (each a stated assumption, nothing fitted):

* compute: 6 x active parameters FLOPs per token for full training (Kaplan et al. 2020, arXiv 2001.08361)
  plus causal attention 6 x layers x s x heads x head_dim per token; LoRA/QLoRA skip the weight
  gradients, 4 x instead of 6 x (Hu et al. 2021 report ~25% higher throughput);
* recomputation: full checkpointing reruns the forward, +2 of the 6 (one third more compute, Chen et al.
  2016); selective recomputes attention only (Korthikanti et al. 2022, arXiv 2205.05198: 2-4%); torchtitan's
  selective-op saves every other matmul and the attention, so about half the forward matmuls rerun (+1 of the 6);
  the chunked loss recomputes the head in backward (+2 x hidden x vocab per token);
* micro-batch efficiency: a matmul with T tokens per rank reaches ``MFU x T / (T + MB_HALF_TOKENS)`` of peak;
* pipeline bubble: (pp - 1) / (m + pp - 1) for m micro-batches (Narayanan et al. 2021, arXiv 2104.04473);
  interleaved divides the bubble by the virtual stages;
* tensor parallel: 4 all-reduces of T x hidden per layer and micro-batch (6 with full recomputation),
  ring traffic 2 (tp - 1) / tp (Shoeybi et al. 2019); context parallel: K and V passed around the ring,
  forward and backward, not hidden;
* data parallel: gradients all-reduced, 2 (d - 1) / d x bytes, ZeRO-3 adds the parameter all-gathers of
  forward and backward, 3 (d - 1) / d (Rajbhandari et al. 2020, arXiv 1910.02054); half of it is assumed
  hidden behind backward;
* optimizer offload: gradients down and weights up over PCIe, and a CPU Adam at ``CPU_ADAM_PARAMS_PER_S``;
* QLoRA's dequantisation and activation offloading's copies: ``QLORA_COMPUTE``, ``ACTIVATION_OFFLOAD_COMPUTE``.

Links: intra-node (NVLink) when the group fits in one node, else the per-GPU network; figures are vendor
datasheet numbers in ``GPU_SPECS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from memsim_widget.architecture import Architecture
from memsim_widget.catalog.gpus import GPU
from memsim_widget.plan.space import GPUS_PER_NODE
from memsim_widget.scenario import Scenario

#: Share of peak FLOPs a large matmul workload reaches in training (typical MFU of well-tuned runs).
MFU = 0.45
#: Tokens per rank at which a micro-batch reaches half of ``MFU`` (small matmuls underfill the GPU).
MB_HALF_TOKENS = 512
#: Per-GPU network bandwidth between nodes, bytes/s (one 400 Gb/s NIC per GPU).
INTER_NODE_BYTES_PER_S = 50e9
#: Host link for offloaded optimizer traffic, bytes/s (PCIe 4/5 x16, effective).
PCIE_BYTES_PER_S = 25e9
#: A CPU Adam step over this many parameters per second (ZeRO-Offload's vectorised CPU Adam, order of).
CPU_ADAM_PARAMS_PER_S = 1e9
#: Share of data-parallel communication hidden behind backward.
DP_OVERLAP = 0.5
#: QLoRA dequantises each NF4 weight to 16 bits for every matmul, forward and backward: about 30% more
#: step time than LoRA (Dettmers et al. 2023, arXiv 2305.14314, and common reports of 30-40%).
QLORA_COMPUTE = 1.3
#: Activation offloading: copies to and from pinned host memory overlap with compute, not entirely
#: (torchtune reports single-digit to ~15% slowdowns).
ACTIVATION_OFFLOAD_COMPUTE = 1.1


@dataclass(frozen=True)
class GPUSpec:
    """Dense 16-bit tensor TFLOP/s and the intra-node link (GB/s per direction) of one card."""

    tflops: float
    link_gb_s: float


#: Vendor datasheet figures (dense, no sparsity); PCIe-only cards use their host link.
GPU_SPECS: dict[str, GPUSpec] = {
    "v100-16gb": GPUSpec(125, 150),
    "v100-32gb": GPUSpec(125, 150),
    "t4": GPUSpec(65, 16),
    "a10": GPUSpec(125, 32),
    "l4": GPUSpec(121, 32),
    "l40s": GPUSpec(362, 32),
    "a100-40gb": GPUSpec(312, 300),
    "a100-80gb": GPUSpec(312, 300),
    "h100-pcie-80gb": GPUSpec(756, 64),
    "h100-sxm-80gb": GPUSpec(989, 450),
    "h200": GPUSpec(989, 450),
    "b200": GPUSpec(2250, 900),
    "rtx-3090": GPUSpec(71, 32),
    "rtx-4090": GPUSpec(165, 32),
    "rtx-5090": GPUSpec(209, 64),
    "rtx-a6000": GPUSpec(155, 32),
    "mi250x": GPUSpec(383, 200),
    "mi300x": GPUSpec(1307, 448),
}
#: A card not in the table (custom sizes): an H100-class part.
DEFAULT_SPEC = GPUSpec(989, 450)


def active_parameters(arch: Architecture) -> int:
    """Parameters one token passes through (MoE: the routed experts only)."""
    total = arch.parameters
    if not arch.is_moe:
        return total
    experts = sum(g.numel for g in arch.params if g.expert)
    return total - experts + experts * arch.experts_per_token // max(arch.num_experts, 1)


def throughput(
    base: Scenario, arch: Architecture, gpu: GPU, trainable: int, c: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Modelled tokens/s per GPU and its parts for each candidate (columns as in ``plan.vector``);
    ``trainable`` is the number of trained parameters (all, or the LoRA adapters)."""
    spec = GPU_SPECS.get(gpu.id, DEFAULT_SPEC)
    s = float(arch.fixed_seq_len or base.seq_len)
    dp, tp, pp, cp = (c[k].astype(np.float64) for k in ("dp", "tp", "pp", "cp"))
    b = c["micro_batch"].astype(np.float64)
    accum = np.maximum(c["grad_accum"], c["pp_microbatches"]).astype(np.float64)
    n_gpus = dp * tp * pp * cp
    L, h, V = arch.num_layers, arch.hidden_size, arch.vocab_size
    hq = arch.num_heads * arch.head_dim
    hkv = arch.num_kv_heads * arch.head_dim
    full = base.method == "full"
    passes = 6.0 if full else 4.0
    flops_token = passes * active_parameters(arch) + passes * L * s * hq / 2
    ckpt = c["checkpointing"]
    recompute = np.ones_like(b)
    recompute += np.where(ckpt == 2, 2.0 / passes, 0.0)
    recompute += np.where(ckpt == 3, 1.0 / passes, 0.0)  # selective-op: half the matmuls, no attention core
    recompute += np.where(ckpt == 1, (2.0 * L * s * hq / 2) / flops_token, 0.0)
    recompute += np.where(c["loss"] == 1, 2.0 * h * V / flops_token, 0.0)
    tokens_mb = b * s  # tokens of one micro-batch of one replica
    t_local = tokens_mb / cp
    eff = MFU * t_local / (t_local + MB_HALF_TOKENS)
    peak = spec.tflops * 1e12
    compute = accum * tokens_mb * flops_token / (tp * pp * cp) / (peak * eff) * recompute
    if base.method == "qlora":
        compute = compute * QLORA_COMPUTE
    if base.activation_offloading:
        compute = compute * ACTIVATION_OFFLOAD_COMPUTE

    intra = spec.link_gb_s * 1e9
    e = 2.0  # bytes of a 16-bit activation
    # tensor parallel: per layer on this stage, per micro-batch
    tp_calls = np.where(ckpt == 2, 6.0, 4.0)
    tp_vol = tp_calls * (L / pp) * (t_local * h * e) * 2 * (tp - 1) / tp * accum
    t_tp = tp_vol / np.where(tp <= GPUS_PER_NODE, intra, INTER_NODE_BYTES_PER_S)
    cp_vol = 3 * (L / pp) * 2 * (t_local * hkv / tp * e) * (cp - 1) * accum
    t_cp = cp_vol / np.where(tp * cp <= GPUS_PER_NODE, intra, INTER_NODE_BYTES_PER_S)
    bubble = np.where(pp > 1, (pp - 1) / (accum + pp - 1), 0.0)
    if base.parallel.pp_schedule == "interleaved":
        bubble = np.where(pp > 1, (pp - 1) / (base.parallel.virtual_stages * accum + pp - 1), 0.0)
    # data parallel: the replica group is dp x cp; its ring crosses nodes once the job spans several
    d = dp * cp
    p_local = arch.parameters / (tp * pp)
    trainable_local = trainable / (tp * pp)
    grad_bytes = 2.0
    dp_vol = np.where(d > 1, 2 * (d - 1) / d * trainable_local * grad_bytes, 0.0)
    dp_vol += np.where((c["zero"] == 3) & (d > 1), 2 * (d - 1) / d * p_local * 2.0, 0.0)
    t_dp = dp_vol / np.where(n_gpus <= GPUS_PER_NODE, intra, INTER_NODE_BYTES_PER_S) * (1 - DP_OVERLAP)
    shard = np.where(c["zero"] >= 1, d, 1.0)
    off = c["offload"] >= 1
    t_off = np.where(
        off,
        2 * trainable_local / shard * 2.0 / PCIE_BYTES_PER_S
        + trainable_local / shard / CPU_ADAM_PARAMS_PER_S,
        0.0,
    )
    step = (compute + t_tp + t_cp) / (1 - bubble) + t_dp + t_off
    tokens_per_gpu_s = accum * tokens_mb / (tp * pp * cp) / step
    return {
        "tokens_per_gpu_s": tokens_per_gpu_s,
        "step_time_s": step,
        "compute_s": compute,
        "communication_s": t_tp + t_cp + t_dp,
        "offload_s": t_off,
        "bubble": bubble,
        "recompute": recompute - 1.0,
    }
