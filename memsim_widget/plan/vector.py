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
from typing import Any

import numpy as np

from memsim_widget.engine.activations import ActivationBudget, activations
from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.frameworks import root_resharded_for_loss
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
from memsim_widget.rules import available_impl
from memsim_widget.scenario import Scenario

#: The knobs a candidate may set, as integer-coded columns (strings index the tuples below).
CHECKPOINTING = ("none", "selective", "full", "selective-op")
#: Codes whose layers keep only ``checkpointed_layer`` and recompute in backward (every layer checkpointed).
CKPT_CODES = (2, 3)
LOSSES = ("standard", "chunked")
OFFLOADS = ("none", "optimizer", "optimizer+params")
COLUMNS = ("dp", "tp", "pp", "cp", "ep", "zero", "sp", "micro_batch", "grad_accum", "pp_microbatches",
           "checkpointing", "loss", "optimizer", "offload")  # fmt: skip

#: Group statistics: [raw bytes, allocated bytes, long-lived allocated bytes, loss-buffer allocated bytes].
NSTAT = 4

#: Byte figures are exact int64 below this bound (32 PiB; a custom card holds at most 1 PiB,
#: catalog/gpus.MAX_MEMORY_GIB). A term, group or moment that reaches it is clipped to it, so no sum of them
#: wraps around 2**63, and its candidate is marked ``overflow``: figures ``OVERFLOW_BYTES``, never fitting.
SATURATION_BYTES = 2**55
#: The figures reported for a candidate marked ``overflow`` (more than ``SATURATION_BYTES`` per GPU).
OVERFLOW_BYTES = np.iinfo(np.int64).max
#: Tensors per term beyond which a term is treated as saturated too (keeps 512 B rounding per tensor small).
MAX_TENSORS = 2**40


def _item_stats(items: Sequence[Item]) -> tuple[int, int, int, int]:
    """The four sums of a list of engine items (each clipped to ``SATURATION_BYTES``)."""
    raw = alloc = persistent = 0
    for i in items:
        a = i.allocated_bytes
        raw += i.bytes
        alloc += a
        if i.category in PERSISTENT_CATEGORIES:
            persistent += a
    return min(raw, SATURATION_BYTES), min(alloc, SATURATION_BYTES), min(persistent, SATURATION_BYTES), 0


# ----- model states: one engine call per distinct (layout, ZeRO, optimizer, offload, stage) ----------------
STATE_GROUPS = ("persistent", "grads", "post_grads", "grads_but_bottom", "gathered", "gathered_grads",
                "step_temps_all", "step_temps", "kept_unsharded", "kept_unsharded_last")  # fmt: skip


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
        st.kept_unsharded,
        st.kept_unsharded_last,
    )
    stats = np.array([_item_stats(g) for g in groups], dtype=np.int64)
    outside = min(sum(i.bytes for i in st.persistent if i.level == "device"), SATURATION_BYTES)
    return StateRow(stats, outside)


def _state_side(
    base: Scenario, optimizers: tuple[str, ...], skey: np.ndarray, num_layers: int, ws: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The state side of each moment per distinct state key (tp, ep, dp, cp, zero, optimizer, offload, pp,
    first, last, gradients carried between micro-batches), and the bytes held outside the allocator."""
    k10, inv = unique_codes([skey[:, j] for j in range(10)])
    stats = np.zeros((k10.shape[0], len(STATE_GROUPS), NSTAT), dtype=np.int64)
    outside = np.zeros(k10.shape[0], dtype=np.int64)
    resharded = np.zeros(k10.shape[0], dtype=bool)  # engine/timeline: no gathered units while the loss runs
    for k, (tp, ep, sdp, scp, z, o, off, pk, fk, lk) in enumerate(k10.tolist()):
        sc = candidate_scenario(base, optimizers, {
            "dp": sdp, "tp": tp, "pp": pk, "cp": scp, "ep": ep, "zero": z, "sp": 0, "micro_batch": 1,
            "grad_accum": 1, "pp_microbatches": max(pk, 1), "checkpointing": 0, "loss": 0, "optimizer": o,
            "offload": off}, validate=False)  # fmt: skip
        row = state_row(sc, num_layers // pk, bool(fk), bool(lk))
        stats[k] = row.stats
        outside[k] = row.outside
        resharded[k] = root_resharded_for_loss(sc, bool(lk))
    g = {name: stats[inv, j] for j, name in enumerate(STATE_GROUPS)}
    carried = (skey[:, 10] == 1)[:, None]
    last = (skey[:, 9] == 1)[:, None]
    common = g["persistent"] + ws[None, :]
    gif = np.where(carried, g["grads"], 0)
    head = np.where(carried, gif, np.where(last, g["post_grads"], 0))
    both = g["gathered"] + g["gathered_grads"]
    parts = {
        # engine/timeline: without reshard after forward every layer stays unsharded until its backward
        "fwd": common
        + gif
        + np.where(resharded[inv][:, None], 0, g["gathered"])
        + g["kept_unsharded"]
        + g["kept_unsharded_last"],
        "top": common + head + both + g["kept_unsharded"],
        "end": common + both + (g["step_temps_all"] if base.optimizer_in_backward else 0),
        "grads": g["grads"],
        "grads_but_bottom": g["grads_but_bottom"],
        "step": common + g["grads"] + g["step_temps"],
    }
    return parts, outside[inv]


# ----- activations: one engine call per distinct (micro-batch, tp, cp, sp, checkpointing, loss) -----------
TERM_GROUPS = ("per_layer", "checkpointed_layer", "cache_per_layer", "pre", "post", "loss_forward",
               "loss_saved", "loss_backward", "layer_backward", "top_backward", "attention_backward",
               "inputs", "output_logits", "output_cache", "output_cache_extra", "recomputed_layer",
               "pp_buffer", "pp_output", "pp_logits")  # fmt: skip
#: Term table columns: bytes, first_bytes, skip_first, tensors, counted (tensor/allocator level), loss.
TERM_COLS = 6


@dataclass(frozen=True)
class ActRow:
    """The activation terms of one micro-batch as arrays, one table per group."""

    tables: dict[str, np.ndarray]  # group -> (terms, TERM_COLS) float64
    ckpt_input_shared: bool
    output_through_step: bool = False


@lru_cache(maxsize=16384)
def act_row(scenario: Scenario) -> ActRow:
    """``activations`` of one micro-batch of ``scenario`` as term tables."""
    acts: ActivationBudget = activations(Context(scenario))
    loss_names = acts.loss_buffer_names()
    rows: list[tuple[float, ...]] = []
    bounds = [0]
    for g in TERM_GROUPS:
        for t in getattr(acts, g):
            rows.append(
                (
                    t.bytes,
                    t.first_bytes,
                    float(t.skip_first),
                    float(t.tensors),
                    float(t.level in ("tensor", "allocator")),
                    float(t.name in loss_names),
                )
            )
        bounds.append(len(rows))
    table = np.array(rows, dtype=np.float64).reshape(len(rows), TERM_COLS)
    tables = {g: table[bounds[j] : bounds[j + 1]] for j, g in enumerate(TERM_GROUPS)}
    return ActRow(tables, acts.ckpt_input_shared, acts.output_through_step)


# ----- the candidate frame ---------------------------------------------------------------------------------
@dataclass
class Evaluation:
    """Per-candidate figures, equal to ``estimate(candidate_scenario(...))``'s worst rank."""

    peak_allocated_bytes: np.ndarray
    peak_reserved_bytes: np.ndarray
    device_total_bytes: np.ndarray
    peak_moment: np.ndarray  # index into timeline.MOMENTS
    worst_stage: np.ndarray
    #: Candidates where some term or sum reached ``SATURATION_BYTES`` (they need tens of PiB per GPU, more
    #: than any card): figures reported as ``OVERFLOW_BYTES``, peak moment and worst stage not meaningful;
    #: ``estimate`` of the candidate gives the exact figures.
    overflow: np.ndarray

    @property
    def peak_phase(self) -> np.ndarray:
        return np.array(MOMENTS, dtype=object)[self.peak_moment]


def replace_unchecked(obj: Any, **changes: Any) -> Any:
    """A copy of a frozen dataclass with fields changed, skipping validation (planner-internal keys
    whose values the search space already made valid)."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


def scenario_columns(scenario: Scenario, optimizers: Sequence[str] | None = None) -> dict[str, int]:
    """The knobs of ``scenario`` integer-coded as a candidate (the inverse of ``candidate_scenario``);
    ``optimizers`` indexes the optimizer (default: the scenario's own, index 0)."""
    par = scenario.parallel
    opts = tuple(optimizers) if optimizers is not None else (scenario.optimizer,)
    return {
        "dp": par.dp,
        "tp": par.tp,
        "pp": par.pp,
        "cp": par.cp,
        "ep": par.ep,
        "zero": par.zero,
        "sp": int(par.sequence_parallel),
        "micro_batch": scenario.micro_batch_size,
        "grad_accum": scenario.grad_accum_steps,
        "pp_microbatches": par.pp_microbatches if par.pp > 1 else 1,  # unused without a pipeline
        "checkpointing": CHECKPOINTING.index(scenario.activation_checkpointing),
        "loss": LOSSES.index(scenario.loss),
        "optimizer": opts.index(scenario.optimizer),
        "offload": OFFLOADS.index(par.offload),
    }


def candidate_scenario(
    base: Scenario, optimizers: Sequence[str], row: Mapping[str, int], *, validate: bool = True
) -> Scenario:
    """The scenario of one candidate: ``base`` with the candidate's knobs (integer-coded) applied.
    ``validate=False`` skips the checks (the planner's internal state keys)."""
    opt = optimizers[int(row["optimizer"])]
    impl = available_impl(opt, base.optimizer_impl)  # the rule's fallback (rules/model.py)
    keys: dict[str, Any] = {
        "micro_batch_size": int(row["micro_batch"]),
        "grad_accum_steps": int(row["grad_accum"]),
        "activation_checkpointing": CHECKPOINTING[int(row["checkpointing"])],
        "checkpoint_every": None,  # the planner checkpoints every layer (or none)
        "loss": LOSSES[int(row["loss"])],
        "optimizer": opt,
        "optimizer_impl": impl,
    }
    par = {
        "dp": int(row["dp"]),
        "tp": int(row["tp"]),
        "pp": int(row["pp"]),
        "cp": int(row["cp"]),
        "ep": int(row["ep"]),
        "zero": int(row["zero"]),
        "sequence_parallel": bool(row["sp"]),
        "pp_microbatches": int(row["pp_microbatches"]),
        "offload": OFFLOADS[int(row["offload"])],
    }
    if not validate:
        return replace_unchecked(base, parallel=replace_unchecked(base.parallel, **par), **keys)
    return base.replace(parallel=par, **keys)


def unique_codes(cols: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of non-negative integer columns as a (distinct, columns) array in lexicographic order,
    and each row's distinct index. The columns are packed into one int64 with as many bits per column as
    its largest value needs (most significant first); rows too wide for 63 bits go through ``np.unique``
    on the stacked rows (slower, same answer)."""
    n = cols[0].shape[0] if cols else 0
    if n == 0:
        return np.zeros((0, len(cols)), dtype=np.int64), np.zeros(0, dtype=np.int64)
    cols = [np.asarray(col, dtype=np.int64) for col in cols]
    if any(int(col.min()) < 0 for col in cols):
        raise ValueError("planner key columns must be non-negative")
    bits = [max(1, int(col.max()).bit_length()) for col in cols]
    if sum(bits) > 63:
        uniq, inverse = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
        return uniq, inverse.reshape(-1)
    code = np.zeros(n, dtype=np.int64)
    for col, nb in zip(cols, bits, strict=True):
        code = (code << nb) | col
    uniq, inverse = np.unique(code, return_inverse=True)
    out = np.zeros((uniq.shape[0], len(bits)), dtype=np.int64)
    rest = uniq.copy()
    for j in range(len(bits) - 1, -1, -1):
        out[:, j] = rest & ((1 << bits[j]) - 1)
        rest >>= bits[j]
    return out, inverse.reshape(-1)


def _padded(tables: list[np.ndarray]) -> np.ndarray:
    """Term tables of several keys stacked as (keys, max terms, TERM_COLS), padded with zero terms."""
    width = max((t.shape[0] for t in tables), default=0)
    out = np.zeros((len(tables), max(width, 1), TERM_COLS), dtype=np.float64)
    for k, t in enumerate(tables):
        out[k, : t.shape[0]] = t
    return out


def _scaled_rows(table: np.ndarray, factor: np.ndarray, first: np.ndarray) -> np.ndarray:
    """``_scaled`` where each row has its own term table: ``table`` is (rows, terms, TERM_COLS). A row
    whose bytes reach ``SATURATION_BYTES`` has every statistic set to it (so the overflow shows in any sum
    it enters)."""
    n = factor.shape[0]
    out = np.zeros((n, NSTAT), dtype=np.int64)
    if n == 0:
        return out
    f = factor[:, None]
    tb, fb, skip, tens, counted, loss = (table[:, :, j] for j in range(TERM_COLS))
    fbytes = np.trunc(tb * f - np.where(skip > 0, fb * first[:, None], 0.0))
    ftensors = np.trunc(tens * np.maximum(f, 1.0))
    big = (fbytes >= SATURATION_BYTES) | (ftensors >= MAX_TENSORS)
    nbytes = np.where(big, 0, fbytes).astype(np.int64)
    tensors = np.maximum(1, np.where(big, 1, ftensors)).astype(np.int64)
    per = -(-nbytes // tensors)
    alloc = np.where((counted > 0) & (nbytes > 0), -(-per // ALLOC_ROUND) * ALLOC_ROUND * tensors, 0)
    live = f > 0
    big &= live
    out[:, 0] = np.where(live, nbytes, 0).sum(axis=1)
    out[:, 1] = np.where(live, alloc, 0).sum(axis=1)
    out[:, 3] = np.where(live & (loss > 0), alloc, 0).sum(axis=1)
    # each term below the bound (allocated: at most 512 B per tensor more), a few dozen terms: no sum wraps
    over = big.any(axis=1) | (out[:, 0] >= SATURATION_BYTES) | (out[:, 1] >= SATURATION_BYTES)
    out[over] = SATURATION_BYTES
    return out


def _stage_rows(pp: np.ndarray, mb: np.ndarray, schedule: str, v: int) -> tuple[np.ndarray, np.ndarray]:
    """(candidate, stage) of the stages that can be a candidate's worst rank: the first, the second, the
    first middle stage that carries gradients (fewer micro-batches in flight than there are, so an earlier
    one already ran backward: engine/timeline ``grads_carried``) and the last. Middle stages hold the same
    states and no more micro-batches in flight than a lower one, so within each group (carrying or not) the
    lowest is the worst; ties go to the lower stage, as ``max`` does."""
    carry = _first_carrying_stage(pp, mb, schedule, v)
    extra = (carry > 1) & (carry < pp - 1)
    k = np.minimum(pp, 3) + extra
    cand = np.repeat(np.arange(pp.shape[0]), k)
    starts = np.concatenate(([0], np.cumsum(k)[:-1]))
    j = np.arange(cand.shape[0]) - starts[cand]
    p, x = pp[cand], extra[cand]
    stage = np.where(j < 2, j, np.where(x & (j == 2), carry[cand], p - 1))
    return cand, stage


def _first_carrying_stage(pp: np.ndarray, mb: np.ndarray, schedule: str, v: int) -> np.ndarray:
    """The lowest stage >= 1 whose micro-batches in flight ``f`` (engine/context ``in_flight``) are fewer than
    ``mb``: 1F1B ``min(m, p - s) < m`` from ``s = p - m + 1``; interleaved ``(w(s) + 1) / v < m`` with
    ``w(s) = (v - 1) r + 2 (p - 1 - s)`` from ``s > p - 1 - (m v - 1 - (v - 1) r) / 2``; never under GPipe."""
    if schedule == "gpipe":
        return np.full(pp.shape, -1, dtype=np.int64)
    if schedule == "interleaved":
        per_round = mb // np.maximum(1, mb // pp)
        room = mb * v - 1 - (v - 1) * per_round
        return np.maximum(1, np.floor(pp - 1 - room / 2).astype(np.int64) + 1)
    return np.maximum(1, pp - mb + 1)


def evaluate(base: Scenario, cols: Mapping[str, np.ndarray], optimizers: Sequence[str]) -> Evaluation:
    """Evaluate every candidate (one per index of the ``COLUMNS`` arrays) on ``base``'s other keys."""
    c = {k: np.asarray(cols[k], dtype=np.int64) for k in COLUMNS}
    ctx0 = Context(base.replace(parallel={"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero": 0,
                                          "offload": "none", "sequence_parallel": False}))  # fmt: skip
    arch, gpu = ctx0.arch, ctx0.gpu
    par0 = base.parallel
    oib = base.optimizer_in_backward

    # ----- activation terms per distinct (micro-batch, tp, cp, sp, checkpointing, loss) -----------------
    akey, a_cand = unique_codes([c["micro_batch"], c["tp"], c["cp"], c["sp"], c["checkpointing"], c["loss"]])
    arows = []
    for b, tp, cp, sp, ck, lo in akey.tolist():
        sc = replace_unchecked(
            base,
            micro_batch_size=b,
            activation_checkpointing=CHECKPOINTING[ck],
            checkpoint_every=None,
            loss=LOSSES[lo],
            parallel=replace_unchecked(base.parallel, dp=1, tp=tp, pp=1, cp=cp, ep=1, zero=0, offload="none",
                                sequence_parallel=bool(sp), pp_microbatches=1),
        )  # fmt: skip
        arows.append(act_row(sc))
    T = {g: _padded([ar.tables[g] for ar in arows]) for g in TERM_GROUPS}
    # what each layer keeps for backward: its checkpointed input under full checkpointing, else every term
    T["kept"] = _padded(
        [
            ar.tables["checkpointed_layer" if ck in CKPT_CODES else "per_layer"]
            for ar, ck in zip(arows, akey[:, 4], strict=True)
        ]
    )
    # what recomputing a layer adds: ``recomputed_layer`` where the engine sets it, else every per-layer term
    T["recompute"] = _padded([ar.tables["recomputed_layer"] if ar.tables["recomputed_layer"].shape[0]
                              else ar.tables["per_layer"] for ar in arows])  # fmt: skip
    shared_k = np.array([ar.ckpt_input_shared for ar in arows], dtype=bool)

    # ----- one row per (candidate, stage that can be the worst) -----------------------------------------
    cand, stage = _stage_rows(c["pp"], c["pp_microbatches"], par0.pp_schedule, par0.virtual_stages)
    p = c["pp"][cand]
    m = c["pp_microbatches"][cand]
    last = stage == p - 1
    first = stage == 0

    # ----- activation side per distinct (activation key, pp, stage, micro-batches) ----------------------
    # kind: 0 the first stage, 1 the second, 2 the last, 3 the first middle one that carries gradients
    kind = np.where(first, 0, np.where(last, 2, np.where(stage == 1, 1, 3)))
    xkey, x_row = unique_codes([a_cand[cand], p, kind, m])
    xa, xp, xkind, xm = xkey[:, 0], xkey[:, 1], xkey[:, 2], xkey[:, 3]
    carry = _first_carrying_stage(xp, xm, par0.pp_schedule, par0.virtual_stages)
    xstage = np.where(xkind == 0, 0, np.where(xkind == 2, xp - 1, np.where(xkind == 3, carry, 1)))
    xfirst, xlast = xstage == 0, xstage == xp - 1
    layers = arch.num_layers // xp
    v = par0.virtual_stages
    if par0.pp_schedule == "gpipe":
        f = np.where(xp == 1, 1.0, xm.astype(np.float64))
    elif par0.pp_schedule == "interleaved":  # engine/context.interleaved_in_flight
        per_round = xm // np.maximum(1, xm // xp)
        warmup = np.minimum((v - 1) * per_round + 2 * (xp - 1 - xstage), xm * v)
        f = np.where(xp == 1, 1.0, np.minimum(warmup + 1, xm * v) / v)
    else:
        f = np.where(xp == 1, 1.0, np.minimum(xm, xp - xstage).astype(np.float64))
    nx = xkey.shape[0]
    zeros = np.zeros(nx)

    x_over = np.zeros(nx, dtype=bool)  # a term or sum of this row reached SATURATION_BYTES

    def scaled(group: str, factor: np.ndarray | float, first_n: np.ndarray | float) -> np.ndarray:
        nonlocal x_over
        fac = np.broadcast_to(np.asarray(factor, dtype=np.float64), (nx,))
        fst = np.broadcast_to(np.asarray(first_n, dtype=np.float64), (nx,))
        out = _scaled_rows(T[group][xa], fac, fst)
        x_over |= (out >= SATURATION_BYTES).any(axis=1)
        return out

    # terms whose factor does not depend on the stage: once per activation key, then picked per row
    na = akey.shape[0]
    a_ones, a_zeros = np.ones(na), np.zeros(na)

    a_over = np.zeros(na, dtype=bool)

    def per_key(group: str, first_n: np.ndarray = a_zeros) -> np.ndarray:
        nonlocal a_over
        out = _scaled_rows(T[group], a_ones, first_n)
        a_over |= (out >= SATURATION_BYTES).any(axis=1)
        return out

    a_ckpt = np.isin(akey[:, 4], CKPT_CODES)
    a_recompute = np.where(a_ckpt[:, None], per_key("recompute"), 0)
    lb, ab = per_key("layer_backward"), per_key("attention_backward")
    a_layer_bwd = np.where((ab[:, 0] > lb[:, 0])[:, None], ab, lb)
    a_own_ckpt = a_recompute + np.where(shared_k[:, None], 0, per_key("kept"))
    a_own = {
        True: np.where(a_ckpt[:, None], a_own_ckpt, per_key("per_layer", a_ones)),  # layer 0 of stage 0
        False: np.where(a_ckpt[:, None], a_own_ckpt, per_key("per_layer")),
    }
    a_last = {  # the last stage's loss and head terms (factor 1; other stages hold none)
        "loss_bwd": per_key("loss_backward"),
        "loss_fwd": per_key("loss_forward"),
        "top_bwd": per_key("top_backward"),
        "held_logits": per_key("output_logits"),
    }
    on_last = xlast[:, None]
    # engine/pipeline.py: the last stage's losses held at once, the stage's buffers and kept outputs
    piped = xp > 1
    n_loss = np.where(xlast, np.where(piped & (par0.pp_schedule == "gpipe"), xm, 1), 0).astype(np.float64)
    post = scaled("post", n_loss, zeros) + scaled("loss_saved", n_loss, zeros)
    n_recv = np.where(piped, xm * (2 * v - xfirst.astype(np.int64) - xlast.astype(np.int64)), 0)
    n_send = (piped & (xm > 1) & (~xfirst | (v > 1))).astype(np.float64)
    n_out = np.where(piped, np.where(xlast, n_loss, f), 0.0)
    recv = scaled("pp_buffer", n_recv.astype(np.float64), zeros)
    stage_io = (
        recv
        + scaled("pp_buffer", n_send, zeros)
        + np.where(xlast[:, None], scaled("pp_logits", n_out, zeros), scaled("pp_output", n_out, zeros))
    )
    held_logits = np.where(on_last, a_last["held_logits"][xa], 0)
    loss_bwd = np.where(on_last, a_last["loss_bwd"][xa], 0)
    top_bwd = np.where(on_last, a_last["top_bwd"][xa], 0)
    recompute = a_recompute[xa]
    layer_bwd = a_layer_bwd[xa]
    own = np.where(xfirst[:, None], a_own[True][xa], a_own[False][xa])

    full_resident = layers * f
    resident = (
        np.minimum(full_resident, OFFLOAD_LAYERS_ON_GPU) if base.activation_offloading else full_resident
    )
    first_n = np.where(xfirst, f, 0.0)
    if base.activation_offloading:
        first_n = np.where(resident < layers * f, 0.0, first_n)
    saved_all = scaled("kept", resident, first_n)
    pre = scaled("pre", np.where(xfirst, f, 0.0), zeros) + scaled("inputs", f, zeros)
    loss_fwd = np.where(on_last, a_last["loss_fwd"][xa], 0) + scaled(
        "cache_per_layer", layers.astype(np.float64), zeros
    )
    tail = recompute + layer_bwd
    # the model output the loop still holds (engine/timeline: held_out, cache_all, cache_but_own)
    fl = layers.astype(np.float64)
    held_out = held_logits + scaled("output_cache_extra", fl, zeros)
    cache_all = scaled("output_cache", fl, zeros)
    cache_but_own = scaled("output_cache", fl - 1, zeros) + scaled("output_cache_extra", 1.0, zeros)
    if base.activation_offloading:
        rest = np.zeros((nx, NSTAT), dtype=np.int64)
    else:
        rest_first = np.where(first_n > 0, first_n - 1, 0.0)
        rest = np.where((f > 1)[:, None], scaled("kept", layers * (f - 1), rest_first), 0)
    # backward_top: the larger of the final norm's backward and the last layer's (the rest is shared)
    held = pre + saved_all + stage_io
    m3 = held + np.where((tail[:, 0] > top_bwd[:, 0])[:, None], tail, top_bwd) + held_out
    l0 = own + layer_bwd + cache_but_own
    through_step = any(ar.output_through_step for ar in arows)  # output_lifetime "step" (a base key)
    step_held = recv + (held_logits + cache_all if through_step else 0)
    # the sums the moments compare or add (raw bytes included), for the overflow mark
    for part in (held, m3, tail, top_bwd, l0, held_out, cache_all, rest, step_held, loss_bwd, post, loss_fwd):
        x_over |= (np.asarray(part) >= SATURATION_BYTES).any(axis=1)
    x_over |= a_over[xa]
    # per row only what the moments need: activation terms are never long-lived (no persistent column)
    a_cols = np.stack(
        [
            (held + post + loss_fwd)[:, 1], (held + post + loss_fwd)[:, 3],
            (held + post + loss_bwd + held_out)[:, 1], (held + post + loss_bwd + held_out)[:, 3],
            m3[:, 1], m3[:, 3],
            (pre + rest + held_logits + stage_io)[:, 1], (pre + rest + held_logits + stage_io)[:, 3],
            l0[:, 1], l0[:, 3], l0[:, 0] - cache_all[:, 0],
            cache_all[:, 1], cache_all[:, 3], step_held[:, 1], step_held[:, 3],
        ],
        axis=1,
    )[x_row]  # fmt: skip
    nrows = cand.shape[0]

    # ----- model states per distinct (layout, ZeRO, optimizer, offload, stage) ---------------------------
    zero = c["zero"][cand]
    dpcp = (c["dp"] * c["cp"])[cand]
    # ZeRO-0 states see dp only through "dp > 1" (DDP buckets); ZeRO >= 1 only through dp * cp
    # (with ep > 1 and ZeRO-0 the key keeps dp and cp as they are: ep must divide dp * cp)
    plain = (zero == 0) & (c["ep"][cand] == 1)
    s_dp = np.where(plain, np.minimum(c["dp"][cand], 2), np.where(zero == 0, c["dp"][cand], dpcp))
    s_cp = np.where((zero == 0) & ~plain, c["cp"][cand], 1)
    ga = c["grad_accum"][cand]
    carried = ((ga > 1) | ((p > 1) & (f[x_row] < m))) & (not oib)  # engine/timeline: grads_carried
    skey, s_idx = unique_codes(
        [c["tp"][cand], c["ep"][cand], s_dp, s_cp, zero, c["optimizer"][cand], c["offload"][cand], p,
         first.astype(np.int64), last.astype(np.int64), carried.astype(np.int64)]
    )  # fmt: skip
    ws = np.array(_item_stats(workspace_items(ctx0)), dtype=np.int64)
    S, s_out = _state_side(base, tuple(optimizers), skey, arch.num_layers, ws)
    # per row only what the moments need: state items are never loss buffers (no loss column)
    s_cols = np.stack(
        [
            S["fwd"][:, 1], S["fwd"][:, 2], S["top"][:, 1], S["top"][:, 2], S["end"][:, 1], S["end"][:, 2],
            S["step"][:, 1], S["step"][:, 2], S["grads"][:, 1], S["grads"][:, 2],
            S["grads_but_bottom"][:, 1], S["grads_but_bottom"][:, 2],
            S["grads"][:, 0] - S["grads_but_bottom"][:, 0],
        ],
        axis=1,
    )[s_idx]  # fmt: skip
    s_over = s_out >= SATURATION_BYTES
    for part in S.values():
        s_over |= (part >= SATURATION_BYTES).any(axis=1)
    s_out = s_out[s_idx]

    # ----- the moments (engine/timeline.moments): (allocated, long-lived, loss buffers) per moment -------
    # backward_end: the embedding's backward (all gradients, the held output's whole KV cache) if that
    # outweighs layer 0's instant (a_cols[:, 10] is layer 0's terms less that whole cache)
    embed = s_cols[:, 12] > a_cols[:, 10]
    moments = [
        (s_cols[:, 0] + a_cols[:, 0], s_cols[:, 1], a_cols[:, 1]),
        (s_cols[:, 0] + a_cols[:, 2], s_cols[:, 1], a_cols[:, 3]),
        (s_cols[:, 2] + a_cols[:, 4], s_cols[:, 3], a_cols[:, 5]),
        (
            s_cols[:, 4]
            + a_cols[:, 6]
            + np.where(embed, s_cols[:, 8] + a_cols[:, 11], s_cols[:, 10] + a_cols[:, 8]),
            s_cols[:, 5] + np.where(embed, s_cols[:, 9], s_cols[:, 11]),
            a_cols[:, 7] + np.where(embed, a_cols[:, 12], a_cols[:, 9]),
        ),
    ]
    # optimizer_step: per candidate, for the candidate's optimizer (not the base's: a base with optimizer
    # "none" searched over AdamW still steps); a candidate without one gets a moment that cannot win
    has_step = np.array([o != "none" for o in optimizers], dtype=bool)[c["optimizer"][cand]]
    if has_step.any() and not oib:
        step = s_cols[:, 6] + a_cols[:, 13]
        moments.append(
            (
                np.where(has_step, step, -1),
                np.where(has_step, s_cols[:, 7], 0),
                np.where(has_step, a_cols[:, 14], 0),
            )
        )

    # ----- peak, allocator pool, outside memory (engine/overhead) ---------------------------------------
    f_t, f_v = _waste_rates(ctx0)
    peak_alloc = moments[0][0].copy()
    peak_m = np.zeros(nrows, dtype=np.int64)
    pool = peak_alloc.copy()
    for k, (alloc, pers, loss) in enumerate(moments):
        if k:
            higher = alloc > peak_alloc  # the first moment of the largest total wins, as max() picks
            peak_m[higher] = k
            np.maximum(peak_alloc, alloc, out=peak_alloc)
        waste = np.trunc(FRAGMENTATION_PERSISTENT * pers + f_t * (alloc - pers) + f_v * loss).astype(np.int64)
        np.maximum(pool, alloc + waste, out=pool)
    comms = sum(
        (x > 1).astype(np.int64)
        for x in ((c["dp"] * c["cp"])[cand], c["tp"][cand], p, c["cp"][cand], c["ep"][cand])
    )
    outside = context_bytes(ctx0) + comms * NCCL_PER_COMMUNICATOR + s_out
    cap = gpu.memory_bytes - outside
    reserved = np.maximum(peak_alloc, np.minimum(pool, cap))
    device = reserved + outside

    row_over = x_over[x_row] | s_over[s_idx] | (pool >= SATURATION_BYTES) | (device >= SATURATION_BYTES)

    # ----- the worst rank of each candidate (first of equals, as max() picks) ---------------------------
    starts = np.flatnonzero(np.r_[True, cand[1:] != cand[:-1]])
    best = np.maximum.reduceat(device, starts)
    order = np.where(device == best[cand], np.arange(nrows), nrows)
    pick = np.minimum.reduceat(order, starts)
    over = np.maximum.reduceat(row_over.astype(np.int8), starts) > 0
    return Evaluation(
        peak_allocated_bytes=np.where(over, OVERFLOW_BYTES, peak_alloc[pick]),
        peak_reserved_bytes=np.where(over, OVERFLOW_BYTES, reserved[pick]),
        device_total_bytes=np.where(over, OVERFLOW_BYTES, device[pick]),
        peak_moment=peak_m[pick],
        worst_stage=stage[pick],
        overflow=over,
    )
