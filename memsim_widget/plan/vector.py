"""The engine's step timeline evaluated for many candidate layouts at once, with numpy.

Why it is exact: the engine's work splits into parts that depend on few knobs -- a rank's model states
(``model_states``: layout, ZeRO stage, optimizer, offload, its stage's layers) and one micro-batch's
activation terms (``activations``: micro-batch, tp, cp, sequence parallel, checkpointing, loss). Each
distinct part is computed once, by the engine itself, and reduced to four integer sums per group of
items (raw bytes, allocated bytes, long-lived allocated bytes, loss-buffer allocated bytes). What
``engine/timeline.moments`` and ``engine/overhead.reserved_item`` then do with those groups -- scale the
terms by layers and micro-batches in flight, pick the larger of two instants, take the peak moment and
the largest allocator pool -- is redone here on arrays, with the same integer and float operations in the
same order. ``tests/test_plan_vector.py`` checks every figure against ``estimate`` byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from memsim_widget.engine.activations import ActivationBudget, Term, activations
from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.items import ALLOC_ROUND, Item
from memsim_widget.engine.overhead import (
    FRAGMENTATION_PERSISTENT,
    NCCL_PER_COMMUNICATOR,
    PERSISTENT_CATEGORIES,
    _waste_rates,
    context_bytes,
    workspace_items,
)
from memsim_widget.engine.states import model_states
from memsim_widget.engine.timeline import MOMENTS, OFFLOAD_LAYERS_ON_GPU
from memsim_widget.scenario import Scenario

#: The knobs a candidate may set, as integer-coded columns (strings index the tuples below).
CHECKPOINTING = ("none", "selective", "full")
LOSSES = ("standard", "chunked")
OFFLOADS = ("none", "optimizer", "optimizer+params")
COLUMNS = ("dp", "tp", "pp", "cp", "ep", "zero", "sp", "micro_batch", "grad_accum", "pp_microbatches",
           "checkpointing", "loss", "optimizer", "offload")  # fmt: skip

#: Group statistics: [raw bytes, allocated bytes, long-lived allocated bytes, loss-buffer allocated bytes].
NSTAT = 4


def _item_stats(items: Sequence[Item]) -> np.ndarray:
    """The four sums of a list of engine items."""
    out = np.zeros(NSTAT, dtype=np.int64)
    for i in items:
        a = i.allocated_bytes
        out[0] += i.bytes
        out[1] += a
        if i.category in PERSISTENT_CATEGORIES:
            out[2] += a
    return out


# ----- model states: one engine call per distinct (layout, ZeRO, optimizer, offload, stage) ----------------
STATE_GROUPS = ("persistent", "grads", "post_grads", "grads_but_bottom", "gathered", "gathered_grads",
                "step_temps_all", "step_temps")  # fmt: skip


@dataclass(frozen=True)
class StateRow:
    """Group sums of one rank's model states, plus bytes held outside the allocator (paged states)."""

    stats: np.ndarray  # (len(STATE_GROUPS), NSTAT)
    outside: int


@lru_cache(maxsize=65536)
def state_row(scenario: Scenario, layers: int, first: bool, last: bool) -> StateRow:
    """``model_states`` of a rank holding ``layers`` layers (first/last stage), reduced to group sums."""
    ctx = Context(scenario)
    st = model_states(ctx, Stage(0, scenario.parallel.pp, layers, first, last))
    tensor_persistent = [i for i in st.persistent if i.level == "tensor"]
    groups = (
        tensor_persistent,
        st.grads,
        st.post_grads,
        st.grads_but_bottom,
        st.gathered,
        st.gathered_grads,
        st.step_temps,
        [i for i in st.step_temps if i.level == "tensor"],
    )
    stats = np.stack([_item_stats(g) for g in groups])
    outside = sum(i.bytes for i in st.persistent if i.level == "device")
    return StateRow(stats, outside)


# ----- activations: one engine call per distinct (micro-batch, tp, cp, sp, checkpointing, loss) -----------
TERM_GROUPS = ("per_layer", "checkpointed_layer", "cache_per_layer", "pre", "post", "loss_forward",
               "loss_saved", "loss_backward", "layer_backward", "top_backward", "attention_backward",
               "inputs")  # fmt: skip
#: Term table columns: bytes, first_bytes, skip_first, tensors, counted (tensor/allocator level), loss.
TERM_COLS = 6


@dataclass(frozen=True)
class ActRow:
    """The activation terms of one micro-batch as arrays, one table per group."""

    tables: dict[str, np.ndarray]  # group -> (terms, TERM_COLS) float64
    ckpt_input_shared: bool


def _term_table(terms: list[Term], loss_names: set[str]) -> np.ndarray:
    rows = [
        (
            t.bytes,
            t.first_bytes,
            float(t.skip_first),
            float(t.tensors),
            float(t.level in ("tensor", "allocator")),
            float(t.name in loss_names),
        )
        for t in terms
    ]
    return np.array(rows, dtype=np.float64).reshape(len(rows), TERM_COLS)


@lru_cache(maxsize=16384)
def act_row(scenario: Scenario) -> ActRow:
    """``activations`` of one micro-batch of ``scenario`` as term tables."""
    acts: ActivationBudget = activations(Context(scenario))
    loss_names = {t.name for t in acts.loss_forward + acts.loss_saved + acts.loss_backward}
    tables = {g: _term_table(getattr(acts, g), loss_names) for g in TERM_GROUPS}
    return ActRow(tables, acts.ckpt_input_shared)


def _scaled(table: np.ndarray, factor: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Group sums of ``timeline._scaled(terms, factor, first=first)`` for arrays of factors: (n, NSTAT)."""
    n = factor.shape[0]
    out = np.zeros((n, NSTAT), dtype=np.int64)
    if table.shape[0] == 0 or n == 0:
        return out
    f = factor[:, None]
    tb, fb, skip, tens, counted, loss = (table[:, j][None, :] for j in range(TERM_COLS))
    nbytes = np.trunc(tb * f - np.where(skip > 0, fb * first[:, None], 0.0)).astype(np.int64)
    tensors = np.maximum(1, np.trunc(tens * np.maximum(f, 1.0))).astype(np.int64)
    per = -(-nbytes // tensors)
    alloc = np.where((counted > 0) & (nbytes > 0), -(-per // ALLOC_ROUND) * ALLOC_ROUND * tensors, 0)
    live = (f > 0).astype(np.int64)
    out[:, 0] = (nbytes * live).sum(axis=1)
    out[:, 1] = (alloc * live).sum(axis=1)
    out[:, 3] = (alloc * (loss > 0) * live).sum(axis=1)
    return out


# ----- the candidate frame ---------------------------------------------------------------------------------
@dataclass
class Evaluation:
    """Per-candidate figures, equal to ``estimate(candidate_scenario(...))``'s worst rank."""

    peak_allocated_bytes: np.ndarray
    peak_reserved_bytes: np.ndarray
    device_total_bytes: np.ndarray
    peak_moment: np.ndarray  # index into timeline.MOMENTS
    worst_stage: np.ndarray
    gpu_memory_bytes: int

    @property
    def peak_phase(self) -> np.ndarray:
        return np.array(MOMENTS, dtype=object)[self.peak_moment]


def candidate_scenario(base: Scenario, optimizers: Sequence[str], row: Mapping[str, int]) -> Scenario:
    """The scenario of one candidate: ``base`` with the candidate's knobs (integer-coded) applied."""
    opt = optimizers[int(row["optimizer"])]
    impl = base.optimizer_impl
    from memsim_widget.optimizers import OPTIMIZERS

    impls = OPTIMIZERS[opt].impls
    if impls and impl not in impls:
        impl = "fused" if "fused" in impls else impls[0]
    return base.replace(
        micro_batch_size=int(row["micro_batch"]),
        grad_accum_steps=int(row["grad_accum"]),
        activation_checkpointing=CHECKPOINTING[int(row["checkpointing"])],
        loss=LOSSES[int(row["loss"])],
        optimizer=opt,
        optimizer_impl=impl,
        parallel={
            "dp": int(row["dp"]),
            "tp": int(row["tp"]),
            "pp": int(row["pp"]),
            "cp": int(row["cp"]),
            "ep": int(row["ep"]),
            "zero": int(row["zero"]),
            "sequence_parallel": bool(row["sp"]),
            "pp_microbatches": int(row["pp_microbatches"]),
            "offload": OFFLOADS[int(row["offload"])],
        },
    )


def _unique_rows(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of integer columns and the index of each row's distinct value."""
    stacked = np.stack(cols, axis=1)
    uniq, inverse = np.unique(stacked, axis=0, return_inverse=True)
    return uniq, inverse.reshape(-1)


def evaluate(base: Scenario, cols: Mapping[str, np.ndarray], optimizers: Sequence[str]) -> Evaluation:
    """Evaluate every candidate (one per index of the ``COLUMNS`` arrays) on ``base``'s other keys."""
    c = {k: np.asarray(cols[k], dtype=np.int64) for k in COLUMNS}
    n = c["dp"].shape[0]
    ctx0 = Context(base.replace(parallel={"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero": 0,
                                          "offload": "none", "sequence_parallel": False}))  # fmt: skip
    arch, gpu = ctx0.arch, ctx0.gpu
    par0 = base.parallel
    # ----- one row per (candidate, pipeline stage) -------------------------------------------------------
    pp = c["pp"]
    cand = np.repeat(np.arange(n), pp)
    starts = np.concatenate(([0], np.cumsum(pp)[:-1]))
    stage = np.arange(cand.shape[0]) - starts[cand]
    p = pp[cand]
    layers = arch.num_layers // p
    first = stage == 0
    last = stage == p - 1
    m = c["pp_microbatches"][cand]
    if par0.pp_schedule == "gpipe":
        f = np.where(p == 1, 1.0, m.astype(np.float64))
    else:
        f = np.minimum(m, p - stage).astype(np.float64)
        if par0.pp_schedule == "interleaved":
            v = par0.virtual_stages
            f = f * (1 + (p - 1) / (p * v))
        f = np.where(p == 1, 1.0, f)
    ckpt = c["checkpointing"][cand] == 2
    oib = base.optimizer_in_backward

    # ----- model states per distinct key ---------------------------------------------------------------
    zero = c["zero"][cand]
    dpcp = (c["dp"] * c["cp"])[cand]
    # ZeRO-0 states see dp only through "dp > 1" (DDP buckets); ZeRO >= 1 only through dp * cp
    # (with ep > 1 and ZeRO-0 the key keeps dp and cp as they are: ep must divide dp * cp)
    plain = (zero == 0) & (c["ep"][cand] == 1)
    s_dp = np.where(plain, np.minimum(c["dp"][cand], 2), np.where(zero == 0, c["dp"][cand], dpcp))
    s_cp = np.where((zero == 0) & ~plain, c["cp"][cand], 1)
    skey, s_idx = _unique_rows(
        c["tp"][cand], c["ep"][cand], s_dp, s_cp, zero, c["optimizer"][cand], c["offload"][cand], p,
        layers, first.astype(np.int64), last.astype(np.int64)
    )  # fmt: skip
    s_stats = np.zeros((len(skey), len(STATE_GROUPS), NSTAT), dtype=np.int64)
    s_out = np.zeros(len(skey), dtype=np.int64)
    for k, (tp, ep, sdp, scp, z, o, off, pk, lk, fk, lastk) in enumerate(skey.tolist()):
        sc = candidate_scenario(base, optimizers, {
            "dp": sdp, "tp": tp, "pp": pk, "cp": scp, "ep": ep, "zero": z, "sp": 0, "micro_batch": 1,
            "grad_accum": 1, "pp_microbatches": max(pk, 1), "checkpointing": 0, "loss": 0, "optimizer": o,
            "offload": off})  # fmt: skip
        row = state_row(sc, lk, bool(fk), bool(lastk))
        s_stats[k] = row.stats
        s_out[k] = row.outside
    S = {g: s_stats[s_idx, j] for j, g in enumerate(STATE_GROUPS)}

    # ----- activation terms per distinct key -----------------------------------------------------------
    akey, a_idx = _unique_rows(
        c["micro_batch"][cand], c["tp"][cand], c["cp"][cand], c["sp"][cand], c["checkpointing"][cand],
        c["loss"][cand]
    )  # fmt: skip
    arows = []
    for b, tp, cp, sp, ck, lo in akey.tolist():
        sc = base.replace(
            micro_batch_size=b,
            activation_checkpointing=CHECKPOINTING[ck],
            loss=LOSSES[lo],
            parallel={"dp": 1, "tp": tp, "pp": 1, "cp": cp, "ep": 1, "zero": 0, "offload": "none",
                      "sequence_parallel": bool(sp), "pp_microbatches": 1},
        )  # fmt: skip
        arows.append(act_row(sc))
    nrows = cand.shape[0]

    def scaled(group: str | tuple[str, str], factor: np.ndarray, first_n: np.ndarray) -> np.ndarray:
        """Group sums of a term group per row (``group`` may pick per row by checkpointing)."""
        out = np.zeros((nrows, NSTAT), dtype=np.int64)
        factor = np.broadcast_to(np.asarray(factor, dtype=np.float64), (nrows,))
        first_n = np.broadcast_to(np.asarray(first_n, dtype=np.float64), (nrows,))
        for k, ar in enumerate(arows):
            sel = a_idx == k
            if not sel.any():
                continue
            if isinstance(group, tuple):  # (full-checkpointing group, otherwise group)
                g = group[0] if akey[k, 4] == 2 else group[1]
            else:
                g = group
            out[sel] = _scaled(ar.tables[g], factor[sel], first_n[sel])
        return out

    zeros = np.zeros(nrows)
    kept = ("checkpointed_layer", "per_layer")
    full_resident = layers * f
    resident = (
        np.minimum(full_resident, OFFLOAD_LAYERS_ON_GPU) if base.activation_offloading else full_resident
    )
    first_n = np.where(first, f, 0.0)
    if base.activation_offloading:
        first_n = np.where(resident < layers * f, 0.0, first_n)
    ones = np.ones(nrows)
    last1 = last.astype(np.float64)
    saved_all = scaled(kept, resident, first_n)
    pre = scaled("pre", np.where(first, f, 0.0), zeros) + scaled("inputs", f, zeros)
    post = scaled("post", last1, zeros)
    loss_saved = scaled("loss_saved", last1, zeros)
    per_layer_1 = scaled("per_layer", ones, zeros)
    recompute = np.where(ckpt[:, None], per_layer_1, 0)
    lb = scaled("layer_backward", ones, zeros)
    ab = scaled("attention_backward", ones, zeros)
    layer_bwd = np.where((ab[:, 0] > lb[:, 0])[:, None], ab, lb)
    loss_bwd = scaled("loss_backward", last1, zeros)
    loss_fwd = scaled("loss_forward", last1, zeros) + scaled(
        "cache_per_layer", layers.astype(np.float64), zeros
    )
    top_bwd = scaled("top_backward", last1, zeros)
    if base.activation_offloading:
        rest = np.zeros((nrows, NSTAT), dtype=np.int64)
    else:
        rest_first = np.where(first_n > 0, first_n - 1, 0.0)
        rest = np.where((f > 1)[:, None], scaled(kept, layers * (f - 1), rest_first), 0)
    shared = np.array([ar.ckpt_input_shared for ar in arows], dtype=bool)[a_idx]
    own_ckpt = recompute + np.where(shared[:, None], 0, scaled(kept, ones, zeros))
    own_plain = scaled("per_layer", ones, first.astype(np.float64))
    own = np.where(ckpt[:, None], own_ckpt, own_plain)

    # ----- the moments (engine/timeline.moments) --------------------------------------------------------
    ws = _item_stats(workspace_items(ctx0))[None, :]
    ga = c["grad_accum"][cand]
    carried = (ga > 1) | ((p > 1) & (m > 1))
    gif = np.where((carried & (not oib))[:, None], S["grads"], 0)
    common = S["persistent"] + ws
    with_fwd = common + gif + S["gathered"] + pre + saved_all + post + loss_saved
    m1 = with_fwd + loss_fwd
    m2 = with_fwd + loss_bwd
    has_gif = carried & (not oib)
    head_grads = np.where(has_gif[:, None], gif, np.where(last[:, None], S["post_grads"], 0))
    base_top = common + head_grads + S["gathered"] + S["gathered_grads"] + pre + saved_all
    tail = recompute + layer_bwd
    m3 = base_top + np.where((tail[:, 0] > top_bwd[:, 0])[:, None], tail, top_bwd)
    opt_bwd = S["step_temps_all"] if oib else 0
    common_end = common + S["gathered"] + S["gathered_grads"] + opt_bwd + pre + rest
    l0 = S["grads_but_bottom"] + own + layer_bwd
    m4 = common_end + np.where((S["grads"][:, 0] > l0[:, 0])[:, None], S["grads"], l0)
    moments = [m1, m2, m3, m4]
    if base.optimizer != "none" and not oib:
        moments.append(S["persistent"] + ws + S["grads"] + S["step_temps"])
    M = np.stack(moments, axis=1)  # (rows, moments, NSTAT)

    # ----- peak, allocator pool, outside memory (engine/overhead) ---------------------------------------
    alloc = M[:, :, 1]
    peak_m = np.argmax(alloc, axis=1)
    peak_alloc = alloc[np.arange(nrows), peak_m]
    f_t, f_v = _waste_rates(ctx0)
    pers, loss = M[:, :, 2], M[:, :, 3]
    waste = np.trunc(FRAGMENTATION_PERSISTENT * pers + f_t * (alloc - pers) + f_v * loss).astype(np.int64)
    pool = np.maximum(peak_alloc, (alloc + waste).max(axis=1))
    comms = sum(
        (x > 1).astype(np.int64)
        for x in ((c["dp"] * c["cp"])[cand], c["tp"][cand], p, c["cp"][cand], c["ep"][cand])
    )
    outside = context_bytes(ctx0) + comms * NCCL_PER_COMMUNICATOR + s_out[s_idx]
    cap = gpu.memory_bytes - outside
    reserved = np.maximum(peak_alloc, np.minimum(pool, cap))
    device = reserved + outside

    # ----- the worst rank of each candidate (first of equals, as max() picks) ---------------------------
    best = np.full(n, -1, dtype=np.int64)
    np.maximum.at(best, cand, device)
    is_best = device == best[cand]
    order = np.where(is_best, np.arange(nrows), nrows)
    pick = np.full(n, nrows, dtype=np.int64)
    np.minimum.at(pick, cand, order)
    return Evaluation(
        peak_allocated_bytes=peak_alloc[pick],
        peak_reserved_bytes=reserved[pick],
        device_total_bytes=device[pick],
        peak_moment=peak_m[pick],
        worst_stage=stage[pick],
        gpu_memory_bytes=gpu.memory_bytes,
    )
