"""The planner's search space: which layouts and knobs are tried, and the candidate arrays they make.

A *layout* is one factorisation ``num_gpus = dp x tp x pp x cp`` (plus ``ep`` inside dp x cp x tp for MoE)
that the engine accepts for the model (heads and kv heads divisible by tp, layers by pp, the sequence by
cp, experts by ep; ``Context`` itself is the judge). *Knobs* are the memory levers tried on every layout:
ZeRO stage, sequence parallel, micro-batch with the gradient accumulation that keeps the global batch,
activation checkpointing, chunked loss, optimizer and optimizer offload. Candidates are integer-coded
columns (``plan.vector.COLUMNS``) so that a million of them are a few numpy arrays; every candidate that breaks a
rule of ``memsim_widget.rules`` is left out (``broken_rules``, the rules' own predicates over the columns).
"""

from __future__ import annotations

import itertools
import numbers
from collections import ChainMap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np

from memsim_widget.engine.context import Context
from memsim_widget.engine.speed.gpu_speed import (
    GPUS_PER_NODE,  # one NVLink domain: tensor parallelism stays inside
)
from memsim_widget.errors import ScenarioError, choice_error
from memsim_widget.errors import short_repr as _short
from memsim_widget.optimizers import OPTIMIZERS
from memsim_widget.plan.vector import CHECKPOINTING, COLUMNS, LOSSES, OFFLOADS, replace_unchecked
from memsim_widget.rules import RULES, ScenarioView
from memsim_widget.scenario import MAX_ACCUM_STEPS, MAX_GPUS, MAX_MICRO_BATCH, Scenario


def _choices(field_name: str, values: Iterable[object], allowed: Sequence[object]) -> tuple:
    """``values`` as a tuple, each one of ``allowed`` (the error names the field and suggests close ones)."""
    out = tuple(values)
    if not out:
        raise ScenarioError(field_name, f"must name at least one of: {', '.join(map(str, allowed))}")
    for v in out:
        if v not in allowed:
            raise choice_error(field_name, v, [str(a) for a in allowed])
    return out


@dataclass(frozen=True)
class SearchSpace:
    """The values the planner tries; narrow any of them to fix a choice (e.g. ``checkpointing=("full",)``).

    ``tp``/``pp``/``cp``/``ep`` are upper sets: each layout uses the values that divide its GPU count and
    the model. ``micro_batch`` are the micro-batch sizes tried (with a global batch, only divisors of the
    sequences per data-parallel replica). ``max_tp`` keeps tensor parallelism within one node.
    """

    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    cp: tuple[int, ...] = (1, 2, 4, 8)
    ep: tuple[int, ...] = (1, 2, 4, 8)
    zero: tuple[int, ...] = (0, 1, 2, 3)
    sequence_parallel: tuple[bool, ...] = (False, True)
    micro_batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    checkpointing: tuple[str, ...] = CHECKPOINTING
    loss: tuple[str, ...] = LOSSES
    optimizers: tuple[str, ...] = ("adamw", "adamw-8bit")
    offload: tuple[str, ...] = ("none", "optimizer")
    max_tp: int = GPUS_PER_NODE

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "cp", "ep", "micro_batch"):
            top = MAX_MICRO_BATCH if name == "micro_batch" else MAX_GPUS
            vals = tuple(getattr(self, name))
            if not vals or any(not _is_int(v) or not 1 <= v <= top for v in vals):
                raise ScenarioError(
                    f"space.{name}", f"must be integers from 1 to {top:,}, got {_short(vals)}"
                )
            object.__setattr__(self, name, tuple(int(v) for v in vals))
        object.__setattr__(self, "zero", _choices("space.zero", self.zero, (0, 1, 2, 3)))
        object.__setattr__(
            self,
            "sequence_parallel",
            _choices("space.sequence_parallel", self.sequence_parallel, (False, True)),
        )
        object.__setattr__(
            self, "checkpointing", _choices("space.checkpointing", self.checkpointing, CHECKPOINTING)
        )
        object.__setattr__(self, "loss", _choices("space.loss", self.loss, LOSSES))
        object.__setattr__(
            self, "optimizers", _choices("space.optimizers", self.optimizers, list(OPTIMIZERS))
        )
        object.__setattr__(self, "offload", _choices("space.offload", self.offload, OFFLOADS))
        if not _is_int(self.max_tp) or not 1 <= self.max_tp <= MAX_GPUS:
            raise ScenarioError(
                "space.max_tp", f"must be an integer from 1 to {MAX_GPUS:,}, got {_short(self.max_tp)}"
            )
        object.__setattr__(self, "max_tp", int(self.max_tp))


@dataclass(frozen=True)
class Layout:
    """One factorisation of the GPUs."""

    num_gpus: int
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int = 1


def gpu_counts(gpus: int | tuple[int, int] | Sequence[int]) -> tuple[int, ...]:
    """GPU counts to plan for: one count, an explicit list, or a ``(low, high)`` range (powers of two
    within it, and both ends); each from 1 to ``MAX_GPUS`` (2**20), as the scenario allows."""
    shape = f"a positive integer up to {MAX_GPUS:,} (2**20), a list of them or a (low, high) range"
    if isinstance(gpus, bool) or not isinstance(gpus, (numbers.Integral, Iterable)) or isinstance(gpus, str):
        raise ScenarioError("gpus", f"must be {shape}, got {_short(gpus)}")
    if isinstance(gpus, numbers.Integral):
        values: tuple[object, ...] = (gpus,)
    elif isinstance(gpus, tuple) and len(gpus) == 2:
        lo, hi = gpus
        if not (_is_int(lo) and _is_int(hi)) or lo < 1 or hi < lo:
            raise ScenarioError(
                "gpus", f"a range must be (low, high) with 1 <= low <= high, got {_short(gpus)}"
            )
        if hi > MAX_GPUS:
            raise ScenarioError(
                "gpus", f"a range must end at most at {MAX_GPUS:,} (2**20) GPUs, got {_short(gpus)}"
            )
        lo, hi = int(lo), int(hi)
        values = (*{1 << k for k in range(hi.bit_length() + 1) if lo <= 1 << k <= hi}, lo, hi)
    else:
        values = tuple(gpus)
    if not values or any(not _is_int(n) or not 1 <= n <= MAX_GPUS for n in values):
        raise ScenarioError("gpus", f"must be {shape}, got {_short(gpus)}")
    return tuple(sorted({int(n) for n in values}))


def _is_int(n: object) -> TypeGuard[int]:  # numpy's integers compare as ints too
    """An integer (numpy's too), not a bool."""
    return isinstance(n, numbers.Integral) and not isinstance(n, (bool, np.bool_))


def _divisors_in(n: int, values: Iterable[int]) -> list[int]:
    return [v for v in values if n % v == 0]


def layouts(base: Scenario, counts: Sequence[int], space: SearchSpace) -> list[Layout]:
    """Every layout of every GPU count that the engine accepts for ``base``'s model."""
    out: list[Layout] = []
    par = base.parallel
    for n in counts:
        for tp in _divisors_in(n, (t for t in space.tp if t <= space.max_tp)):
            for pp in _divisors_in(n // tp, space.pp):
                for cp in _divisors_in(n // (tp * pp), space.cp):
                    dp = n // (tp * pp * cp)
                    # EP over dp x cp, or folded over the TP group beyond it (ParallelConfig.expert_tp)
                    for ep in _divisors_in(dp * cp * tp, space.ep):
                        trial = replace_unchecked(
                            base,
                            parallel=replace_unchecked(
                                base.parallel,
                                dp=dp,
                                tp=tp,
                                pp=pp,
                                cp=cp,
                                ep=ep,
                                zero=0,
                                offload="none",
                                sequence_parallel=False,
                                pp_layers=None,  # the split of base.parallel.pp_split (rules/pipeline_split)
                                pp_microbatches=max(pp, par.pp_microbatches),
                                dp_shard=None,  # the search shards over every dp rank (plan.vector.COLUMNS)
                            ),
                        )
                        try:
                            Context(trial)
                        except ScenarioError:
                            continue
                        out.append(Layout(n, dp, tp, pp, cp, ep))
    return out


def _knob_grid(space: SearchSpace) -> dict[str, np.ndarray]:
    """Every combination of the knobs (integer-coded), before per-layout filtering."""
    axes = {
        "zero": list(space.zero),
        "sp": [int(x) for x in space.sequence_parallel],
        "micro_batch": list(space.micro_batch),
        "checkpointing": [CHECKPOINTING.index(x) for x in space.checkpointing],
        "loss": [LOSSES.index(x) for x in space.loss],
        "optimizer": list(range(len(space.optimizers))),
        "offload": [OFFLOADS.index(x) for x in space.offload],
    }
    combos = np.array(list(itertools.product(*axes.values())), dtype=np.int64)
    return {k: combos[:, j] for j, k in enumerate(axes)}


def refused_checkpointing(base: Scenario) -> list[int]:
    """``CHECKPOINTING`` codes the engine refuses for ``base``'s model (its activation rules name
    ``activation_checkpointing``: e.g. selective-op on Falcon's multi-query attention), left out of the grid so
    that a plan never stops on a mode nobody asked for."""
    from memsim_widget.engine.activations import activations

    one = replace_unchecked(base.parallel, dp=1, tp=1, pp=1, cp=1, ep=1, zero=0, offload="none",
                            sequence_parallel=False, pp_microbatches=1, pp_layers=None, dp_shard=None)  # fmt: skip
    out = []
    for code, mode in enumerate(CHECKPOINTING):
        sc = replace_unchecked(base, activation_checkpointing=mode, checkpoint_every=None, parallel=one)
        try:
            activations(Context(sc))
        except ScenarioError as exc:
            if exc.field == "activation_checkpointing":
                out.append(code)
    return out


def candidates(
    base: Scenario,
    layout_list: Sequence[Layout],
    space: SearchSpace,
    global_batch_sequences: int | None,
) -> dict[str, np.ndarray]:
    """Candidate columns (``COLUMNS`` plus ``num_gpus``) for every valid knob setting of every layout.

    With a global batch of G sequences, a layout needs dp | G; the micro-batch b divides G/dp and the
    rest is gradient accumulation (pipeline micro-batches when pp > 1). Without one, each replica runs
    one micro-batch per step (pp > 1: pp micro-batches, the fewest that fill the pipeline).
    """
    grid = _knob_grid(space)
    refused = refused_checkpointing(base)
    parts: list[dict[str, np.ndarray]] = []
    for lay in layout_list:
        shard = lay.dp * lay.cp
        ok = np.ones(grid["zero"].shape[0], dtype=bool)
        if shard == 1:  # ZeRO with one replica is ZeRO-0, except as the carrier of an offload (ZeRO-Offload
            # on one GPU): the lowest stage in the space for the optimizer, ZeRO-3 for optimizer+params
            z_opt = min((z for z in space.zero if z >= 1), default=-1)
            ok &= (
                (grid["zero"] == 0)
                | ((grid["offload"] == 1) & (grid["zero"] == z_opt))
                | (grid["offload"] == 2)
            )
        for code in refused:
            ok &= grid["checkpointing"] != code
        b = grid["micro_batch"]
        if global_batch_sequences is not None:
            if global_batch_sequences % lay.dp:
                continue
            per_replica = global_batch_sequences // lay.dp
            ok &= per_replica % b == 0
            accum = np.where(ok, per_replica // b, 1)
        else:
            accum = np.where(lay.pp > 1, lay.pp, 1) * np.ones_like(b)
        ok &= accum <= MAX_ACCUM_STEPS  # the scenario's bound on grad_accum_steps and pp_microbatches
        idx = np.nonzero(ok)[0]
        if idx.size == 0:
            continue
        k = idx.size
        part = {name: grid[name][idx] for name in grid}
        acc = accum[idx]
        part.update(
            num_gpus=np.full(k, lay.num_gpus),
            dp=np.full(k, lay.dp),
            tp=np.full(k, lay.tp),
            pp=np.full(k, lay.pp),
            cp=np.full(k, lay.cp),
            ep=np.full(k, lay.ep),
            grad_accum=np.where(lay.pp > 1, 1, acc),
            pp_microbatches=np.where(lay.pp > 1, acc, 1),
            dp_shard=np.zeros(k, dtype=np.int64),
        )
        parts.append(part)
    names = (*COLUMNS, "num_gpus")
    if not parts:
        return {k: np.zeros(0, dtype=np.int64) for k in names}
    cols = {k: np.concatenate([p[k] for p in parts]).astype(np.int64, copy=False) for k in names}
    keep = ~broken_rules(candidate_view(base, cols, space.optimizers), cols["dp"].shape[0])
    return {k: v[keep] for k, v in cols.items()}


class CodedColumn:
    """An integer-coded column of names that compares with a name (``==``, ``!=``) as a rule does, without
    building an array of strings."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, codes: np.ndarray, names: Sequence[str]) -> None:
        self.codes, self.names = codes, tuple(names)

    def __eq__(self, other: object) -> np.ndarray:  # type: ignore[override]
        if other not in self.names:
            return np.zeros(self.codes.shape, dtype=bool)
        return self.codes == self.names.index(other)  # type: ignore[arg-type]

    def __ne__(self, other: object) -> np.ndarray:  # type: ignore[override]
        return ~(self == other)

    def __bool__(self) -> bool:
        raise ValueError("a column has no single truth value: combine it with & and |")


def candidate_view(base: Scenario, cols: Mapping[str, np.ndarray], optimizers: Sequence[str]) -> ChainMap:
    """Candidate columns as a rules view (``memsim_widget.rules``): the scenario keys each candidate sets
    (``plan.vector.candidate_scenario``), as arrays, over ``base`` and its model."""
    from memsim_widget.catalog.models import architecture_for

    knobs = {
        **{f"parallel.{k}": cols[k] for k in ("dp", "tp", "pp", "cp", "ep", "zero", "pp_microbatches")},
        "parallel.sequence_parallel": cols["sp"].astype(bool),
        "parallel.offload": CodedColumn(cols["offload"], OFFLOADS),
        "micro_batch_size": cols["micro_batch"],
        "grad_accum_steps": cols["grad_accum"],
        "activation_checkpointing": CodedColumn(cols["checkpointing"], CHECKPOINTING),
        "checkpoint_every": None,  # the planner checkpoints every layer (or none)
        "loss": CodedColumn(cols["loss"], LOSSES),
        "optimizer": CodedColumn(cols["optimizer"], tuple(optimizers)),
    }
    # ChainMap writes to its first map only; typeshed asks every map to be mutable (ScenarioView is read-only)
    return ChainMap(knobs, ScenarioView(base, arch=architecture_for(base.model)))  # pyright: ignore[reportArgumentType]


def broken_rules(view: Mapping[str, object], n: int) -> np.ndarray:
    """Which of ``n`` candidates break some rule of the table (``memsim_widget.rules``, every stage that raises);
    a rule the view cannot answer (the LoRA adapters, judged by ``Context`` on each layout; the optimizer's
    implementation, chosen per candidate by ``rules.available_impl``) is left out."""
    out = np.zeros(n, dtype=bool)
    for rule in RULES:
        if rule.stage == "inert":
            continue
        try:
            broken = rule.broken(view)
        except (KeyError, TypeError):  # a key the view lacks, a name looked up in a catalog by a whole column
            continue  # (a rule that uses ``and``/``or``/``not`` on a column raises ValueError: a bug, surfaced)
        out |= np.broadcast_to(np.asarray(broken, dtype=bool), (n,))
    return out
