"""``plan``: search layouts and knobs for a model on a GPU type, keep what fits, rank by modelled cost, time
or memory (the step-time model of ``engine/speed/step_time.py``, the same as ``estimate``'s)."""

from __future__ import annotations

import numbers
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from memsim_widget.cost import price_note, price_of
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.estimate import DEFAULT_HEADROOM, Estimate
from memsim_widget.engine.speed.gpu_speed import SPEED_ASSUMED_FROM, speed_known
from memsim_widget.errors import ScenarioError
from memsim_widget.errors import short_repr as _short
from memsim_widget.plan.space import Layout, SearchSpace, candidates, gpu_counts, layouts
from memsim_widget.plan.timing import time_columns
from memsim_widget.plan.vector import (
    CHECKPOINTING,
    COLUMNS,
    LOSSES,
    OFFLOADS,
    candidate_scenario,
    evaluate,
    fits_mask,
    unique_codes,
)
from memsim_widget.scenario import (
    MAX_ACCUM_STEPS,
    MAX_GPUS,
    MAX_MICRO_BATCH,
    METHODS,
    Scenario,
    check_headroom,
)
from memsim_widget.units import GiB

if TYPE_CHECKING:
    import pandas as pd


#: Set to 1 (or pass ``plan(..., check=True)``) to check every listed candidate against ``estimate``.
CHECK_ENV = "MEMSIM_PLAN_CHECK"


class PlanCheckError(AssertionError):
    """A listed candidate's figures differ from ``estimate`` of that candidate (a planner bug)."""


#: Frame columns, in order.
FRAME_COLUMNS = ("candidate", "method", "num_gpus", "dp", "tp", "pp", "cp", "ep", "zero", "sequence_parallel",
                 "micro_batch_size", "grad_accum_steps", "pp_microbatches", "global_batch_tokens",
                 "activation_checkpointing", "loss", "optimizer", "offload", "peak_allocated_gib",
                 "peak_reserved_gib", "device_total_gib", "peak_phase", "worst_stage", "fits", "free_gib",
                 "tokens_per_gpu_s", "step_time_s", "mfu", "wall_hours", "gpu_hours", "dollars", "bubble",
                 "recompute", "communication_s")  # fmt: skip
#: What ``plan`` can rank by: ``cost`` (dollars = GPU-hours: tokens/s per GPU, higher first), ``time`` (wall
#: hours: tokens/s of the whole job, higher first) or ``memory`` (memory per GPU, lower first).
RANK_BY = ("cost", "time", "memory")
#: Tokens the hours and dollars columns are for when ``train_tokens`` is not given (one billion).
DEFAULT_TRAIN_TOKENS = 10**9


def base_scenario(base: Scenario | Mapping[str, Any] | None = None, **keys: Any) -> Scenario:
    """The fixed choices of a plan: ``base`` (a scenario or dict, default all defaults) with ``keys`` set."""
    if base is None:
        data: dict[str, Any] = {}
    elif isinstance(base, Scenario):
        data = base.to_dict()
    else:
        data = dict(base)
    data.update({k: v for k, v in keys.items() if v is not None})
    data.pop("num_gpus", None)
    return Scenario.from_dict(data)


@dataclass
class Plan:
    """Every candidate evaluated, with the ones that fit ranked by modelled cost, time or memory (``rank_by``)."""

    base: Scenario
    gpu_counts: tuple[int, ...]
    space: SearchSpace
    headroom: float
    columns: dict[str, np.ndarray]  # one array per candidate column, memory and time figure
    seconds: float
    global_batch_tokens: int | None = None
    top: int | None = 50
    #: One base per training method searched (``base`` is the first); the ``method`` column indexes it.
    bases: tuple[Scenario, ...] = ()
    #: ``cost``, ``time`` or ``memory`` (``RANK_BY``).
    rank_by: str = "cost"
    #: Tokens the hours and dollars are computed for (``DEFAULT_TRAIN_TOKENS`` if None).
    train_tokens: float | None = None
    #: US$ per GPU-hour (None: ``cost.PRICES`` for the card).
    price: float | None = None
    #: What the search added to the space because nothing fitted in the one asked for (``WIDENING``):
    #: ``{"offload": [...], "methods": [...]}``, empty when it did not widen.
    widened: dict[str, list[str]] = field(default_factory=dict)
    #: Rank only the candidates this export format can express (``for_export``); None: all.
    export_format: str | None = None
    _estimates: dict[int, Estimate] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.bases:
            self.bases = (self.base,)
        self.columns.setdefault("method", np.zeros(self.columns["dp"].shape[0], dtype=np.int64))

    @property
    def evaluated(self) -> int:
        """Candidates evaluated."""
        return int(self.columns["dp"].shape[0])

    @property
    def candidates_per_second(self) -> float:
        return self.evaluated / max(self.seconds, 1e-9)

    @cached_property
    def ranking(self) -> np.ndarray:
        """Indices of the fitting candidates worth listing, best first (``frontier``), only those
        ``export_format`` can express when it is set (``left_out`` says how many it dropped, and why)."""
        if self.export_format is None:
            return self.frontier
        return self._exportable[0]

    @property
    def left_out(self) -> dict[str, dict[str, Any]]:
        """With ``export_format``: the listed candidates it cannot express, by the field its writer refuses:
        ``{field: {"count": n, "why": the first refusal's words}}``."""
        return {} if self.export_format is None else self._exportable[1]

    def for_export(self, fmt: str) -> Plan:
        """This plan ranking only what ``fmt`` (``memsim_widget.export.FORMATS``) can express."""
        from memsim_widget.export import renderer

        renderer(fmt)  # an unknown format is refused here, naming the field
        return replace(self, export_format=fmt, _estimates=self._estimates)

    def export_refusal(self, candidate: int, fmt: str) -> ScenarioError | None:
        """Why ``fmt`` cannot express ``candidate`` (the writer's own refusal, naming the field), or None."""
        from memsim_widget.export import export

        try:  # the estimate only when the writer reads it (its note): a refusal comes before, at no engine cost
            export(self.scenario(candidate), fmt, _Lazy(lambda: self.estimate(candidate)))
        except ScenarioError as e:
            return e
        return None

    def export_answers(self, candidate: int) -> dict[str, str | None]:
        """Each export format's answer for ``candidate``: None when it writes the launch files, else its
        refusal (``field: why``, one line)."""
        from memsim_widget.export import FORMATS

        return {
            fmt: None if (e := self.export_refusal(candidate, fmt)) is None else str(e) for fmt in FORMATS
        }

    @cached_property
    def _exportable(self) -> tuple[np.ndarray, dict[str, dict[str, Any]]]:
        """The memory/throughput frontier of the candidates ``export_format`` can express (``frontier`` over
        them: a candidate the format cannot express no longer hides one it can), and what it left out of the
        plain ranking, by field. Each group of candidates that agree on every column a writer reads (all but
        micro-batch, accumulation and the data-parallel count beyond 1) is tried once."""
        fmt = self.export_format
        assert fmt is not None
        c = self.columns
        why: dict[tuple[int, ...], ScenarioError | None] = {}

        def refusal(i: int) -> ScenarioError | None:
            key = tuple(int(c[k][i]) for k in COLUMNS if k not in ("micro_batch", "grad_accum", "dp"))
            key += (int(c["dp"][i] > 1), int(c["method"][i]))
            if key not in why:
                why[key] = self.export_refusal(i, fmt)
            return why[key]

        left: dict[str, dict[str, Any]] = {}
        for i in self.frontier.tolist():
            if (err := refusal(i)) is not None:
                entry = left.setdefault(err.field, {"count": 0, "why": err.message})
                entry["count"] += 1
        return self._frontier_of(lambda i: refusal(i) is None), left

    @cached_property
    def frontier(self) -> np.ndarray:
        """Indices of the fitting candidates worth listing, best first.

        Order (``rank_by``): ``cost`` -- modelled tokens/s per GPU down (fewest GPU-hours, so fewest dollars
        on one card type); ``time`` -- tokens/s of the whole job down (fewest wall hours); ``memory`` -- memory
        per GPU up. On a tie the scenario's own optimizer before a substitute, then less memory.
        Dropped: candidates another one of the same layout, method and optimizer beats on both memory
        and throughput (e.g. selective checkpointing where it saves nothing), so the list is the
        memory/throughput frontier of each layout.
        """
        c = self.columns
        fits = np.nonzero(c["fits"])[0]
        if fits.size == 0:
            return fits
        group, order, m_sorted = self._frontier_order(fits)
        g_sorted = group[order]
        new_group = np.r_[True, g_sorted[1:] != g_sorted[:-1]]
        # running minimum of memory within each group: later groups get smaller offsets, so the
        # running minimum over the whole array restarts at every group
        big = int(m_sorted.max()) + 1
        offset = (int(g_sorted.max()) - g_sorted) * big
        running = np.minimum.accumulate(m_sorted + offset) - offset
        prev = np.where(new_group, np.iinfo(np.int64).max, np.r_[0, running[:-1]])
        keep = np.zeros(fits.size, dtype=bool)
        keep[order] = m_sorted < prev
        return self._rank(fits[keep])

    def _frontier_order(self, fits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each fitting candidate's group (layout, method, optimizer), the order that sorts them by group, then
        tokens/s down, then memory up, and their memory ranks in that order."""
        c = self.columns
        tok = c["tokens_per_gpu_s"][fits]
        mem = c["device_total_bytes"][fits]
        cols = [c[k][fits] for k in ("num_gpus", "dp", "tp", "pp", "cp", "ep", "optimizer", "method")]
        _, group = unique_codes(cols)
        order = np.lexsort((mem, -tok, group))
        # memory as its rank among the fitting candidates (same order, small numbers: no int64 overflow)
        m_sorted = np.unique(mem, return_inverse=True)[1].reshape(-1)[order]
        return group, order, m_sorted

    def _frontier_of(self, accept: Callable[[int], bool]) -> np.ndarray:
        """``frontier`` among the fitting candidates ``accept`` takes (asked only of those no accepted one of
        their group beats on both memory and throughput), ranked the same way."""
        fits = np.nonzero(self.columns["fits"])[0]
        if fits.size == 0:
            return fits
        group, order, m_sorted = self._frontier_order(fits)
        kept: list[int] = []
        last, low = -1, np.iinfo(np.int64).max
        for g, j, m in zip(group[order].tolist(), order.tolist(), m_sorted.tolist(), strict=True):
            if g != last:
                last, low = g, np.iinfo(np.int64).max
            if m < low and accept(int(fits[j])):
                kept.append(int(fits[j]))
                low = m
        return self._rank(np.asarray(kept, dtype=np.int64))

    def _rank(self, kept: np.ndarray) -> np.ndarray:
        """``kept`` best first (``rank_by``; on a tie the scenario's own optimizer, then less memory)."""
        c = self.columns
        own = np.array([o != self.base.optimizer for o in self.space.optimizers])[c["optimizer"][kept]]
        rank = np.lexsort((c["device_total_bytes"][kept], own, -self._score(kept)))
        return kept[rank]

    def _score(self, idx: np.ndarray) -> np.ndarray:
        """What ``rank_by`` maximises for candidates ``idx``."""
        c = self.columns
        if self.rank_by == "time":
            return c["tokens_per_gpu_s"][idx] * c["num_gpus"][idx]
        if self.rank_by == "memory":
            return -c["device_total_bytes"][idx].astype(np.float64)
        return c["tokens_per_gpu_s"][idx]

    @property
    def price_per_gpu_hour(self) -> float:
        """The price the dollars column uses (US$ per GPU-hour)."""
        return price_of(Context(self.base).gpu.id) if self.price is None else float(self.price)

    @property
    def price_source(self) -> str:
        """Where ``price_per_gpu_hour`` comes from (``cost.price_note``; "given" for ``price=``)."""
        return price_note(Context(self.base).gpu.id) if self.price is None else "given"

    @property
    def assumptions(self) -> list[str]:
        """What the time and cost columns assume for lack of the card's facts (its speeds, its price)."""
        gpu, out = Context(self.base).gpu, []
        if not speed_known(gpu):
            out.append(
                f"{gpu.name}: speeds unknown; tokens/s, MFU and hours use an {SPEED_ASSUMED_FROM} card's"
            )
        if self.price is None and "unknown" in self.price_source:
            out.append(f"{gpu.name}: price {self.price_source}")
        return out

    @property
    def fitting(self) -> int:
        """Candidates that fit with the headroom."""
        return int(np.count_nonzero(self.columns["fits"]))

    @property
    def listed(self) -> int:
        """Fitting candidates on the memory/throughput frontier of their layout (the ranked list; only those
        ``export_format`` expresses when it is set)."""
        return int(self.ranking.shape[0])

    def scenario(self, candidate: int) -> Scenario:
        """The full scenario of candidate number ``candidate`` (the frame's ``candidate`` column)."""
        row = {k: int(self.columns[k][candidate]) for k in COLUMNS}
        base = self.bases[int(self.columns["method"][candidate])]
        return candidate_scenario(base, self.space.optimizers, row)

    def estimate(self, candidate: int) -> Estimate:
        """``estimate`` of one candidate (equal to the planner's figures, see tests/plan/test_plan_vector.py)."""
        if candidate not in self._estimates:
            self._estimates[candidate] = estimate(self.scenario(candidate))
        return self._estimates[candidate]

    def mismatches(self, idx: Sequence[int] | np.ndarray | None = None) -> list[tuple[int, tuple, tuple]]:
        """``(candidate, planner's figures, estimate's figures)`` for each of ``idx`` (default: the listed
        candidates, at most ``top``) where they differ: allocated, reserved and nvidia-smi bytes, the peak
        moment, the worst stage and whether it fits."""
        if idx is None:
            idx = self.ranking if self.top is None else self.ranking[: self.top]
        c = self.columns
        out = []
        for i in np.asarray(idx, dtype=np.int64).tolist():
            try:
                est = self.estimate(i)
            except ScenarioError as e:  # a listed candidate that estimate refuses
                out.append((i, ("listed",), (f"ScenarioError: {e}",)))
                continue
            got = (
                int(c["peak_allocated_bytes"][i]),
                int(c["peak_reserved_bytes"][i]),
                int(c["device_total_bytes"][i]),
                str(c["peak_phase"][i]),
                int(c["worst_stage"][i]),
                bool(c["fits"][i]),
                float(c["step_time_s"][i]),
            )
            want = (
                est.peak_allocated_bytes,
                est.peak_reserved_bytes,
                est.device_total_bytes,
                est.peak_phase,
                est.worst.stage.index,
                est.fits(headroom=self.headroom),
                est.step_time_s,
            )
            if got != want:
                out.append((i, got, want))
        return out

    def check(self, idx: Sequence[int] | np.ndarray | None = None) -> None:
        """Raise ``PlanCheckError`` unless every listed candidate (or each of ``idx``) equals ``estimate``
        of its scenario byte for byte (``plan(..., check=True)`` or ``MEMSIM_PLAN_CHECK=1`` run this)."""
        bad = self.mismatches(idx)
        if bad:
            i, got, want = bad[0]
            raise PlanCheckError(
                f"{len(bad)} planner candidates differ from estimate; candidate {i} "
                f"({self.scenario(i).to_json(indent=None)}): planner (allocated, reserved, device, moment, "
                f"stage, fits, step time) = {got}, estimate = {want}"
            )

    def _frame(self, idx: np.ndarray) -> pd.DataFrame:
        import pandas as pd

        c = self.columns
        seq = Context(self.base).seq_len
        accum = np.maximum(c["grad_accum"], c["pp_microbatches"])
        tokens = DEFAULT_TRAIN_TOKENS if self.train_tokens is None else self.train_tokens
        hours = tokens / (c["tokens_per_gpu_s"][idx] * c["num_gpus"][idx]) / 3600.0
        data = {
            "candidate": idx,
            "method": np.array([b.method for b in self.bases], dtype=object)[c["method"][idx]],
            "num_gpus": c["num_gpus"][idx],
            "dp": c["dp"][idx],
            "tp": c["tp"][idx],
            "pp": c["pp"][idx],
            "cp": c["cp"][idx],
            "ep": c["ep"][idx],
            "zero": c["zero"][idx],
            "sequence_parallel": c["sp"][idx].astype(bool),
            "micro_batch_size": c["micro_batch"][idx],
            "grad_accum_steps": c["grad_accum"][idx],
            "pp_microbatches": c["pp_microbatches"][idx],
            "global_batch_tokens": _times((c["dp"] * c["micro_batch"] * accum)[idx], seq),
            "activation_checkpointing": np.array(CHECKPOINTING, dtype=object)[c["checkpointing"][idx]],
            "loss": np.array(LOSSES, dtype=object)[c["loss"][idx]],
            "optimizer": np.array(self.space.optimizers, dtype=object)[c["optimizer"][idx]],
            "offload": np.array(OFFLOADS, dtype=object)[c["offload"][idx]],
            "peak_allocated_gib": c["peak_allocated_bytes"][idx] / GiB,
            "peak_reserved_gib": c["peak_reserved_bytes"][idx] / GiB,
            "device_total_gib": c["device_total_bytes"][idx] / GiB,
            "peak_phase": c["peak_phase"][idx],
            "worst_stage": c["worst_stage"][idx],
            "fits": c["fits"][idx],
            "free_gib": (c["gpu_memory_bytes"] * (1 - self.headroom) - c["device_total_bytes"][idx]) / GiB,
            "tokens_per_gpu_s": c["tokens_per_gpu_s"][idx],
            "step_time_s": c["step_time_s"][idx],
            "mfu": c["mfu"][idx],
            "wall_hours": hours,
            "gpu_hours": hours * c["num_gpus"][idx],
            "dollars": hours * c["num_gpus"][idx] * self.price_per_gpu_hour,
            "bubble": c["bubble"][idx],
            "recompute": c["recompute"][idx],
            "communication_s": c["communication_s"][idx],
        }
        return pd.DataFrame(data, columns=list(FRAME_COLUMNS))

    @property
    def frame(self) -> pd.DataFrame:
        """The fitting candidates, best first (at most ``top`` rows; ``None`` keeps all)."""
        idx = self.ranking if self.top is None else self.ranking[: self.top]
        return self._frame(idx).reset_index(drop=True)

    def all_frame(self, limit: int | None = None, seed: int = 0) -> pd.DataFrame:
        """Every candidate, fitting or not (a reproducible sample of ``limit`` rows if given)."""
        idx = np.arange(self.evaluated)
        if limit is not None and idx.shape[0] > limit:
            idx = np.sort(np.random.default_rng(seed).choice(idx, size=limit, replace=False))
        return self._frame(idx)

    def best(self) -> Scenario | None:
        """The top-ranked scenario, or None when nothing fits."""
        return self.scenario(int(self.ranking[0])) if self.fitting else None

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """The JSON form (``memsim plan --json``): the search, and the best candidates each with its full
        scenario, its estimate, its modelled time and its hours and dollars."""
        n = self.top if top is None else top
        idx = self.ranking if n is None else self.ranking[:n]
        frame = self._frame(idx)
        out = []
        for rank, (i, row) in enumerate(zip(idx.tolist(), frame.to_dict("records"), strict=True), start=1):
            est = self.estimate(i)
            out.append(
                {
                    "rank": rank,
                    "candidate": i,
                    "scenario": est.scenario.to_dict(),
                    "estimate": est.to_dict(self.headroom),
                    "throughput": {
                        k: float(row[k])
                        for k in (
                            "tokens_per_gpu_s",
                            "step_time_s",
                            "mfu",
                            "bubble",
                            "recompute",
                            "communication_s",
                        )
                    },
                    "cost": {k: float(row[k]) for k in ("wall_hours", "gpu_hours", "dollars")},
                    "exports": self.export_answers(i),
                }
            )
        return {
            "base": self.base.to_dict(),
            "methods": [b.method for b in self.bases],
            "gpu_counts": list(self.gpu_counts),
            "global_batch_tokens": self.global_batch_tokens,
            "headroom": self.headroom,
            "evaluated": self.evaluated,
            "fitting": self.fitting,
            "listed": self.listed,
            "widened": self.widened,
            "export_format": self.export_format,
            "left_out": self.left_out,
            "seconds": round(self.seconds, 4),
            "ranked_by": RANKED_BY[self.rank_by],
            "train_tokens": DEFAULT_TRAIN_TOKENS if self.train_tokens is None else self.train_tokens,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "price_source": self.price_source,
            "assumptions": self.assumptions,
            "candidates": out,
        }

    def widened_text(self) -> str:
        """What the search added because nothing fitted in the space asked for, as a sentence ('' if nothing)."""
        if not self.widened:
            return ""
        added = []
        if "offload" in self.widened:
            added.append("parameter offload (offload optimizer+params, ZeRO-3)")
        if "methods" in self.widened:
            added.append("the methods " + ", ".join(self.widened["methods"]) + " (they change the job)")
        return "nothing fit in the space asked for, so the search added " + " and ".join(added) + "; "

    def summary(self) -> str:
        """One line: what was searched and the best candidate."""
        head = (
            f"{self.evaluated:,} candidates over {', '.join(map(str, self.gpu_counts))} GPUs in "
            f"{self.seconds * 1000:.0f} ms; {self.fitting:,} fit ({self.listed:,} on their layout's "
            "memory/throughput frontier)"
        )
        head = self.widened_text() + head
        if not self.fitting:
            return head + " (none: see recommend() or allow more GPUs, LoRA/QLoRA or offload)"
        if not self.listed:
            return head + f"; none that {self.export_format} can express"
        r = self.frame.iloc[0]
        return (
            f"{head}; best: dp={r.dp} tp={r.tp} pp={r.pp} cp={r.cp} zero={r.zero} b={r.micro_batch_size} "
            f"ckpt={r.activation_checkpointing} {r.optimizer} -> {r.device_total_gib:.1f} GiB per GPU, "
            f"{r.tokens_per_gpu_s:,.0f} tokens/s/GPU (modelled), {r.wall_hours:,.3g} h / ${r.dollars:,.0f} "
            f"per {_tokens_label(self.train_tokens)} tokens"
        )


class _Lazy:
    """An object computed on first attribute access (``Plan.export_refusal``'s estimate)."""

    def __init__(self, compute: Callable[[], Any]) -> None:
        self._compute, self._value = compute, None

    def __getattr__(self, name: str) -> Any:
        if self._value is None:
            self._value = self._compute()
        return getattr(self._value, name)


#: How each ``rank_by`` orders, in words (the JSON's ``ranked_by``).
RANKED_BY = {
    "cost": "cost: modelled tokens/s per GPU, higher first (fewest GPU-hours; memsim_widget.engine.speed.step_time)",
    "time": "time: modelled tokens/s of the whole job, higher first (fewest wall hours)",
    "memory": "memory: memory per GPU (nvidia-smi), lower first",
}


def _tokens_label(tokens: float | None) -> str:
    """``1B``-style label of the tokens the hours are for."""
    n = DEFAULT_TRAIN_TOKENS if tokens is None else tokens
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n:g}"


def _times(a: np.ndarray, k: int) -> np.ndarray:
    """``a * k``, as Python integers where int64 would overflow (2**20 GPUs x 2**16 x 2**20 x 2**24 tokens)."""
    if a.size and int(a.max()) * k > np.iinfo(np.int64).max:
        return a.astype(object) * k
    return a * k


def _evaluated(
    base: Scenario, cols: dict[str, np.ndarray], optimizers: tuple[str, ...]
) -> dict[str, np.ndarray]:
    """Candidate columns with the vector engine's figures added."""
    if cols["dp"].shape[0]:
        ev = evaluate(base, cols, optimizers)
        cols.update(
            peak_allocated_bytes=ev.peak_allocated_bytes,
            peak_reserved_bytes=ev.peak_reserved_bytes,
            device_total_bytes=ev.device_total_bytes,
            peak_phase=ev.peak_phase,
            worst_stage=ev.worst_stage,
            overflow=ev.overflow,
            oom=ev.oom,
        )
    else:
        for k in ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes", "worst_stage"):
            cols[k] = np.zeros(0, dtype=np.int64)
        cols["peak_phase"] = np.zeros(0, dtype=object)
        cols["overflow"] = np.zeros(0, dtype=bool)
        cols["oom"] = np.zeros(0, dtype=bool)
    return cols


def _check_ranking(rank_by: str, train_tokens: float | None, price: float | None) -> None:
    """Refuse an unknown ranking, or train tokens or a price that is not a positive number."""
    if rank_by not in RANK_BY:
        raise ScenarioError("rank_by", f"got {_short(rank_by)}; allowed values: {', '.join(RANK_BY)}")
    for name, value in (("train_tokens", train_tokens), ("price", price)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0
        ):
            raise ScenarioError(name, f"must be a positive number, got {_short(value)}")


def _sft_base(
    base: Scenario | Mapping[str, Any] | None, model: Any, gpu: Any, fixed: dict[str, Any]
) -> Scenario:
    """The base scenario of the search (``fixed``'s ``parallel`` dropped: the search sets it); refused for an
    objective other than SFT, which the vectorised engine (plan/vector.py) has no rules for."""
    fixed.pop("parallel", None)
    b = base_scenario(base, model=model, gpu=gpu, **fixed)
    if b.objective_name != "sft":
        raise ScenarioError(
            "objective",
            f"the layout search models SFT steps only; for a {b.objective_name} run use estimate or recommend "
            "(engine/rl/objectives.py, engine/rl/rollout.py)",
        )
    return b


def _check_modelled(ctx: Context) -> None:
    """Refuse a model calibrated from a trace: the vectorised engine reads rule terms a fitted model lacks."""
    if ctx.arch.facts.calibration is not None:
        raise ScenarioError(
            "model", f"{ctx.arch.model_type!r} is calibrated from a trace: the planner is not; use estimate "
            "(dp and ZeRO layouts work there, tensor and pipeline parallelism need a modelled family)",
        )  # fmt: skip


def _global_batch_sequences(global_batch_tokens: Any, seq: int) -> int:
    """``global_batch_tokens`` as a whole number of sequences of ``seq`` tokens, within the search's bounds."""
    if isinstance(global_batch_tokens, bool) or not isinstance(global_batch_tokens, numbers.Integral):
        raise ScenarioError(
            "global_batch_tokens", f"must be a positive integer, got {_short(global_batch_tokens)}"
        )
    global_batch_tokens = int(global_batch_tokens)
    most = MAX_GPUS * MAX_MICRO_BATCH * MAX_ACCUM_STEPS  # dp x micro-batch x accumulation at most
    if global_batch_tokens > most * seq:
        raise ScenarioError(
            "global_batch_tokens",
            f"must be at most {most * seq:,} ({most:,} sequences of {seq} tokens: GPUs x micro-batch x "
            f"accumulation), got {_short(global_batch_tokens)}",
        )
    if global_batch_tokens < seq:
        raise ScenarioError(
            "global_batch_tokens",
            f"must be at least one sequence ({seq} tokens), got {global_batch_tokens}",
        )
    if global_batch_tokens % seq:
        raise ScenarioError(
            "global_batch_tokens",
            f"must be a whole number of sequences of {seq} tokens, got {global_batch_tokens} "
            f"(nearest: {global_batch_tokens // seq * seq} or {(global_batch_tokens // seq + 1) * seq})",
        )
    return global_batch_tokens // seq


def _method_bases(b: Scenario, methods: Sequence[str] | None) -> tuple[Scenario, ...]:
    """One base scenario per training method searched (``b``'s own by default)."""
    names = tuple(methods) if methods is not None else (b.method,)
    if not names or any(m not in METHODS for m in names):
        raise ScenarioError("methods", f"got {list(names)}; allowed values: {', '.join(METHODS)}")
    return tuple(b.replace(method=m) for m in dict.fromkeys(names))


def _all_candidates(
    bases: tuple[Scenario, ...],
    lays: list[Layout],
    space: SearchSpace,
    g_seq: int | None,
    limit: float,
    gpu_memory_bytes: int,
) -> dict[str, np.ndarray]:
    """Every base's candidates evaluated and timed, in one set of columns (``method``: the base's index)."""
    parts = []
    for k, bm in enumerate(bases):
        part = _search(bm, lays, space, g_seq, limit)
        part.update(time_columns(bm, part, space.optimizers))
        part["method"] = np.full(part["dp"].shape[0], k, dtype=np.int64)
        parts.append(part)
    # arrays, and one np.int64 (the card's memory)
    cols: dict[str, Any] = {key: np.concatenate([c[key] for c in parts]) for key in parts[0]}
    cols["gpu_memory_bytes"] = np.int64(gpu_memory_bytes)
    # a candidate past vector.SATURATION_BYTES (32 PiB) per GPU never fits any card (1 PiB at most)
    cols["fits"] = fits_mask(cols["device_total_bytes"], cols["overflow"], cols["oom"], limit)
    return cols


def plan(
    model: str | Mapping[str, Any] | None = None,
    gpu: str | Mapping[str, Any] | None = None,
    gpus: int | tuple[int, int] | Sequence[int] | None = None,
    *,
    base: Scenario | Mapping[str, Any] | None = None,
    global_batch_tokens: int | None = None,
    space: SearchSpace | None = None,
    headroom: float = DEFAULT_HEADROOM,
    top: int | None = 50,
    methods: Sequence[str] | None = None,
    check: bool | None = None,
    rank_by: str = "cost",
    train_tokens: float | None = None,
    price: float | None = None,
    widen: bool = True,
    **fixed: Any,
) -> Plan:
    """Search the layouts and memory knobs of a training job; keep those that fit with ``headroom``.

    ``model``, ``gpu`` and any scenario key in ``fixed`` (``method="qlora"``, ``seq_len=8192``,
    ``precision=...``, ``framework=...``, ``lora={...}``) are the fixed choices; ``gpus`` is one count, a
    list, or a ``(low, high)`` range (default: the GPUs of ``base``, else 1); ``global_batch_tokens`` keeps the global batch (micro-batch x
    accumulation x dp) at that many tokens. ``space`` narrows the knobs tried. ``methods`` (e.g.
    ``("full", "lora", "qlora")``) lets the search change the training method too; by default it is fixed.
    ``check=True`` (default: the ``MEMSIM_PLAN_CHECK`` environment variable set to 1) checks every listed
    candidate against ``estimate`` of its scenario and raises ``PlanCheckError`` on any difference.
    ``rank_by`` (``RANK_BY``): ``cost`` (default), ``time`` or ``memory``; ``train_tokens`` (default 1e9) and
    ``price`` (US$ per GPU-hour, default ``cost.PRICES``) set the hours and dollars columns. When nothing fits
    and ``widen`` (default), the search adds what users would try next (``WIDENING``): parameter offload when
    the offloads searched are the default ones, then LoRA/QLoRA when ``methods`` was not given; ``Plan.widened``
    says what it added.
    """
    t0 = time.perf_counter()
    _check_ranking(rank_by, train_tokens, price)
    headroom = check_headroom(headroom)
    b = _sft_base(base, model, gpu, fixed)
    space = space or SearchSpace()
    if gpus is None:
        gpus = b.parallel.world_size
    counts = gpu_counts(gpus)
    ctx = Context(b)
    _check_modelled(ctx)
    seq = ctx.seq_len
    g_seq = None
    if global_batch_tokens is not None:
        g_seq = _global_batch_sequences(global_batch_tokens, seq)
        global_batch_tokens = g_seq * seq  # a plain int (validated: a whole number of sequences)
    limit = ctx.gpu.memory_bytes * (1 - headroom)
    lays = layouts(b, counts, space)
    bases = _method_bases(b, methods)
    cols = _all_candidates(bases, lays, space, g_seq, limit, ctx.gpu.memory_bytes)
    widened: dict[str, list[str]] = {}
    if widen and not cols["fits"].any():
        space, bases, cols, widened = _widened(b, bases, lays, space, g_seq, limit, methods is None)
    result = Plan(
        bases[0],
        counts,
        space,
        headroom,
        cols,
        time.perf_counter() - t0,
        global_batch_tokens,
        top,
        bases=bases,
        rank_by=rank_by,
        train_tokens=train_tokens,
        price=price,
        widened=widened,
    )
    if check if check is not None else os.environ.get(CHECK_ENV, "") not in ("", "0"):
        result.check()
    return result


#: What ``plan`` adds when nothing fits, in order: parameter offload (to the default offloads), then the
#: methods that train less state than the base's (when the search was not given its methods).
WIDER_OFFLOAD = ("none", "optimizer", "optimizer+params")
WIDER_METHODS = {"full": ("lora", "qlora"), "lora": ("qlora",)}


def _widened(
    b: Scenario,
    bases: tuple[Scenario, ...],
    lays: list[Layout],
    space: SearchSpace,
    g_seq: int | None,
    limit: float,
    methods_free: bool,
) -> tuple[SearchSpace, tuple[Scenario, ...], dict[str, np.ndarray], dict[str, list[str]]]:
    """The search again with parameter offload, then other methods, until something fits (``WIDENING``)."""
    widened: dict[str, list[str]] = {}
    cols: dict[str, np.ndarray] = {}
    gpu_bytes = Context(b).gpu.memory_bytes
    if space.offload == SearchSpace().offload:
        space = replace(space, offload=WIDER_OFFLOAD)
        widened["offload"] = ["optimizer+params"]
        cols = _all_candidates(bases, lays, space, g_seq, limit, gpu_bytes)
    if (not cols or not cols["fits"].any()) and methods_free and b.method in WIDER_METHODS:
        bases = _method_bases(b, (b.method, *WIDER_METHODS[b.method]))
        widened["methods"] = list(WIDER_METHODS[b.method])
        cols = _all_candidates(bases, lays, space, g_seq, limit, gpu_bytes)
    if not cols:
        cols = _all_candidates(bases, lays, space, g_seq, limit, gpu_bytes)
    return space, bases, cols, widened


#: What ``plan`` may add to its space when nothing fits (``plan(widen=True)``).
WIDENING = {"offload": WIDER_OFFLOAD, "methods": WIDER_METHODS}


def _search(
    b: Scenario, lays: list[Layout], space: SearchSpace, g_seq: int | None, limit: float
) -> dict[str, np.ndarray]:
    """Every candidate of one base evaluated. Offload costs step time (PCIe traffic and a CPU optimizer
    step), so it is tried only for the GPU counts where nothing fits without it."""
    staged = "none" in space.offload and len(space.offload) > 1
    first = replace(space, offload=("none",)) if staged else space
    cols = _evaluated(b, candidates(b, lays, first, g_seq), space.optimizers)
    if staged:
        fits = fits_mask(cols["device_total_bytes"], cols["overflow"], cols["oom"], limit)
        fit_counts = set(cols["num_gpus"][fits].tolist())
        rest = [lay for lay in lays if lay.num_gpus not in fit_counts]
        if rest:
            more = replace(space, offload=tuple(o for o in space.offload if o != "none"))
            extra = _evaluated(b, candidates(b, rest, more, g_seq), space.optimizers)
            cols = {k: np.concatenate([cols[k], extra[k]]) for k in cols}
    return cols
