"""The engine's step timeline evaluated for many candidate layouts at once, with numpy.

Why it is exact: the engine's work splits into parts that depend on few knobs -- a rank's model states
(``model_states``: layout, ZeRO stage, optimizer, offload, its stage's layers) and one micro-batch's
activation terms (``activations``: micro-batch, tp, cp, sequence parallel, checkpointing, loss). Each
distinct part is computed once, by the engine itself, and reduced to four integer sums per group of
items (raw bytes, allocated bytes, long-lived allocated bytes, loss-buffer allocated bytes). What
``engine/step/timeline`` and ``engine/counters/overhead.reserved_item`` then do with those groups is written once, over
numbers or arrays, and called here on arrays: the state groups (``state_group_table``), the activation groups
(``activation_group_table``: the terms scaled by layers and micro-batches in flight, through ``RowScaler``),
each moment's unused-but-reserved bytes (``waste_bytes``), the reserved counter (``capped_reserved``), the bytes
outside the allocator (``outside_bytes``), the larger of two instants and the peak moment (``engine/arith``
``first_largest``, ``takes_later``) and the extra middle stage's schedule (``engine/parallel/schedule``
``first_carrying_stage``). What is the planner's own is the bookkeeping: one row per candidate stage, each distinct
part computed once, the moments of ``engine/step/moments.MOMENT_TABLE`` added by group name, and the largest pool
taken with the same integer and float operations. ``tests/plan/test_plan_vector.py`` checks every figure against
``estimate`` byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from memsim_widget.engine.activations import activations
from memsim_widget.engine.activations.budget import ActivationBudget
from memsim_widget.engine.arith import first_largest
from memsim_widget.engine.context import (
    Context,
    Stage,
    deepspeed_casts_adapters,
    deepspeed_zero3_linear,
    uneven_held_layers,
)
from memsim_widget.engine.counters.overhead import (
    PERSISTENT_CATEGORIES,
    capped_reserved,
    communicator_count,
    context_bytes,
    outside_bytes,
    paged_items,
    reserved_cap,
    waste_bytes,
    waste_rates,
    workspace_items,
)
from memsim_widget.engine.frameworks import (
    PROFILES,
    fsdp_wraps,
    grads_kept,
    root_resharded_for_loss,
    unsynced_grads,
)
from memsim_widget.engine.items import Item, allocated_of
from memsim_widget.engine.parallel.schedule import (
    first_carrying_stage,
    grads_carried,
    in_flight,
    pipeline_carries_grads,
)
from memsim_widget.engine.states import model_states
from memsim_widget.engine.step.lazy_items import ItemGroup, Label
from memsim_widget.engine.step.moments import (
    ACTIVATION_GROUPS,
    MOMENT_TABLE,
    MOMENTS,
    OPTIMIZER_STEPS,
    STATE_GROUPS,
)
from memsim_widget.engine.step.timeline import (
    ActivationKnobs,
    StageCounts,
    activation_group_table,
    budget_list,
    scaled_term,
    state_group_table,
    state_lists,
)
from memsim_widget.precision import PRECISIONS
from memsim_widget.rules import available_impl
from memsim_widget.rules.pipeline_split import chunk_layers, rank_layers
from memsim_widget.scenario import Scenario

#: The knobs a candidate may set, as integer-coded columns (strings index the tuples below).
CHECKPOINTING = ("none", "selective", "full", "selective-op")
#: Codes whose layers keep only ``checkpointed_layer`` and recompute in backward (every layer checkpointed).
CKPT_CODES = (2, 3)
LOSSES = ("standard", "chunked")
OFFLOADS = ("none", "optimizer", "optimizer+params")
#: ``dp_shard``: hybrid sharding's shard degree within dp (``ParallelConfig.dp_shard``; 0: unset, shard over all dp).
#: The search leaves it 0 (HSDP never lowers memory per GPU, and the time model does not price its node-local
#: collectives); it carries a scenario's own (``scenario_columns``, ``gpu_scaling``).
COLUMNS = ("dp", "tp", "pp", "cp", "ep", "zero", "sp", "micro_batch", "grad_accum", "pp_microbatches",
           "checkpointing", "loss", "optimizer", "offload", "dp_shard")  # fmt: skip

#: Group statistics, the columns of every (keys, NSTAT) sum array: raw bytes, allocated bytes, long-lived
#: allocated bytes (engine/counters/overhead ``PERSISTENT_CATEGORIES``), loss-buffer allocated bytes.
RAW, ALLOC, LONG, LOSS = range(4)
NSTAT = 4
STAT_NAMES = ("raw", "alloc", "long", "loss")
#: The statistics each side carries into its per-row columns: model-state items are never loss buffers and
#: activation terms are never long-lived, so each side leaves out the one it never has.
SIDE_STATS = {"states": (ALLOC, LONG), "activations": (ALLOC, LOSS)}

#: Byte figures are exact int64 below this bound (32 PiB; a custom card holds at most 1 PiB,
#: catalog/gpus.MAX_MEMORY_GIB). A term, group or moment that reaches it is clipped to it, so no sum of them
#: wraps around 2**63, and its candidate is marked ``overflow``: figures ``OVERFLOW_BYTES``, never fitting.
SATURATION_BYTES = 2**55
#: The figures reported for a candidate marked ``overflow`` (more than ``SATURATION_BYTES`` per GPU).
OVERFLOW_BYTES = np.iinfo(np.int64).max
#: Tensors per term beyond which a term is treated as saturated too (keeps 512 B rounding per tensor small).
MAX_TENSORS = 2**40


def _item_stats(items: Sequence[Item]) -> tuple[int, int, int, int]:
    """The four sums of a list of engine items, as the engine's ``ItemGroup`` adds them (the long-lived bytes:
    those the fitted pool counts so, ``PERSISTENT_CATEGORIES``), each clipped to ``SATURATION_BYTES``."""
    group = ItemGroup(items)
    alloc, persistent, _ = group.pool_sums(PERSISTENT_CATEGORIES, set())
    return (
        min(group.raw, SATURATION_BYTES),
        min(alloc, SATURATION_BYTES),
        min(persistent, SATURATION_BYTES),
        0,
    )


# ----- model states: one engine call per distinct (layout, ZeRO, optimizer, offload, stage) ----------------
#: The ``StateBudget`` lists a state row reduces to sums (``step_temps``: the tensor-level ones).
STATE_LISTS = ("persistent", "grads", "post_grads", "grads_but_bottom", "gathered", "gathered_loss", "gathered_grads",
               "step_temps_all", "step_temps", "step_temps_sub", "kept_unsharded", "kept_unsharded_last", "root_reduce",
               "grads_but_root", "root_regather", "root_reduce_out", "root_made", "loss_grads", "step_grads", "kept_after_backward",
               "grads_but_bottom_carried", "gathered_next", "prefetched", "new_grad", "new_grad_next",
               "chunk_gathered", "tied_sum", "head_made", "head_made_carried", "tied_head_part", "bottom_new",
               "bottom_new_carried", "top_layer_made", "top_down_new", "top_down_made")  # fmt: skip
#: The columns of a state key: the layout, ZeRO stage, optimizer, offload, pipeline position, the stage's layers
#: where the split is uneven (0: even, num_layers / pp), and whether gradients are carried between
#: micro-batches (engine/step/timeline ``grads_carried``); "unsynced": more than one micro-batch under a loop whose
#: FSDP2 keeps the unsharded gradients (``frameworks.fsdp2_unsynced_grads``, the one bit of ``grad_accum_steps``
#: the states read; the engine decides from it whether the rank is such an FSDP2 rank).
STATE_KEY = (
    "tp",
    "ep",
    "dp",
    "cp",
    "dp_shard",
    "zero",
    "optimizer",
    "offload",
    "pp",
    "first",
    "last",
    "layers",
    "unsynced",
    "carried",
)


@dataclass(frozen=True)
class StateRow:
    """Group sums of one rank's model states, plus bytes held outside the allocator (paged states)."""

    stats: np.ndarray  # (len(STATE_LISTS), NSTAT)
    outside: int


@lru_cache(maxsize=65536)
def state_row(scenario: Scenario, layers: int, first: bool, last: bool) -> StateRow:
    """``model_states`` of a rank holding ``layers`` layers (first/last stage), reduced to group sums."""
    ctx = Context(scenario)
    st = model_states(ctx, Stage(0, scenario.parallel.pp, layers, first, last))
    lists = state_lists(st)
    groups = [lists[name] for name in STATE_LISTS]
    stats = np.array([_item_stats(g) for g in groups], dtype=np.int64)
    outside = min(sum(i.bytes for i in paged_items(st.persistent)), SATURATION_BYTES)
    return StateRow(stats, outside)


@dataclass(frozen=True)
class StatePart:
    """A ``StateRow`` of one state key (without "carried"), and whether the root is resharded for the loss
    (engine/step/timeline: no gathered units while the loss runs)."""

    stats: np.ndarray
    outside: int
    resharded: bool


@lru_cache(maxsize=64)
def state_parts(
    base: Scenario, optimizers: tuple[str, ...], num_layers: int
) -> dict[tuple[int, ...], StatePart]:
    """The ``StatePart`` of each state key seen so far on ``base`` (filled by ``_state_side``), so that a
    search repeated on the same base builds no scenario for a key it has met."""
    return {}


def _state_part(base: Scenario, optimizers: tuple[str, ...], num_layers: int, k: list[int]) -> StatePart:
    """The ``StatePart`` of the state key ``k`` (``STATE_KEY`` without "carried")."""
    tp, ep, sdp, scp, sds, z, o, off, pk, fk, lk, nl, un = k
    sc = candidate_scenario(base, optimizers, {
        "dp": sdp, "tp": tp, "pp": pk, "cp": scp, "dp_shard": sds, "ep": ep, "zero": z, "sp": 0, "micro_batch": 1,
        "grad_accum": 2 if un else 1, "pp_microbatches": max(pk, 1), "checkpointing": 0, "loss": 0, "optimizer": o,
        "offload": off}, validate=False)  # fmt: skip
    row = state_row(sc, nl or num_layers // pk, bool(fk), bool(lk))
    return StatePart(row.stats, row.outside, root_resharded_for_loss(sc, bool(lk)))


def _state_side(
    base: Scenario, optimizers: tuple[str, ...], skey: np.ndarray, num_layers: int, ws: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The state groups of ``moments.STATE_GROUPS`` per distinct state key (``STATE_KEY``), and the bytes
    held outside the allocator."""
    key = {name: skey[:, j] for j, name in enumerate(STATE_KEY)}
    k10, inv = unique_codes([key[name] for name in STATE_KEY if name != "carried"])
    memo = state_parts(base, optimizers, num_layers)
    parts = []
    for k in k10.tolist():
        part = memo.get(tuple(k))
        if part is None:
            part = memo[tuple(k)] = _state_part(base, optimizers, num_layers, k)
        parts.append(part)
    stats = (
        np.stack([part.stats for part in parts])
        if parts
        else np.zeros((0, len(STATE_LISTS), NSTAT), np.int64)
    )
    outside = np.array([part.outside for part in parts], dtype=np.int64)
    resharded = np.array([part.resharded for part in parts], dtype=bool)
    g = {name: stats[inv, j] for j, name in enumerate(STATE_LISTS)}
    # 2: at the loss only loss_grads (engine/step/timeline state_group_table)
    carried = key["carried"][:, None]
    last = (key["last"] == 1)[:, None]
    overhead = np.broadcast_to(ws[None, :], g["persistent"].shape)
    in_backward = base.optimizer_in_backward
    groups = state_group_table(g, overhead, carried, last, resharded[inv][:, None], in_backward, 0)
    return groups, outside[inv]


# ----- activations: one engine call per distinct (micro-batch, tp, cp, sp, checkpointing, loss) -----------
TERM_GROUPS = ("per_layer", "checkpointed_layer", "cache_per_layer", "pre", "post", "loss_forward",
               "loss_saved", "loss_backward", "layer_backward", "top_backward", "attention_backward",
               "inputs", "output_logits", "output_cache", "output_cache_extra", "recomputed_layer",
               "pp_buffer", "pp_output", "pp_logits", "bottom_backward", "logits_grad", "cache_tangent_layer",
               "kept_backward", "kept_top_backward", "bottom_layer_backward", "forward_top",
               "mlp_out_backward")  # fmt: skip
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
    """Per-candidate figures, equal to ``estimate(candidate_scenario(...))``'s headline (per counter the
    worst stage; the peak moment and worst stage those of the largest device total)."""

    peak_allocated_bytes: np.ndarray
    peak_reserved_bytes: np.ndarray
    device_total_bytes: np.ndarray
    peak_moment: np.ndarray  # index into moments.MOMENTS
    worst_stage: np.ndarray
    #: Candidates where some term or sum reached ``SATURATION_BYTES`` (they need tens of PiB per GPU, more
    #: than any card): figures reported as ``OVERFLOW_BYTES``, peak moment and worst stage not meaningful;
    #: ``estimate`` of the candidate gives the exact figures.
    overflow: np.ndarray
    #: Where the reserved counter is replayed: candidates whose replay on the card runs out of memory
    #: (``Estimate.card_replay``; they never fit, whatever the headroom). All False under the fitted rule.
    oom: np.ndarray

    @property
    def peak_phase(self) -> np.ndarray:
        return np.array(MOMENTS, dtype=object)[self.peak_moment]

    def fits(self, limit: float) -> np.ndarray:
        """``Estimate.fits`` per candidate: the device total within ``limit`` (the card less the headroom),
        not overflowing, and under the replay not out of memory on the card."""
        return fits_mask(self.device_total_bytes, self.overflow, self.oom, limit)


def fits_mask(device: np.ndarray, overflow: np.ndarray, oom: np.ndarray, limit: float) -> np.ndarray:
    """``Estimate.fits`` on columns (``Evaluation.fits``; a plan's columns hold the same three)."""
    return (device <= limit) & ~overflow & ~oom


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
        "dp_shard": par.dp_shard or 0,
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
        "dp_shard": int(row["dp_shard"]) or None if "dp_shard" in row else None,
        "pp_layers": None,  # the split of base.parallel.pp_split (rules/pipeline_split)
    }
    if not validate:
        return replace_unchecked(base, parallel=replace_unchecked(base.parallel, **par), **keys)
    return base.replace(parallel=par, **keys)


#: Largest column value (and packed code) counted with a table of that many slots instead of a sort.
DENSE_LIMIT = 1 << 22


def _column_ranks(col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of a non-negative column (ascending) and each row's rank among them: a table of
    seen values where the values are small (no sort), else ``np.unique``."""
    top = int(col.max())
    if top >= DENSE_LIMIT:
        values, ranks = np.unique(col, return_inverse=True)
        return values, ranks.reshape(-1)
    seen = np.zeros(top + 1, dtype=bool)
    seen[col] = True
    return np.flatnonzero(seen), (np.cumsum(seen) - 1)[col]


def unique_codes(cols: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of non-negative integer columns as a (distinct, columns) array in lexicographic order,
    and each row's distinct index. Each column is replaced by its rank among its distinct values (order kept),
    the ranks packed into one int64 with as many bits per column as its largest rank needs (most significant
    first) and the codes made distinct like the columns (a table where they are small, else a sort); rows too
    wide for 63 bits go through ``np.unique`` on the stacked rows (slower, same answer)."""
    n = cols[0].shape[0] if cols else 0
    if n == 0:
        return np.zeros((0, len(cols)), dtype=np.int64), np.zeros(0, dtype=np.int64)
    cols = [np.asarray(col, dtype=np.int64) for col in cols]
    if any(int(col.min()) < 0 for col in cols):
        raise ValueError("planner key columns must be non-negative")
    ranked = [_column_ranks(col) for col in cols]
    bits = [max(1, (values.shape[0] - 1).bit_length()) for values, _ in ranked]
    if sum(bits) > 63:
        uniq, inverse = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
        return uniq, inverse.reshape(-1)
    code = np.zeros(n, dtype=np.int64)
    for (_, ranks), nb in zip(ranked, bits, strict=True):
        code = (code << nb) | ranks
    uniq, inverse = _column_ranks(code)
    out = np.zeros((uniq.shape[0], len(bits)), dtype=np.int64)
    rest = uniq.copy()
    for j in range(len(bits) - 1, -1, -1):
        out[:, j] = ranked[j][0][rest & ((1 << bits[j]) - 1)]
        rest >>= bits[j]
    return out, inverse


def _padded(tables: list[np.ndarray]) -> np.ndarray:
    """Term tables of several keys stacked as (keys, max terms, TERM_COLS), padded with zero terms."""
    lengths = np.array([t.shape[0] for t in tables], dtype=np.int64)
    width = int(lengths.max()) if lengths.shape[0] else 0
    out = np.zeros((len(tables), max(width, 1), TERM_COLS), dtype=np.float64)
    if lengths.sum() == 0:
        return out
    rows = np.repeat(np.arange(len(tables)), lengths)
    slots = np.arange(rows.shape[0]) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[rows, slots] = np.concatenate(tables)
    return out


def _row_sums(a: np.ndarray) -> np.ndarray:
    """The sum (integers) or any (booleans) of each row of a (rows, terms) array, column by column (exact;
    cheaper than a reduction along short rows)."""
    out = a[:, 0].copy()
    for j in range(1, a.shape[1]):
        out += a[:, j]
    return out


def _scaled_rows(table: np.ndarray, factor: np.ndarray, first: np.ndarray) -> np.ndarray:
    """``engine/step/timeline.scaled_term`` summed, where each row has its own term table: ``table`` is (rows,
    terms, TERM_COLS) and each row its own factor and ``first``. A row
    whose bytes reach ``SATURATION_BYTES`` has every statistic set to it (so the overflow shows in any sum
    it enters)."""
    n = factor.shape[0]
    out = np.zeros((n, NSTAT), dtype=np.int64)
    if n == 0:
        return out
    f = factor[:, None]
    tb, fb, skip, tens, counted, loss = (table[:, :, j] for j in range(TERM_COLS))
    fbytes, ftensors = scaled_term(tb, fb, skip > 0, tens, f, first[:, None])
    fbytes, ftensors = np.trunc(fbytes), np.trunc(ftensors)
    big = (fbytes >= SATURATION_BYTES) | (ftensors >= MAX_TENSORS)
    nbytes = np.where(big, 0, fbytes).astype(np.int64)
    tensors = np.maximum(1, np.where(big, 1, ftensors)).astype(np.int64)
    alloc = np.where((counted > 0) & (nbytes > 0), allocated_of(nbytes, tensors), 0)
    live = f > 0
    big &= live
    out[:, RAW] = _row_sums(np.where(live, nbytes, 0))
    out[:, ALLOC] = _row_sums(np.where(live, alloc, 0))
    out[:, LOSS] = _row_sums(np.where(live & (loss > 0), alloc, 0))
    # each term below the bound (allocated: at most 512 B per tensor more), a few dozen terms: no sum wraps
    over = _row_sums(big) | (out[:, RAW] >= SATURATION_BYTES) | (out[:, ALLOC] >= SATURATION_BYTES)
    out[over] = SATURATION_BYTES
    return out


#: Term-table width from which ``_scaled_distinct`` computes each distinct (key, factor, first) once.
DISTINCT_WIDTH = 4


def _scaled_distinct(table: np.ndarray, key: np.ndarray, factor: np.ndarray, first: np.ndarray) -> np.ndarray:
    """``_scaled_rows(table[key], factor, first)``, computed once per distinct (key, factor, first) where the
    tables are wide (rows are independent, so the result is the same; the rows share a few dozen factors)."""
    if table.shape[1] < DISTINCT_WIDTH or key.shape[0] == 0:
        return _scaled_rows(table[key], factor, first)
    fac, fac_idx = np.unique(factor, return_inverse=True)
    fst, fst_idx = np.unique(first, return_inverse=True)
    distinct, inverse = unique_codes([key, fac_idx.reshape(-1), fst_idx.reshape(-1)])
    out = _scaled_rows(table[distinct[:, 0]], fac[distinct[:, 1]], fst[distinct[:, 2]])
    return out[inverse]


def _stage_rows(
    pp: np.ndarray, mb: np.ndarray, schedule: str, v: int, uneven: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(candidate, stage, slot) of the stages that can be a candidate's worst rank: the first, the second, the
    first middle stage that carries gradients (fewer micro-batches in flight than there are, so an earlier
    one already ran backward: engine/step/timeline ``grads_carried``) and the last. Middle stages of an even split
    hold the same states and no more micro-batches in flight than a lower one, so within each group
    (carrying or not) the lowest is the worst; ties go to the lower stage, as ``max`` does. An ``uneven``
    split (``rules/pipeline_split``) has a row for every stage: its middle stages differ in layers. A row's
    slot (its place among its candidate's rows) and the candidate's pp and micro-batches give its stage."""
    carry = _first_carrying_stage(pp, mb, schedule, v)
    extra = (carry > 1) & (carry < pp - 1)
    k = np.where(uneven, pp, np.minimum(pp, 3) + extra)
    cand = np.repeat(np.arange(pp.shape[0]), k)
    starts = np.concatenate(([0], np.cumsum(k)[:-1]))
    j = np.arange(cand.shape[0]) - starts[cand]
    p, x = pp[cand], extra[cand]
    stage = np.where(uneven[cand], j, np.where(j < 2, j, np.where(x & (j == 2), carry[cand], p - 1)))
    return cand, stage, j


def _distinct(col: np.ndarray) -> list[int]:
    """The distinct values of a small non-negative column, ascending (a count per value, no sort)."""
    return np.flatnonzero(np.bincount(col.ravel())).tolist() if col.size else []


def uneven_split(base: Scenario, num_layers: int, pp: np.ndarray) -> np.ndarray:
    """Which pipeline degrees give ``base``'s pipeline an uneven split (``rules/pipeline_split``)."""
    par = base.parallel
    values = _distinct(pp)
    flags = np.zeros(max(values, default=0) + 1, dtype=bool)
    for p in values:
        flags[p] = len(set(_chunks(num_layers, p, par.virtual_stages, par.pp_split))) > 1
    return flags[pp]


@lru_cache(maxsize=4096)
def _chunks(num_layers: int, pp: int, v: int, pp_split: str | None) -> tuple[int, ...]:
    """``rules/pipeline_split.chunk_layers`` of a planner candidate (never a listed split)."""
    return chunk_layers(num_layers, pp, v if pp > 1 else 1, pp_split if pp > 1 else None)


def stage_layers(base: Scenario, num_layers: int, pp: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """The layers of each row's stage (engine/context ``Context.stages``): ``num_layers / pp`` where the split
    is even, the split's own counts where it is not."""
    out = num_layers // pp
    uneven = uneven_split(base, num_layers, pp)
    if not uneven.any():
        return out
    par = base.parallel
    values = _distinct(pp[uneven])
    row = np.zeros(values[-1] + 1, dtype=np.int64)
    table = np.zeros((len(values), values[-1]), dtype=np.int64)
    for i, p in enumerate(values):
        row[p] = i
        table[i, :p] = rank_layers(_chunks(num_layers, p, par.virtual_stages, par.pp_split), p)
    return np.where(uneven, table[row[np.where(uneven, pp, values[0])], np.where(uneven, stage, 0)], out)


def _held_layers(
    base: Scenario, num_layers: int, xp: np.ndarray, xm: np.ndarray, xstage: np.ndarray, layers: np.ndarray,
    f: np.ndarray, at_loss: bool = False,
) -> np.ndarray:  # fmt: skip
    """Layer x micro-batch activation sets per row (engine/context ``Context.held_layers``, ``at_loss``): the
    stage's layers times its micro-batches in flight, but where ``uneven_held_layers`` says otherwise (looked at
    once per distinct (pp, micro-batches, stage) of an uneven split)."""
    held = layers * f
    par = base.parallel
    rows = np.flatnonzero(uneven_split(base, num_layers, xp))
    if not rows.size:
        return held
    keys, inverse = unique_codes([xp[rows], xm[rows], xstage[rows]])
    found = [
        uneven_held_layers(par.pp_schedule, p, m, s, _chunks(num_layers, p, par.virtual_stages, par.pp_split),
                           at_loss)
        for p, m, s in keys.tolist()
    ]  # fmt: skip
    values = np.array([np.nan if x is None else x for x in found])[inverse]
    at = ~np.isnan(values)
    held[rows[at]] = values[at]
    return held


def _first_carrying_stage(pp: np.ndarray, mb: np.ndarray, schedule: str, v: int) -> np.ndarray:
    """The lowest stage >= 1 whose micro-batches in flight are fewer than ``mb`` (-1 where none is):
    engine/parallel/schedule ``first_carrying_stage``, asked once per distinct (pp, micro-batches) pair."""
    if not pp.size:
        return np.full(pp.shape, -1, dtype=np.int64)
    pairs, inverse = unique_codes([pp, mb])
    return first_carrying_stage(pairs[:, 0], pairs[:, 1], schedule, v)[inverse]


def _act_rows(base: Scenario, akey: np.ndarray) -> list[ActRow]:
    """The activation terms of each distinct (micro-batch, tp, cp, sp, checkpointing, loss[, EP factor taken
    from the TP group[, FSDP on[, a DeepSpeed ZeRO-3 rank's activations]]]) key: an expert's width depends on
    ``ParallelConfig.expert_tp``, which an ``ep`` of that factor times the data-parallel ranks reproduces; whether
    FSDP is on decides torchtitan's compute dtype under TP (engine/frameworks ``no_mixed_precision``), reproduced
    by dp = 2 with ZeRO-3; ZeRO-3 leaves DeepSpeed's LoRA adapters in peft's dtype
    (``context.deepspeed_casts_adapters``) and has every Linear keep its input (``context.deepspeed_zero3_linear``),
    reproduced by ZeRO-3 on dp = 1 (no FSDP wrap)."""
    arows = []
    for row in akey.tolist():
        b, tp, cp, sp, ck, lo = row[:6]
        over = row[6] if len(row) > 6 else 1
        dp, zero = (2, 3) if len(row) > 7 and row[7] else (1, 3 if len(row) > 8 and row[8] else 0)
        sc = replace_unchecked(
            base,
            micro_batch_size=b,
            activation_checkpointing=CHECKPOINTING[ck],
            checkpoint_every=None,
            loss=LOSSES[lo],
            parallel=replace_unchecked(base.parallel, dp=dp, tp=tp, pp=1, cp=cp,
                                ep=over * dp * cp if over > 1 else 1, zero=zero, offload="none",
                                sequence_parallel=bool(sp), pp_microbatches=1, pp_layers=None),
        )  # fmt: skip
        arows.append(act_row(sc))
    return arows


def _term_tables(akey: np.ndarray, arows: list[ActRow]) -> dict[str, np.ndarray]:
    """Each term group's tables of every activation key, padded to one array, and those of the ``Scaler`` names
    ``kept`` and ``recompute`` (``engine/step/timeline.budget_list``)."""
    T = {g: _padded([ar.tables[g] for ar in arows]) for g in TERM_GROUPS}
    for name in ("kept", "recompute"):
        T[name] = _padded(
            [
                ar.tables[budget_list(name, ck in CKPT_CODES, ar.tables["recomputed_layer"].shape[0] > 0)]
                for ar, ck in zip(arows, akey[:, 4].tolist(), strict=True)
            ]
        )
    return T


@dataclass
class KeyTables:
    """The term tables of a set of activation keys (``_term_tables``), and a term group's sums repeated once
    per key (``once``: filled as the groups ask)."""

    arows: list[ActRow]  # kept, so that their ids (``ident``) stay theirs
    ident: tuple[tuple[int, ...], bytes]
    tables: dict[str, np.ndarray]
    sums: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)

    @cached_property
    def empty(self) -> frozenset[str]:
        """The term groups with no term (or only zeros) in any key: every sum of them is 0."""
        return frozenset(g for g, table in self.tables.items() if not table.any())

    def once(self, terms: str, first: int) -> np.ndarray:
        """The (keys, NSTAT) sums of ``terms`` repeated once per key, ``first`` (0 or 1) of it layer 0."""
        out = self.sums.get((terms, first))
        if out is None:
            na = self.tables[terms].shape[0]
            out = _scaled_rows(self.tables[terms], np.ones(na), np.full(na, float(first)))
            self.sums[(terms, first)] = out
        return out


#: The last ``_key_tables`` answer (a repeated search on the same keys rebuilds nothing).
KEY_TABLES: list[KeyTables] = []


def _key_tables(akey: np.ndarray, arows: list[ActRow]) -> KeyTables:
    """The ``KeyTables`` of the activation keys, remembered for the last set of activation rows."""
    ident = (tuple(id(ar) for ar in arows), akey[:, 4].tobytes())
    if KEY_TABLES and KEY_TABLES[0].ident == ident:
        return KEY_TABLES[0]
    KEY_TABLES[:] = [KeyTables(list(arows), ident, _term_tables(akey, arows))]
    return KEY_TABLES[0]


def _is_flag(x: Any) -> bool:
    """A factor (or ``first``) that is 0 or 1: a Python bool or 0/1, or a boolean column."""
    if isinstance(x, np.ndarray):
        return x.dtype == np.bool_
    return isinstance(x, bool | np.bool_) or (isinstance(x, int) and x in (0, 1))


class RowScaler:
    """The planner's ``Scaler`` (``engine/step/timeline.activation_group_table``): a term group's sums (``NSTAT``
    columns) per row, each row of activation key ``xa``. A flag factor (and flag ``first``) takes the key's
    sums repeated once (``KeyTables.once``) where it is set; any other factor scales each distinct (key,
    factor, first) once (``_scaled_distinct``). Counts come as (rows, 1) columns; labels are not read."""

    def __init__(self, tables: KeyTables, xa: np.ndarray) -> None:
        self.tables, self.xa, self.n = tables, xa, xa.shape[0]

    @property
    def none(self) -> np.ndarray:
        return np.zeros((self.n, NSTAT), dtype=np.int64)

    def __call__(self, terms: str, factor: Any, label: Label = "", first: Any = 0) -> np.ndarray:
        if terms in self.tables.empty:
            return self.none
        if _is_flag(factor) and _is_flag(first):
            if not isinstance(factor, np.ndarray) and not factor:
                return self.none
            once = self.tables.once
            if isinstance(first, np.ndarray):
                sums = np.where(first, once(terms, 1)[self.xa], once(terms, 0)[self.xa])
            else:
                sums = once(terms, int(first))[self.xa]
            return np.where(factor, sums, 0) if isinstance(factor, np.ndarray) else sums
        fac, fst = (np.broadcast_to(np.asarray(x, dtype=np.float64), (self.n, 1)).reshape(self.n)
                    for x in (factor, first))  # fmt: skip
        return _scaled_distinct(self.tables.tables[terms], self.xa, fac, fst)

    def raw(self, group: np.ndarray) -> np.ndarray:
        return group[:, RAW : RAW + 1]


def _activation_side(
    base: Scenario, num_layers: int, akey: np.ndarray, arows: list[ActRow], xkey: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The activation groups of ``moments.ACTIVATION_GROUPS`` (``engine/step/timeline.activation_group_table``) per
    distinct (activation key, pp, stage, micro-batches) row, the micro-batches in flight, and the rows where a
    term or group reached ``SATURATION_BYTES``."""
    par0 = base.parallel
    xa, xp, xstage, xm = (xkey[:, j] for j in range(4))
    layers = stage_layers(base, num_layers, xp, xstage)
    f = in_flight(xp, xm, par0.pp_schedule, par0.virtual_stages, xstage)
    held = _held_layers(base, num_layers, xp, xm, xstage, layers, f)
    held_loss = _held_layers(base, num_layers, xp, xm, xstage, layers, f, at_loss=True)
    counts = StageCounts(xp[:, None], xm[:, None], layers[:, None], f[:, None], (xstage == 0)[:, None],
                         (xstage == xp - 1)[:, None], held[:, None], held_loss[:, None], par0.pp_schedule,
                         par0.virtual_stages)  # fmt: skip
    # every layer checkpointed: the policy's (the planner sets no checkpoint_every), on a stage of layers
    ckpt = (np.isin(akey[:, 4], CKPT_CODES)[xa] & (layers > 0))[:, None]
    shared = np.array([ar.ckpt_input_shared for ar in arows], dtype=bool)[xa][:, None]
    through_step = any(ar.output_through_step for ar in arows)  # output_lifetime "step" (a base key)
    knobs = ActivationKnobs(
        ckpt, shared, base.activation_offloading, base.activation_offloading_layers, through_step
    )
    groups = activation_group_table(RowScaler(_key_tables(akey, arows), xa), counts, knobs)
    return groups, f, reaches_saturation(groups.values(), xkey.shape[0])


def reaches_saturation(parts: Iterable[np.ndarray], n: int) -> np.ndarray:
    """Per row of ``n``, whether any value of any part (arrays of ``n`` rows) reaches ``SATURATION_BYTES``:
    the parts' elementwise maximum compared once per row."""
    tops: dict[int, np.ndarray] = {}
    for part in parts:
        flat = part.reshape(n, -1)
        top = tops.get(flat.shape[1])
        tops[flat.shape[1]] = flat.copy() if top is None else np.maximum(top, flat, out=top)
    over = np.zeros(n, dtype=bool)
    for top in tops.values():
        over |= (top >= SATURATION_BYTES).any(axis=1)
    return over


def _moment_parts(groups: dict[str, np.ndarray], side: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Per key of one side, the sums ``MOMENT_TABLE`` asks of it: a moment's groups of this side
    (``name``); for a moment with alternatives, the total with each (``name/0``, ``name/1``, ...) and the raw
    bytes each later one's groups hold beyond the first's (``name:gain1``, ... one column each), which choose
    between them."""
    n = next(iter(groups.values())).shape[0]

    def total(names: tuple[str, ...]) -> np.ndarray:
        return sum((groups[g] for g in names if g in side), start=np.zeros((n, NSTAT), dtype=np.int64))

    out = {}
    for rule in MOMENT_TABLE:
        held = total(rule.live + rule.after)
        if not rule.larger_of:
            out[rule.name] = held
            continue
        alts = [total(alt) for alt in rule.larger_of]
        for j, alt in enumerate(alts):
            out[f"{rule.name}/{j}"] = held + alt
            if j:
                out[f"{rule.name}:gain{j}"] = (alt - alts[0])[:, RAW]
    return out


class SideColumns:
    """One side's moment sums per candidate row, by name (``part.stat``, ``name:gain``): each column is
    kept per key and taken per row only when a moment reads it (a contiguous 1-D take is the cheap way)."""

    def __init__(self, parts: dict[str, np.ndarray], stats: tuple[int, ...], rows: np.ndarray) -> None:
        self.columns: dict[str, np.ndarray] = {}
        for name, part in parts.items():
            if part.ndim == 1:
                self.columns[name] = part
                continue
            for stat in stats:
                self.columns[f"{name}.{STAT_NAMES[stat]}"] = np.ascontiguousarray(part[:, stat])
        self.rows = rows

    def get(self, name: str) -> np.ndarray | int:
        """The column ``name`` per row, or 0 where this side does not carry it."""
        col = self.columns.get(name)
        return 0 if col is None else col.take(self.rows)

    def choose(self, names: list[str], at: np.ndarray | int) -> np.ndarray | int:
        """Per row, the column ``names[at]`` (0 where this side carries none of them): one take from the
        columns laid end to end (a column this side lacks reads 0)."""
        cols = [self.columns.get(name) for name in names]
        present = [c for c in cols if c is not None]
        if not present:
            return 0
        n = present[0].shape[0]
        laid = np.concatenate([np.zeros(n, present[0].dtype) if c is None else c for c in cols])
        return laid.take(self.rows + at * n)


def _added(s: np.ndarray | int, a: np.ndarray | int) -> np.ndarray:
    """The sum of both sides' columns; a side without the column (0) adds nothing, so it is not copied."""
    if isinstance(s, int) and s == 0:
        return np.asarray(a)
    return np.asarray(s if isinstance(a, int) and a == 0 else s + a)


def _moment_rows(
    S: SideColumns, A: SideColumns, steps: np.ndarray | None
) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(moment index, allocated, long-lived, loss-buffer bytes) per row for each moment of ``MOMENT_TABLE``.
    ``steps`` marks the rows whose optimizer steps after backward (None: no row does)."""
    out = []
    every_step = steps is not None and bool(steps.all())
    for k, rule in enumerate(MOMENT_TABLE):
        if rule.only_if == OPTIMIZER_STEPS and steps is None:
            continue

        if rule.larger_of:  # the largest instant in raw bytes, as the engine's timeline picks it
            # (first_largest of them): the same choice among 0 and each later one less the first, the first's
            # raw bytes taken from all (exact in int64), so that each side's gain columns are taken per row
            gains = [
                _added(S.get(f"{rule.name}:gain{j}"), A.get(f"{rule.name}:gain{j}"))
                for j in range(1, len(rule.larger_of))
            ]
            at = np.asarray(first_largest([np.zeros_like(gains[0]), *gains])[1], dtype=np.int64)
            keys = [f"{rule.name}/{j}" for j in range(len(rule.larger_of))]
            sums = [
                _added(
                    S.choose([f"{k}.{name}" for k in keys], at), A.choose([f"{k}.{name}" for k in keys], at)
                )
                for name in ("alloc", "long", "loss")
            ]
        else:
            sums = [
                _added(S.get(f"{rule.name}.{name}"), A.get(f"{rule.name}.{name}"))
                for name in ("alloc", "long", "loss")
            ]
        # a row without an optimizer step gets a moment that cannot win
        if rule.only_if == OPTIMIZER_STEPS and not every_step and steps is not None:  # (None: skipped above)
            sums = [np.where(steps, sums[0], -1), np.where(steps, sums[1], 0), np.where(steps, sums[2], 0)]
        out.append((k, *sums))
    return out


#: Rows per block of ``_peak_and_pool``: a block's temporaries stay in the cache and their memory is reused.
POOL_ROWS = 1 << 15


def _peak_and_pool(
    ctx0: Context, moments: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The peak allocated bytes, its moment, and the largest allocator pool per row: each moment's allocated
    bytes and what the allocator holds unused beside them (``engine/counters/overhead.waste_bytes``, the fitted rule of
    ``reserved_item``), block by block of ``POOL_ROWS`` rows."""
    rates = waste_rates(ctx0)
    first = moments[0][1]
    order = np.array([k for k, *_ in moments], dtype=np.int64)  # the moments' indices in MOMENT_TABLE
    peak_alloc, pool = np.empty_like(first), np.empty_like(first)
    peak_m = np.empty(first.shape, dtype=np.int64)
    for start in range(0, first.shape[0], POOL_ROWS):
        rows = slice(start, start + POOL_ROWS)
        # the first moment of the largest total wins (engine/core: the same function)
        peak_alloc[rows], at = first_largest([alloc[rows] for _, alloc, _, _ in moments])
        peak_m[rows] = order[at]
        held = [peak_alloc[rows]]  # the peak allocated is a floor (engine/counters/overhead.reserved_item)
        for _, alloc, pers, loss in moments:
            a = alloc[rows]
            w = waste_bytes(a, pers[rows] if pers.ndim else pers, loss[rows] if loss.ndim else loss, rates)
            w += a
            held.append(w)
        pool[rows], _ = first_largest(held)
    return peak_alloc, peak_m, pool


def _state_key(
    c: dict[str, np.ndarray], cand: np.ndarray, first: np.ndarray, last: np.ndarray, layers: np.ndarray,
    unsynced: np.ndarray, carried: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The distinct ``STATE_KEY`` rows (lexicographic) and each row's index among them. ZeRO-0 states see dp
    only through "dp > 1" (DDP buckets); ZeRO >= 1 only through dp * cp (with ep > 1 and ZeRO-0 the key keeps
    dp and cp as they are: ep must divide dp * cp). The layout columns lead the key and are the candidate's,
    so they are made distinct per candidate first and the rows add only their stage columns."""
    zero, ds = c["zero"], c["dp_shard"]
    plain = (zero == 0) & (c["ep"] == 1)
    layout = {
        "tp": c["tp"],
        "ep": c["ep"],
        "dp": np.where(plain, np.minimum(c["dp"], 2), np.where(zero == 0, c["dp"], c["dp"] * c["cp"])),
        "cp": np.where((zero == 0) & ~plain, c["cp"], 1),
        # hybrid sharding under ZeRO >= 1: the shard group (dp_shard x cp) within dp x cp; 0 where all dp shards
        "dp_shard": np.where((zero == 0) | (ds == 0) | (ds == c["dp"]), 0, ds * c["cp"]),
        "zero": zero,
        "optimizer": c["optimizer"],
        "offload": c["offload"],
        "pp": c["pp"],
    }
    lkey, l_cand = unique_codes([layout[name] for name in STATE_KEY[:9]])
    rkey, r_row = _row_codes(l_cand, cand, [(first, 2), (last, 2), (layers, int(layers.max(initial=0)) + 1),
                                            (unsynced[cand], 2), (carried, 3)])  # fmt: skip
    return np.concatenate([lkey[rkey[:, 0]], rkey[:, 1:]], axis=1), r_row


def _row_codes(
    per_cand: np.ndarray, cand: np.ndarray, small: list[tuple[np.ndarray, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (candidate code, small columns...) rows (lexicographic) and each row's index among them: the
    candidate's code and the row's small columns (each below its radix) packed as one mixed-radix integer."""
    code = per_cand[cand]
    for col, radix in small:
        code = code * radix + col
    uniq, inverse = _column_ranks(code)
    out = np.zeros((uniq.shape[0], 1 + len(small)), dtype=np.int64)
    for j in range(len(small), 0, -1):
        radix = small[j - 1][1]
        out[:, j] = uniq % radix
        uniq = uniq // radix
    out[:, 0] = uniq
    return out, inverse


def evaluate(base: Scenario, cols: Mapping[str, np.ndarray], optimizers: Sequence[str]) -> Evaluation:
    """Evaluate every candidate (one per index of the ``COLUMNS`` arrays) on ``base``'s other keys."""
    c = {k: np.asarray(cols[k], dtype=np.int64) for k in COLUMNS if k != "dp_shard"}
    c["dp_shard"] = (
        np.asarray(cols["dp_shard"], dtype=np.int64) if "dp_shard" in cols else np.zeros_like(c["dp"])
    )
    ctx0 = Context(base.replace(parallel={"dp": 1, "dp_shard": None, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero": 0,
                                          "offload": "none", "sequence_parallel": False, "pp_layers": None}))  # fmt: skip
    arch = ctx0.arch
    par0 = base.parallel

    # ----- activation terms per distinct (micro-batch, tp, cp, sp, checkpointing, loss) -----------------
    # the EP factor taken from the TP group (ParallelConfig.expert_tp): it sets an expert's width
    over = c["ep"] // np.gcd(c["ep"], c["dp"] * c["cp"])
    # FSDP on, where it decides the compute dtype (torchtitan's amp recipe under TP: no_mixed_precision)
    titan_amp = PROFILES[base.framework].fsdp_mixed_precision and PRECISIONS[base.precision].autocast
    fsdp = fsdp_wraps(c["zero"], c["dp"], c["cp"])
    fsdp_on = (fsdp & (c["tp"] > 1)).astype(np.int64) if titan_amp else np.zeros_like(over)
    # ZeRO-3, where DeepSpeed would cast the LoRA adapters at ZeRO 0-2 (context.deepspeed_casts_adapters): its
    # zero.Init model is not cast, so the adapters keep peft's dtype; and its linear keeps every Linear's input
    # (context.deepspeed_zero3_linear)
    zero3_differs = deepspeed_casts_adapters(
        replace_unchecked(base, parallel=replace_unchecked(par0, zero=0))
    ) or deepspeed_zero3_linear(replace_unchecked(base, parallel=replace_unchecked(par0, zero=3)))
    zero3 = (c["zero"] >= 3).astype(np.int64) if zero3_differs else np.zeros_like(over)
    akey, a_cand = unique_codes(
        [c["micro_batch"], c["tp"], c["cp"], c["sp"], c["checkpointing"], c["loss"], over, fsdp_on, zero3]
    )
    arows = _act_rows(base, akey)

    # ----- one row per (candidate, stage that can be the worst) -----------------------------------------
    uneven = uneven_split(base, arch.num_layers, c["pp"])
    cand, stage, slot = _stage_rows(
        c["pp"], c["pp_microbatches"], par0.pp_schedule, par0.virtual_stages, uneven
    )
    p = c["pp"][cand]
    last = stage == p - 1
    first = stage == 0
    # an uneven split's stage layers (0 where the split is even: num_layers / pp, known from pp)
    layers = np.where(uneven[cand], stage_layers(base, arch.num_layers, p, stage), 0)

    # ----- activation side per distinct (activation key, pp, stage, micro-batches) ----------------------
    ckey, c_x = unique_codes([a_cand, c["pp"], c["pp_microbatches"]])
    xrows, x_row = _row_codes(c_x, cand, [(slot, int(slot.max(initial=0)) + 1)])
    xstage = np.zeros(xrows.shape[0], dtype=np.int64)
    xstage[x_row] = stage
    xkey = np.stack([ckey[xrows[:, 0], 0], ckey[xrows[:, 0], 1], xstage, ckey[xrows[:, 0], 2]], axis=1)
    A, f, x_over = _activation_side(base, arch.num_layers, akey, arows, xkey)
    a_parts = _moment_parts(A, ACTIVATION_GROUPS)
    x_over |= reaches_saturation(a_parts.values(), x_over.shape[0])

    # ----- model states per distinct (layout, ZeRO, optimizer, offload, stage) ---------------------------
    # per stage key: a pipeline stage with fewer micro-batches in flight than there are
    short = pipeline_carries_grads(xkey[:, 1], xkey[:, 3], f)
    kept = grads_kept(base)
    carried = grads_carried(c["grad_accum"][cand], short[x_row], base.optimizer_in_backward, kept)
    if (
        par0.pp_schedule == "interleaved" and not kept
    ):  # engine/context interleaved_loss_grad_chunks: one round, m < 2 pp
        one_round = (xkey[:, 3] < 2 * xkey[:, 1]) & (xkey[:, 2] == xkey[:, 1] - 1)
        carried = np.where(
            carried & (c["grad_accum"] == 1)[cand] & one_round[x_row], 2, carried.astype(np.int64)
        )
    # FSDP2 keeping its unsharded gradients over the micro-batches (HF no_sync): a state row of its own
    unsynced = np.broadcast_to(
        unsynced_grads(base.framework, base.optimizer_in_backward, c["grad_accum"], c["zero"], c["dp"], c["cp"],
                       c["pp"], c["offload"] == OFFLOADS.index("optimizer+params")),
        c["dp"].shape,
    ).astype(np.int64)  # fmt: skip
    skey, s_idx = _state_key(c, cand, first, last, layers, unsynced, carried)
    ws = np.array(_item_stats(workspace_items(ctx0)), dtype=np.int64)
    S, s_out = _state_side(base, tuple(optimizers), skey, arch.num_layers, ws)
    s_parts = _moment_parts(S, STATE_GROUPS)
    s_over = s_out >= SATURATION_BYTES
    s_over |= reaches_saturation((*S.values(), *s_parts.values()), s_over.shape[0])

    # ----- the moments (engine/step/moments.MOMENT_TABLE): (allocated, long-lived, loss buffers) per moment ---
    # optimizer_step: per candidate, for the candidate's optimizer (not the base's: a base with optimizer
    # "none" searched over AdamW still steps)
    has_step = np.array([o != "none" for o in optimizers], dtype=bool)[c["optimizer"][cand]]
    steps = has_step if has_step.any() and not base.optimizer_in_backward else None
    moments = _moment_rows(
        SideColumns(s_parts, SIDE_STATS["states"], s_idx),
        SideColumns(a_parts, SIDE_STATS["activations"], x_row),
        steps,
    )

    # ----- peak, allocator pool, outside memory (engine/counters/overhead) ---------------------------------------
    peak_alloc, peak_m, pool = _peak_and_pool(ctx0, moments)
    # one NCCL communicator per parallel dimension above 1 (engine/counters/overhead.device_items)
    comms = communicator_count(
        c["dp"], c["tp"], c["pp"], c["cp"], c["ep"], np.where(c["zero"] > 0, c["dp_shard"], 0)
    )[cand]
    outside = outside_bytes(context_bytes(ctx0), comms, s_out[s_idx])
    cap = reserved_cap(ctx0, outside)
    oom = np.zeros(cand.shape[0], dtype=bool)
    if base.objective_name == "sft":  # the engine's replay of the step's allocation stream, per shape
        pool, oom = _replayed_pools(base, optimizers, c, cand, stage, s_idx, x_row, pool, cap, peak_alloc)
    reserved = capped_reserved(peak_alloc, pool, cap)
    device = reserved + outside
    row_over = x_over[x_row] | s_over[s_idx] | (pool >= SATURATION_BYTES) | (device >= SATURATION_BYTES)
    return _worst_ranks(cand, stage, peak_alloc, reserved, device, peak_m, row_over, oom)


def _replayed_pools(
    base: Scenario, optimizers: Sequence[str], c: dict[str, np.ndarray], cand: np.ndarray, stage: np.ndarray,
    s_idx: np.ndarray, x_row: np.ndarray, pool: np.ndarray, cap: np.ndarray, peak_alloc: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``pool`` with, on the rows whose candidate ``engine/counters/replayable.replayable`` accepts, the peak
    reserved of ``pool_replay`` for the row's candidate and stage, and per row whether ``card_runs`` on the
    row's room ``cap`` (the card less what lives outside the allocator) runs out of memory: the functions the
    engine calls, once per distinct (state key, activation key) pair (the replay's own cache is keyed by the
    scenario's shape), and once per distinct room among the pair's rows (not on a room the unlimited replay never
    outgrew: ``card_replay.runs_as_replayed``); where the stream's requested bytes alone exceed every room of the pair
    (``alloc_stream.stream_asks``, read only where a row's peak allocated is over the pair's smallest room: the
    requested bytes are at most the allocated ones), neither is replayed; and where the peak
    allocated alone exceeds every room of the pair no stream is built: reserved is then the peak allocated whatever
    the pool (``capped_reserved``: at least the peak allocated, the pool capped by the room) and the device total
    is over the card, so the row does not fit whatever a replay would say (``fits_mask``). Only one-GPU rows
    (any accumulation), FSDP2 rows without other parallelism (``replayable.fsdp2_replayable``), DDP rows (zero
    0, no other parallelism: ``replayable.ddp_replayable``), ZeRO-1/2 rows (no other parallelism:
    ``replayable.zero12_replayable``), TP rows alone or under FSDP2 (``tp_stream.tp_replayable``) and pipeline
    rows without other parallelism (``pp_stream.pp_replayable``) can be accepted: the others are not looked at."""
    from memsim_widget.engine.counters.alloc_stream import pool_replay, stream_asks
    from memsim_widget.engine.counters.card_replay import card_runs, runs_as_replayed
    from memsim_widget.engine.counters.replayable import replayable
    from memsim_widget.engine.frameworks import allocator_conf
    from memsim_widget.engine.rl import objectives

    oom = np.zeros(pool.shape[0], dtype=bool)
    if not base.replays_reserved:  # the fitted rule: no candidate asks for the replay
        return pool, oom
    one = c["dp"] * c["tp"] * c["pp"] * c["cp"] * c["ep"] == 1
    alone = c["tp"] * c["pp"] * c["cp"] * c["ep"] == 1
    fsdp = (c["dp"] > 1) & (c["zero"] >= 3) & alone
    ddp = (c["dp"] > 1) & ((c["zero"] == 0) | (c["zero"] == 1) | (c["zero"] == 2)) & alone  # DDP, ZeRO-1/2
    tp = (c["tp"] > 1) & (c["pp"] * c["cp"] * c["ep"] == 1)
    pipe = (c["pp"] > 1) & (c["dp"] * c["tp"] * c["cp"] * c["ep"] == 1)
    rows = np.flatnonzero((one | fsdp | ddp | tp | pipe)[cand])
    if not rows.size:
        return pool, oom
    pair = s_idx[rows].astype(np.int64) * (int(x_row.max()) + 1) + x_row[rows]
    uniq, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
    out = pool.copy()
    inverse = inverse.reshape(-1)
    for j, r in enumerate(rows[first]):
        at = rows[inverse == j]
        if (peak_alloc[at] > cap[at]).all() and int(peak_alloc[at].max()) < SATURATION_BYTES // 8:
            # the pool changes neither reserved (the peak allocated) nor the verdict; a replay's pool would stay
            # under saturation too (at most about twice the requested bytes, ``StreamAsks.reserved_bound``)
            out[at], oom[at] = peak_alloc[at], True
            continue
        row = {k: int(v[cand[r]]) for k, v in c.items()}
        ctx = Context(objectives.training_scenario(candidate_scenario(base, optimizers, row)))
        if replayable(ctx):
            st = ctx.stages[int(stage[r])]
            # the requested bytes never exceed the allocated ones, so where no row's peak allocated is over the
            # smallest room of the pair they cannot exceed every room: the stream's requests are not read
            if int(peak_alloc[at].max()) > int(cap[at].min()):
                asks, bound = stream_asks(ctx, st), SATURATION_BYTES
                if (
                    asks.peak_requested > max(int(cap[at].max()), 0)
                    and (asks.reserved_bound or bound) < bound
                ):
                    # every room too small by the requested bytes alone (``card_runs``' first test), and the
                    # peak reserved between the requested peak and the bound: each row's reserved is its room
                    # and none saturates, as with the replay's figure, so no replay
                    out[at], oom[at] = asks.peak_requested, True
                    continue
            needed, conf = pool_replay(ctx, st).peak_reserved, allocator_conf(ctx)
            out[at] = min(needed, SATURATION_BYTES)
            for room in np.unique(cap[at]):
                runs = runs_as_replayed(conf, needed, int(room)) or card_runs(ctx, st, int(room))
                oom[at[cap[at] == room]] = not runs
    return out, oom


def _worst_ranks(
    cand: np.ndarray, stage: np.ndarray, peak_alloc: np.ndarray, reserved: np.ndarray, device: np.ndarray,
    peak_m: np.ndarray, row_over: np.ndarray, oom: np.ndarray,
) -> Evaluation:  # fmt: skip
    """Each candidate's headline: per counter the largest figure over its stages (``Estimate.worst_for``);
    the worst rank (peak moment, worst stage) is the one with the largest device total, the first of equals
    as max() picks."""
    nrows = cand.shape[0]
    starts = np.flatnonzero(np.r_[True, cand[1:] != cand[:-1]])
    best = np.maximum.reduceat(device, starts)
    order = np.where(device == best[cand], np.arange(nrows), nrows)
    pick = np.minimum.reduceat(order, starts)
    over = np.logical_or.reduceat(row_over, starts)
    return Evaluation(
        peak_allocated_bytes=np.where(over, OVERFLOW_BYTES, np.maximum.reduceat(peak_alloc, starts)),
        peak_reserved_bytes=np.where(over, OVERFLOW_BYTES, np.maximum.reduceat(reserved, starts)),
        device_total_bytes=np.where(over, OVERFLOW_BYTES, device[pick]),
        peak_moment=peak_m[pick],
        worst_stage=stage[pick],
        overflow=over,
        oom=np.logical_or.reduceat(oom, starts),
    )
