"""The time of one training step, and where it goes: one formula for ``estimate`` and the planner.

A step of one data-parallel replica on the slowest pipeline stage (the last: it holds the head and loss)::

    step = t_mb x (m + bubble) + pipeline p2p + exposed data-parallel + optimizer step + offload

``m`` micro-batches (accumulation x pipeline micro-batches), each taking ``t_mb`` = matmuls forward, backward
and recomputed at ``peak x efficiency`` plus their GEMM bytes at HBM speed + memory-bound ops at HBM
bandwidth + tensor/context/expert-parallel collectives + ZeRO-3's gathers not hidden behind compute. Each
constant below says where its number comes from; ``MATMUL_EFFICIENCY`` (engine/speed/gpu_speed.py, one per GPU
generation) and ``ATTENTION_EFFICIENCY`` are the only fitted ones (docs/speed.md: on which rows). The
breakdown with every formula's numbers filled in is ``engine/speed/time_breakdown.py``. ``step_parts`` is written
once over scalars or numpy arrays (``ops``): the engine calls it with Python numbers, ``plan/timing.py`` with
one array per candidate column, so both give the same floats for the same candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from memsim_widget.catalog.gpus import GPU
from memsim_widget.engine.speed.flops import ModelFlops, model_flops
from memsim_widget.engine.speed.gpu_speed import GPUSpeed, gpu_speed, matmul_efficiency
from memsim_widget.fast_dataclass import dataclass
from memsim_widget.names import Name
from memsim_widget.optimizers import OptimizerSpec
from memsim_widget.precision import PrecisionRecipe
from memsim_widget.scenario import Scenario

#: Share of datasheet HBM bandwidth that streaming elementwise kernels reach (STREAM-like copies on A100 and
#: H100 reach 80-90%; stated).
HBM_EFFICIENCY = 0.8
#: Bus bandwidth NCCL reaches, as a share of the link's datasheet rate (nccl-tests all-reduce busbw: about
#: 230 of 300 GB/s NVLink on DGX A100, 90%+ of line rate on InfiniBand/RoCE; stated).
NVLINK_EFFICIENCY = 0.75
NETWORK_EFFICIENCY = 0.9
#: Share of the PCIe rate pinned-memory copies reach (stated).
PCIE_EFFICIENCY = 0.8
#: Attention kernels reach this share of the matmuls' efficiency (fitted with Ampere's ``MATMUL_EFFICIENCY`` on
#: the long-sequence row ``fidelity_speed.ATTENTION_FIT_ROWS``; FlashAttention-2 reports 50-73% of A100 peak forward,
#: less backward, against 80%+ for large GEMMs, Dao 2023).
ATTENTION_EFFICIENCY = 0.46
#: FlashAttention's backward runs 5 matmuls for the forward's 2 (it recomputes the scores; Dao 2023,
#: arXiv 2307.08691, Algorithm 2); eager attention's backward runs 4.
ATTENTION_BACKWARD = {"sdpa": 2.5, "eager": 2.0}
#: Bytes moved per logit by a cross-entropy that upcasts (HF ``loss_function``): write the 16-bit logits
#: (2), upcast (2 + 4), log-softmax (4 + 4), its backward (4 + 4), downcast the gradient (4 + 2).
LOSS_BYTES_PER_LOGIT = 30.0
#: QLoRA dequantises each NF4 weight to 16 bits before each matmul that reads it: read 0.5 B, write 2 B
#: (Dettmers et al. 2023, arXiv 2305.14314; block absmax ignored).
DEQUANT_BYTES = 2.5
#: A host (CPU) AdamW step over this many parameters per second (ZeRO-Offload's vectorised CPU-Adam, Ren et al.
#: 2021, arXiv 2101.06840: order of a billion per second per process; stated, not fitted).
CPU_ADAM_PARAMS_PER_S = 1e9
#: torch.compile fuses pointwise chains: the share of elementwise HBM traffic left (assumed).
COMPILE_ELEMENTWISE = 0.5
#: HBM bytes per element torchao's dynamic float8 scaling moves for each tensor it casts: read the 16-bit tensor for
#: its amax (2), read it again and write the fp8 copy (2 + 1) (torchao 0.18 ``float8/float8_scaling_utils.py``
#: ``hp_tensor_to_float8_dynamic``: ``tensor_to_amax`` then the scaled cast). Each Float8Linear casts its input and
#: weight in forward, its output gradient in backward and its input and weight again (``float8_linear.py``
#: saves them in high precision); compile fuses part of it (``COMPILE_ELEMENTWISE``, as for the other elementwise
#: ops). TransformerEngine fuses its casts into the neighbouring norm / activation kernels: counted 0 (stated).
FP8_CAST_BYTES = 5.0
#: Elements torchao casts per token and layer, as a multiple of the Linears' summed (in + out) features: every
#: input twice (forward, and recast for the weight gradient) and every output gradient once, 2 in + out, taken
#: as 1.5 x (in + out) (Llama 3 8B: 2 in + out = 1.475 x (in + out)).
FP8_CAST_IO = 1.5

#: Frameworks whose performance settings overlap communication with compute: Megatron-LM's published
#: benchmarks run with ``--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap`` (Megatron-LM README,
#: "Performance Benchmarking"): tensor-parallel collectives hide behind the GEMMs they feed (Transformer Engine
#: userbuffers) and the distributed optimizer's parameter all-gather behind the next forward.
OVERLAPPING_FRAMEWORKS = ("megatron",)


class TimeCategory(Name):
    """Where the step's time goes, in the order of the breakdown frame and chart."""

    FORWARD = "forward"
    BACKWARD = "backward"
    RECOMPUTE = "recompute"
    MEMORY_BOUND = "memory-bound"
    TENSOR_CONTEXT_PARALLEL = "tensor/context parallel"
    DATA_PARALLEL = "data parallel"
    PIPELINE_BUBBLE = "pipeline bubble"
    OPTIMIZER_STEP = "optimizer step"
    OFFLOAD = "offload"


#: The step's categories, in the order of the breakdown frame and chart.
TIME_CATEGORIES = tuple(TimeCategory)
#: Checkpointing codes (as the planner's columns): none, selective, full, selective-op.
CKPT_CODES = {"none": 0, "selective": 1, "full": 2, "selective-op": 3}
LOSS_CODES = {"standard": 0, "chunked": 1}
OFFLOAD_CODES = {"none": 0, "optimizer": 1, "optimizer+params": 2}


@dataclass(frozen=True)
class Ops:
    """The three non-arithmetic operations ``step_parts`` needs, for scalars or arrays."""

    where: Callable[[Any, Any, Any], Any]
    maximum: Callable[[Any, Any], Any]


SCALAR_OPS = Ops(where=lambda c, a, b: a if c else b, maximum=max)


@dataclass(frozen=True)
class TimeModel:
    """What does not vary across the planner's candidates: model, GPU, precision, method and runtime keys."""

    flops: ModelFlops
    seq_len: int
    hidden: int
    intermediate: int
    q_width: int  # heads x d_qk
    kv_width: int  # kv heads x d_qk
    vocab: int
    layers: int
    gated: bool
    rope: bool
    dropout: bool
    eager: bool
    compile: bool
    moe_top_k: int
    adapter_per_layer: float  # 2 x adapter elements per layer (forward FLOPs per token)
    adapter_io_per_layer: float  # in + out features of the adapted Linears per layer
    trained_base: bool  # full training: the base weights get gradients
    qlora: bool
    parameters: int
    trainable: int
    act_bytes: int
    grad_bytes: int
    #: Bytes per base parameter when a rank fetches the weights (offload copies, ZeRO-3 gathers): the 16-bit
    #: copy, or QLoRA's NF4 storage with its absmax (``states.weights.fetched_bytes_per_parameter``).
    fetch_bytes: float
    autocast: bool
    peak_flops: float
    #: Peak FLOP/s of the Linear layers' matmuls: the fp8 (fp4) peak under an fp8 recipe (``fp8_linear_peak``),
    #: else ``peak_flops``; attention and the output layer stay at ``peak_flops``.
    linear_peak_flops: float
    #: HBM bytes per element of torchao's fp8 casts (``FP8_CAST_BYTES``; 0 without a torchao recipe).
    fp8_cast_bytes: float
    efficiency: float
    attention_efficiency: float
    speed: GPUSpeed
    attention_backward: float
    schedule_chunks: int  # virtual stages of the interleaved schedule (1 otherwise)
    gathers: int  # ZeRO-3 all-gathers per micro-batch (2 when resharded after forward)
    overlap: bool  # TP collectives and ZeRO-1/2 parameter gathers overlap compute (OVERLAPPING_FRAMEWORKS)
    checkpoint_every: int


def time_model(scenario: Scenario, arch: Any, recipe: PrecisionRecipe, gpu: GPU, trainable: int,
               adapter_elements: int, adapter_io: int, fetch_bytes: float | None = None) -> TimeModel:  # fmt: skip
    """The fixed part of the time model for ``scenario`` (``arch``: its Architecture; ``fetch_bytes``: bytes per
    parameter fetched, default the 16-bit copy)."""
    speed = gpu_speed(gpu)
    fl = model_flops(arch)
    fp32 = recipe.act_bytes == 4
    peak = (speed.fp32_tflops if fp32 else speed.tflops) * 1e12
    return TimeModel(
        flops=fl,
        seq_len=arch.fixed_seq_len or scenario.seq_len,
        hidden=arch.hidden_size,
        intermediate=arch.intermediate_size,
        q_width=arch.num_heads * fl.d_qk,
        kv_width=arch.num_kv_heads * fl.d_qk,
        vocab=arch.vocab_size if fl.head else 0,
        layers=arch.num_layers,
        gated=arch.mlp_activation in ("swiglu", "geglu"),
        rope=arch.position == "rope",
        dropout=arch.hidden_dropout > 0,
        eager=scenario.attention == "eager",
        compile=scenario.compile,
        moe_top_k=arch.experts_per_token if arch.is_moe else 0,
        adapter_per_layer=2.0 * adapter_elements / max(arch.num_layers, 1),
        adapter_io_per_layer=adapter_io / max(arch.num_layers, 1),
        trained_base=scenario.method == "full",
        qlora=scenario.method == "qlora",
        parameters=arch.parameters,
        trainable=trainable,
        act_bytes=recipe.act_bytes,
        grad_bytes=recipe.grad_bytes,
        fetch_bytes=float(recipe.act_bytes if fetch_bytes is None else fetch_bytes),
        autocast=recipe.autocast,
        peak_flops=peak,
        linear_peak_flops=fp8_linear_peak(scenario, speed, peak),
        fp8_cast_bytes=FP8_CAST_BYTES
        if scenario.fp8 is not None and scenario.fp8.framework == "torchao"
        else 0.0,
        efficiency=matmul_efficiency(gpu.generation),
        attention_efficiency=ATTENTION_EFFICIENCY,
        speed=speed,
        attention_backward=ATTENTION_BACKWARD[scenario.attention],
        schedule_chunks=scenario.parallel.virtual_stages
        if scenario.parallel.pp_schedule == "interleaved"
        else 1,
        gathers=2 if scenario.parallel.reshard_after_forward else 1,
        overlap=scenario.framework in OVERLAPPING_FRAMEWORKS,
        checkpoint_every=scenario.checkpoint_every or 1,
    )


def fp8_linear_peak(scenario: Scenario, speed: GPUSpeed, peak: float) -> float:
    """Peak FLOP/s of the Linear layers' matmuls: under an fp8 recipe (``memsim_widget/fp8.py``) the card's
    datasheet peak in the recipe's matmul dtype (fp8; fp4 for NVFP4), else ``peak``. Only the Linears run there:
    torchao's ``Float8Linear`` and TransformerEngine's ``te.Linear`` replace the transformer layers' Linear
    modules; attention (SDPA / FlashAttention) and the output layer run in bf16 (torchtitan's float8 converter
    filter; Megatron's fp8 scope). A card without that peak (no fp8 tensor cores) runs them at ``peak``."""
    fp8 = scenario.fp8
    if fp8 is None:
        return peak
    return dict(speed.peak_tflops).get(fp8.matmul_dtype, peak / 1e12) * 1e12


def method_flops_per_token(k: TimeModel) -> float:
    """The model FLOPs per token MFU counts: PaLM's ``6 N + 12 L H Q s`` for full training; for LoRA/QLoRA what
    the method computes, ``4 N`` (forward, and the input gradients backward: a frozen base gets no weight
    gradients) plus the adapters' forward and both backward matmuls (3 x their forward FLOPs), attention as
    PaLM counts it. So MFU stays below the matmul efficiency the time is computed at, as for full training."""
    full = k.flops.model_flops_per_token(k.seq_len)
    if k.trained_base:
        return full
    n = k.layers * k.flops.linear_per_layer / 2.0 + k.flops.head / 2.0
    return full - 2.0 * n + 3.0 * k.adapter_per_layer * k.layers


def optimizer_step_bytes(recipe: PrecisionRecipe, opt: OptimizerSpec) -> float:
    """HBM bytes an optimizer step moves per trained parameter: read and write the weight (or fp32 master)
    and each state, read the gradient, write the 16-bit weight after a master update."""
    if opt.states == 0 and opt.name == "none":
        return 0.0
    state = {"int8": 1.0, "int4": 0.5}.get(opt.state_dtype, float(recipe.state_bytes))
    master = recipe.master_bytes or recipe.weight_bytes
    extra = recipe.weight_bytes if recipe.master_bytes else 0
    return 2.0 * master + recipe.grad_bytes + 2.0 * opt.states * state + extra


@dataclass(frozen=True)
class _Rank:
    """One rank's share of a step: the layout, the checkpointing flags and the tokens and layers it runs
    (Python numbers, or one numpy column per candidate)."""

    dp: Any
    tp: Any
    pp: Any
    cp: Any
    ep: Any
    zero: Any
    off: Any
    ck1: Any  # selective checkpointing
    ck2: Any  # full
    ck3: Any  # selective-op
    world: Any
    d: Any  # the data-parallel (and context) shards: dp x cp
    lst: Any  # layers on the (last) stage
    t: Any  # tokens of one micro-batch on one rank
    m: Any  # micro-batches per step
    tl: Any  # token-layers of one micro-batch on this stage
    every: Any  # checkpoint every n-th layer
    p_loc: Any  # parameters on this rank before ZeRO
    tr_loc: Any  # trainable parameters on this rank before ZeRO


def _rank(k: TimeModel, c: Mapping[str, Any], ops: Ops) -> _Rank:
    """The layout ``c`` as one rank sees it."""
    w = ops.where
    dp, tp, pp, cp, ep = c["dp"], c["tp"], c["pp"], c["cp"], c["ep"]
    ck = c["checkpointing"]
    lst = k.layers / pp
    t = c["micro_batch"] * k.seq_len / cp
    return _Rank(
        dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=c["zero"], off=c["offload"],
        ck1=ck == 1, ck2=ck == 2, ck3=ck == 3,
        world=dp * tp * pp * cp, d=dp * cp, lst=lst, t=t,
        m=c["grad_accum"] * w(pp > 1, c["pp_microbatches"], 1),
        tl=t * lst, every=k.checkpoint_every,
        p_loc=k.parameters / (tp * pp), tr_loc=k.trainable / (tp * pp),
    )  # fmt: skip


def _matmul_seconds(k: TimeModel, c: Mapping[str, Any], r: _Rank, ops: Ops) -> dict[str, Any]:
    """Matmuls of one micro-batch on this rank: FLOPs at peak x efficiency, plus the bytes each GEMM reads and
    writes at HBM speed (activations in and out, the weights once per micro-batch: the roofline's memory side,
    which makes narrow layers and few tokens per rank slower per FLOP); forward, backward and recompute."""
    w = ops.where
    t, tl, tp, lst, every, ck1, ck2, ck3 = r.t, r.tl, r.tp, r.lst, r.every, r.ck1, r.ck2, r.ck3
    h = k.hidden
    lin = tl * k.flops.linear_per_layer / tp
    ada = tl * k.adapter_per_layer / tp if k.adapter_per_layer else 0.0
    att = tl * k.flops.attention_per_layer(k.seq_len) / tp
    head = t * k.flops.head / tp
    vocab = k.vocab / tp
    io = tl * (k.flops.io_per_layer * (1.0 + 1.0 / tp) / 2.0 + k.adapter_io_per_layer / tp)
    io = (io + lst * k.flops.linear_per_layer / 2.0 / tp + t * (h + vocab) + h * vocab) * k.act_bytes
    rate = k.peak_flops * k.efficiency
    rate_lin = k.linear_peak_flops * k.efficiency  # the layers' Linears (fp8 under an fp8 recipe)
    hbm = k.speed.hbm_gb_s * 1e9 * HBM_EFFICIENCY
    if (
        k.linear_peak_flops == k.peak_flops
    ):  # one rate for every matmul (the same floats as before fp8 recipes)
        t_lin = (lin + ada + head) / rate + io / hbm  # one forward pass of the Linear and head matmuls
        t_lin_b = (lin + head) * (2.0 if k.trained_base else 1.0) / rate + 2.0 * ada / rate
    else:
        t_lin = lin / rate_lin + (ada + head) / rate + io / hbm
        t_lin_b = (lin / rate_lin + head / rate) * (2.0 if k.trained_base else 1.0) + 2.0 * ada / rate
    t_att = att / (rate * k.attention_efficiency)
    t_lin_b = t_lin_b + io / hbm * (2.0 if k.trained_base else 1.0)
    t_fwd = t_lin + t_att
    t_bwd = t_lin_b + t_att * k.attention_backward
    t_rec = w(ck1, t_att, 0.0) + w(ck2, t_fwd / every, 0.0) + w(ck3, t_lin / 2.0, 0.0)
    t_rec = t_rec + w(c["loss"] == 1, head / rate, 0.0)
    return {"lin": lin, "ada": ada, "att": att, "head": head, "io": io, "rate": rate, "rate_lin": rate_lin, "hbm": hbm,
            "t_lin": t_lin, "t_att": t_att, "t_lin_b": t_lin_b, "t_fwd": t_fwd, "t_bwd": t_bwd,
            "t_rec": t_rec}  # fmt: skip


def _memory_bound_seconds(k: TimeModel, c: Mapping[str, Any], r: _Rank, hbm: Any, ops: Ops) -> dict[str, Any]:
    """Memory-bound ops at HBM bandwidth: elements per token and layer, forward, backward and recompute, the
    loss's logits, autocast's weight copies and QLoRA's dequantisation."""
    w = ops.where
    t, tl, tp, lst, every, ck2, ck3, zero, d = r.t, r.tl, r.tp, r.lst, r.every, r.ck2, r.ck3, r.zero, r.d
    h = k.hidden
    i = k.intermediate
    rep_f = 10.0 * h + (4.0 * h if k.dropout else 0.0)  # 2 norms (2h each) + 2 residual adds (3h each)
    rep_b = 12.0 * h + (4.0 * h if k.dropout else 0.0)  # 2 norm backwards (3h) + 2 gradient adds (3h)
    split_f = (3.0 if k.gated else 2.0) * i + (2.0 * (k.q_width + k.kv_width) if k.rope else 0.0)
    split_b = (5.0 if k.gated else 3.0) * i + (2.0 * (k.q_width + k.kv_width) if k.rope else 0.0)
    if k.eager:  # scores, softmax and probabilities materialised: heads x s per token
        split_f += 3.0 * k.flops.heads * k.seq_len
        split_b += 5.0 * k.flops.heads * k.seq_len
    if k.moe_top_k:  # token permutation to and from the experts
        split_f += 4.0 * k.moe_top_k * h
        split_b += 4.0 * k.moe_top_k * h
    fuse = (COMPILE_ELEMENTWISE if k.compile else 1.0) * k.act_bytes
    rep_div = w(c["sp"] == 1, tp, 1)
    el_f = tl * (rep_f / rep_div + split_f / tp) * fuse
    el_b = tl * (rep_b / rep_div + split_b / tp) * fuse
    el_r = el_f * (w(ck2, 1.0 / every, 0.0) + w(ck3, 0.5, 0.0))
    loss_b = t * k.vocab / tp * LOSS_BYTES_PER_LOGIT
    cast_b = (r.p_loc / w(zero == 3, d, 1) * 6.0) if k.autocast else 0.0  # fp32 -> 16-bit weight copies
    passes = 2.0 + w(ck2, 1.0 / every, 0.0) + w(ck3, 0.5, 0.0)
    deq_b = (lst * k.flops.linear_per_layer / 2.0 / tp * passes * DEQUANT_BYTES) if k.qlora else 0.0
    f8_b = 0.0
    if k.fp8_cast_bytes:  # torchao's float8 casts: activations and gradients per token, weights per pass
        f8 = k.fp8_cast_bytes * (COMPILE_ELEMENTWISE if k.compile else 1.0)
        # linear_per_layer is 2 x the weights: each weight cast twice (forward and backward) per micro-batch
        f8_b = (tl * FP8_CAST_IO * k.flops.io_per_layer / tp + lst * k.flops.linear_per_layer / tp) * f8
    t_mem = (el_f + el_b + el_r + loss_b + cast_b + deq_b + f8_b) / hbm
    return {"el": el_f + el_b + el_r, "loss_b": loss_b, "cast_b": cast_b, "deq_b": deq_b, "f8_b": f8_b,
            "t_mem": t_mem}  # fmt: skip


def _model_parallel_seconds(k: TimeModel, r: _Rank, mm: Mapping[str, Any], ops: Ops) -> dict[str, Any]:
    """Tensor, context and expert parallel collectives of one micro-batch (what overlap does not hide), and
    the link and network rates the later collectives use."""
    w, mx = ops.where, ops.maximum
    t, tl, tp, cp, ep, lst, every, ck2, ck3 = r.t, r.tl, r.tp, r.cp, r.ep, r.lst, r.every, r.ck2, r.ck3
    t_lin, t_lin_b, t_att = mm["t_lin"], mm["t_lin_b"], mm["t_att"]
    h = k.hidden
    sp = k.speed
    link = sp.link_gb_s * 1e9 * NVLINK_EFFICIENCY
    net = sp.net_gb_s * 1e9 * NETWORK_EFFICIENCY
    # GPUs one NVLink domain joins (the card's record: 8 in a node, 72 in a GB200 NVL72); more cross the network
    dom = sp.nvlink_domain
    n_tp = 4.0 + w(ck2, 2.0 / every, 0.0) + w(ck3, 1.0, 0.0)
    t_tp = n_tp * lst * 2.0 * (tp - 1) / tp * (t * h * k.act_bytes) / w(tp <= dom, link, net)
    if k.overlap:  # hidden behind the Linear GEMMs of forward, backward and recompute, but for any excess
        t_tp = mx(t_tp - (t_lin + t_lin_b + w(ck2, t_lin / every, 0.0)), 0.0)
    cp_vol = 3.0 * lst * (cp - 1) * (t * 2.0 * k.kv_width / tp * k.act_bytes)
    t_cp = mx(cp_vol / w(tp * cp <= dom, link, net) - t_att * (1.0 + k.attention_backward), 0.0)
    bw_dp = w(r.world <= dom, link, net)  # the job in one NVLink domain, else across the network
    t_ep = 0.0
    if k.moe_top_k:
        t_ep = 4.0 * tl * k.moe_top_k * h * k.act_bytes / tp * (ep - 1) / ep / bw_dp
    return {"link": link, "net": net, "bw_dp": bw_dp, "t_tp": t_tp, "t_cp": t_cp, "t_ep": t_ep}


def _data_parallel_seconds(
    k: TimeModel, r: _Rank, t_mb: Any, t_fwd: Any, t_bwd: Any, bw_dp: Any, ops: Ops
) -> dict[str, Any]:
    """Data parallel: ZeRO-3's gathers per micro-batch (what the micro-batch does not hide), the gradient
    reduction and parameter all-gather once per step."""
    w, mx = ops.where, ops.maximum
    d, zero, lst, p_loc, tr_loc = r.d, r.zero, r.lst, r.p_loc, r.tr_loc
    z3 = (d - 1) / d * (p_loc * k.gathers * k.fetch_bytes + tr_loc * k.grad_bytes) / bw_dp
    z3_exposed = w((zero == 3) & (d > 1), mx(z3 - t_mb, 0.0) + z3 / lst, 0.0)
    red = w(zero == 0, 2.0, 1.0) * (d - 1) / d * tr_loc * k.grad_bytes / bw_dp
    red_exposed = mx(red - t_bwd, 0.0) + red / lst
    gather = w(zero >= 1, (d - 1) / d * tr_loc * k.act_bytes / bw_dp, 0.0)
    if k.overlap:  # the parameter all-gather hides behind the next step's first forward
        gather = mx(gather - t_fwd, 0.0) + gather / lst
    t_dp = w((zero < 3) & (d > 1), red_exposed + gather, 0.0)
    return {"z3": z3, "z3_exposed": z3_exposed, "red": red, "gather": gather, "t_dp": t_dp}


def _pipeline_seconds(k: TimeModel, r: _Rank, link: Any, net: Any, ops: Ops) -> tuple[Any, Any]:
    """The pipeline's bubble (in micro-batches) and its point-to-point sends over a step."""
    w = ops.where
    pp, tp, t, m = r.pp, r.tp, r.t, r.m
    bubble_mbs = w(pp > 1, (pp - 1) / k.schedule_chunks, 0.0)
    bw = w(tp * pp <= k.speed.nvlink_domain, link, net)
    p2p = 2.0 * t * k.hidden * k.act_bytes / tp * k.schedule_chunks / bw
    t_p2p = w(pp > 1, m * p2p, 0.0)
    return bubble_mbs, t_p2p


def _optimizer_seconds(
    k: TimeModel, c: Mapping[str, Any], r: _Rank, hbm: Any, ops: Ops
) -> tuple[Any, Any, Any]:
    """(trainable parameters per rank after ZeRO, the optimizer step on the GPU, the offloaded step and its
    PCIe copies)."""
    w = ops.where
    zero, off, d, m, p_loc = r.zero, r.off, r.d, r.m, r.p_loc
    shard = w(zero >= 1, d, 1)
    tr_sh = r.tr_loc / shard
    t_opt = w(off == 0, tr_sh * c["opt_bytes"] / hbm, 0.0)
    pcie = k.speed.pcie_gb_s * 1e9 * PCIE_EFFICIENCY
    t_off = w(off >= 1, tr_sh * (k.grad_bytes + 2.0) / pcie + tr_sh / CPU_ADAM_PARAMS_PER_S, 0.0)
    t_off = t_off + w(off == 2, m * k.gathers * p_loc / d * k.fetch_bytes / pcie, 0.0)
    return tr_sh, t_opt, t_off


def step_parts(k: TimeModel, c: Mapping[str, Any], ops: Ops = SCALAR_OPS) -> dict[str, Any]:
    """Per-step seconds by category, the step time, tokens/s per GPU and MFU, and the intermediates the
    breakdown's formulas quote. ``c``: dp, tp, pp, cp, ep, zero, sp, micro_batch, grad_accum,
    pp_microbatches, checkpointing, loss, offload (codes as ``CKPT_CODES`` ...), opt_bytes.

    Known misses (docs/speed.md): gradient reduction hidden better in Megatron runs than here (9-26% slow);
    eager-mode overheads that torch.compile removes; paged optimizer states; activation offloading's copies.
    """
    r = _rank(k, c, ops)
    mm = _matmul_seconds(k, c, r, ops)
    t_fwd, t_bwd, t_rec, hbm = mm["t_fwd"], mm["t_bwd"], mm["t_rec"], mm["hbm"]
    mem = _memory_bound_seconds(k, c, r, hbm, ops)
    par = _model_parallel_seconds(k, r, mm, ops)
    t_tp, t_cp, t_ep = par["t_tp"], par["t_cp"], par["t_ep"]
    t_mb = t_fwd + t_bwd + t_rec + mem["t_mem"] + t_tp + t_cp + t_ep
    dp = _data_parallel_seconds(k, r, t_mb, t_fwd, t_bwd, par["bw_dp"], ops)
    z3_exposed, t_dp = dp["z3_exposed"], dp["t_dp"]
    t_pipe = t_mb + z3_exposed
    bubble_mbs, t_p2p = _pipeline_seconds(k, r, par["link"], par["net"], ops)
    tr_sh, t_opt, t_off = _optimizer_seconds(k, c, r, hbm, ops)
    m = r.m
    step = t_pipe * (m + bubble_mbs) + t_p2p + t_dp + t_opt + t_off
    tokens = r.t * m / (r.tp * r.pp) / step  # the replica's tokens per step over its tp x pp x cp GPUs
    mfu = tokens * method_flops_per_token(k) / k.peak_flops
    return {
        "step_time_s": step,
        "tokens_per_gpu_s": tokens,
        "mfu": mfu,
        "forward": m * t_fwd,
        "backward": m * t_bwd,
        "recompute": m * t_rec,
        "memory-bound": m * mem["t_mem"],
        "tensor/context parallel": m * (t_tp + t_cp + t_ep) + t_p2p,
        "data parallel": m * z3_exposed + t_dp,
        "pipeline bubble": t_pipe * bubble_mbs,
        "optimizer step": t_opt,
        "offload": t_off,
        # intermediates quoted by the breakdown
        "_": {"t": r.t, "m": m, "lst": r.lst, "rate": mm["rate"], "hbm": hbm, "lin": mm["lin"], "ada": mm["ada"],
              "att": mm["att"], "head": mm["head"], "io": mm["io"], "t_lin": mm["t_lin"], "t_att": mm["t_att"],
              "el": mem["el"], "loss_b": mem["loss_b"], "cast_b": mem["cast_b"], "deq_b": mem["deq_b"], "f8_b": mem["f8_b"],
              "t_tp": t_tp, "t_cp": t_cp, "t_ep": t_ep, "z3": dp["z3"], "z3x": m * z3_exposed, "red": dp["red"],
              "gather": dp["gather"], "bubble_mbs": bubble_mbs, "t_pipe": t_pipe, "tr_sh": tr_sh, "d": r.d,
              "world": r.world, "offload_params": r.off == 2},
    }  # fmt: skip


def scenario_columns(scenario: Scenario, opt_bytes: float) -> dict[str, Any]:
    """One candidate's columns (as ``step_parts`` reads them) from a scenario."""
    p = scenario.parallel
    return {
        "dp": p.dp,
        "tp": p.tp,
        "pp": p.pp,
        "cp": p.cp,
        "ep": p.ep,
        "zero": p.zero,
        "sp": int(p.sequence_parallel),
        "micro_batch": scenario.micro_batch_size,
        "grad_accum": scenario.grad_accum_steps,
        "pp_microbatches": p.pp_microbatches,
        "checkpointing": CKPT_CODES[scenario.activation_checkpointing],
        "loss": LOSS_CODES[scenario.loss],
        "offload": OFFLOAD_CODES[p.offload],
        "opt_bytes": opt_bytes,
    }
