"""``reach``: how far a job's micro-batch or sequence can be pushed on its own GPUs when the layout and the
memory knobs are free, and the cheapest layout and knobs that get there.

``recommend`` answers "the largest micro-batch / sequence that fits" twice: on the scenario's own layout (its
``max_micro_batch``/``max_seq_len``, ``estimate`` by bisection) and here, over every layout of the same number
of GPUs and every knob of the planner's space (the candidates of ``plan.search.plan``, global batch free: one
micro-batch per replica and step, as many as the pipeline needs), with the vectorised engine
(``plan.vector.evaluate``). Memory per GPU grows with the micro-batch and with the sequence for every layout and
knob setting (``tests/engine/test_invariants.py``), so:

1. the *frugal* candidates (full checkpointing, chunked loss, the furthest offload of the space: usually the
   ones that go furthest) climb first: a secant search on their least memory, kept within a bracket that
   halves when the secant stalls, each step evaluating only those that fitted at the last stop that fitted;
2. every candidate is evaluated at the stop they reached; those that fit there are evaluated at the next
   stop, and if any still fits they climb on (so the answer is the largest over the whole space, not only
   over the frugal ones);
3. the candidates that fit at the answer are ranked as ``plan`` ranks them (``Plan.ranking``: modelled
   tokens/s per GPU); the first is the answer's layout. Its figures equal ``estimate``'s
   (``tests/plan/test_answers_properties.py``).

``fewest_gpus`` answers "the fewest GPUs" the same way, with ``plan.search.plan`` itself over powers of two of
GPU counts (the job kept: model, method, sequence; layouts and knobs of the space free, global batch free):
the smallest count at which any candidate fits, and the candidate ``plan`` ranks first there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from memsim_widget.engine.context import Context
from memsim_widget.engine.estimate import DEFAULT_HEADROOM, Estimate
from memsim_widget.plan.search import Plan, _check_modelled, _evaluated, _sft_base
from memsim_widget.plan.space import SearchSpace, candidates, layouts
from memsim_widget.plan.timing import time_columns
from memsim_widget.plan.vector import CHECKPOINTING, LOSSES, OFFLOADS, evaluate, fits_mask
from memsim_widget.scenario import Scenario

#: What ``reach`` can push: the scenario key, and the candidates' column it sets (None: the base's key).
REACH_KEYS = {"micro_batch_size": "micro_batch", "seq_len": None}


@dataclass(frozen=True)
class Reach:
    """The largest value of ``key`` that fits on ``scenario``'s GPUs (the fewest GPUs for ``key="num_gpus"``),
    and the cheapest candidate there."""

    key: str
    value: int
    #: The next stop beyond ``value`` that no candidate of the space fits: above it for the largest micro-batch
    #: / sequence (``value + step``; None at the top), below it for the fewest GPUs (the next smaller count
    #: searched; None at one GPU).
    next_stop: int | None
    scenario: Scenario
    estimate: Estimate
    tokens_per_gpu_s: float
    #: Candidates of the space (layouts and knobs) that fit at ``value``.
    reaching: int

    @property
    def layout(self) -> str:
        """The candidate's layout and knobs in words (``layout_words``)."""
        return layout_words(self.scenario)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``memsim recommend --json``'s ``max_micro_batch_searched`` and ``max_seq_len_searched``)."""
        par = self.scenario.parallel
        return {
            "value": self.value,
            "next_stop": self.next_stop,
            "num_gpus": par.world_size,
            "dp": par.dp,
            "tp": par.tp,
            "pp": par.pp,
            "cp": par.cp,
            "ep": par.ep,
            "zero": par.zero,
            "sequence_parallel": par.sequence_parallel,
            "offload": par.offload,
            "micro_batch_size": self.scenario.micro_batch_size,
            "seq_len": self.scenario.seq_len,
            "activation_checkpointing": self.scenario.activation_checkpointing,
            "loss": self.scenario.loss,
            "optimizer": self.scenario.optimizer,
            "layout": self.layout,
            "device_total_bytes": self.estimate.device_total_bytes,
            "tokens_per_gpu_s": round(self.tokens_per_gpu_s, 3),
            "reaching": self.reaching,
            "scenario": self.scenario.to_dict(),
        }


def layout_words(s: Scenario) -> str:
    """A candidate's layout and memory knobs in one line (recommend's planner option, its reach answers)."""
    p = s.parallel
    return (
        f"dp={p.dp} tp={p.tp} pp={p.pp} cp={p.cp} ep={p.ep} ZeRO-{p.zero}{' sp' if p.sequence_parallel else ''}, "
        f"micro-batch {s.micro_batch_size}, checkpointing {s.activation_checkpointing}, {s.loss} loss, "
        f"{s.optimizer}, offload {p.offload}"
    )


def reach(
    scenario: Scenario,
    key: str,
    space: SearchSpace,
    *,
    step: int = 1,
    top: int,
    headroom: float = DEFAULT_HEADROOM,
) -> Reach | None:
    """The largest multiple of ``step`` up to ``top`` that ``key`` (``REACH_KEYS``) can take with some layout
    and knobs of ``space`` on ``scenario``'s GPUs (method, model, card and the other keys kept; the sequence
    at micro-batch 1), with the cheapest candidate there; None when none fits at ``step``. Raises
    ``ScenarioError`` where the planner does not model the scenario (an RL objective, a calibrated model)."""
    column = REACH_KEYS[key]
    b = _sft_base(scenario, None, None, {}).replace(**{key: step})  # layouts at the first stop: cp divides it
    ctx = Context(b)
    _check_modelled(ctx)
    n = scenario.parallel.world_size
    space = replace(space, micro_batch=(1,))
    cols = candidates(b, layouts(b, (n,), space), space, None)
    limit = ctx.gpu.memory_bytes * (1 - headroom)

    def at(k: int) -> tuple[Scenario, dict[str, int]]:
        return (b, {column: k * step}) if column else (b.replace(**{key: k * step}), {})

    def memory(k: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Memory per GPU of the candidates ``idx`` at stop ``k``, and whether each fits."""
        base, set_ = at(k)
        sub = {name: col[idx] for name, col in cols.items()}
        sub.update({name: np.full(idx.shape[0], v, dtype=np.int64) for name, v in set_.items()})
        ev = evaluate(base, sub, space.optimizers)
        return ev.device_total_bytes, ev.fits(limit)

    everyone = np.arange(cols["dp"].shape[0])
    hi = top // step
    found = _climb(memory, limit, _frugal(cols, space), hi) or _climb(memory, limit, everyone, hi)
    if found is None:
        return None
    k = found
    while True:  # every candidate at the stop reached; those that fit there, one stop further
        fits = everyone[memory(k, everyone)[1]]
        if k == hi or not (beyond := fits[memory(k + 1, fits)[1]]).size:
            break
        k = _climb(memory, limit, beyond, hi, start=k + 1) or k + 1
    base, set_ = at(k)
    p = _ranked(base, cols, fits, set_, space, headroom, limit)
    i = int(p.ranking[0])
    return Reach(key, k * step, (k + 1) * step if k < hi else None, p.scenario(i), p.estimate(i),
                 float(p.columns["tokens_per_gpu_s"][i]), int(fits.size))  # fmt: skip


def fewest_gpus(
    scenario: Scenario, space: SearchSpace, *, top: int, headroom: float = DEFAULT_HEADROOM
) -> Reach | None:
    """The fewest GPUs, a power of two up to ``top``, at which some candidate of ``space`` fits (``plan`` of
    ``scenario``'s job: model, method, card and sequence kept, layouts and knobs free, global batch free:
    one micro-batch per replica and step), with the candidate ``plan`` ranks first there; None when none fits
    on ``top`` GPUs. Counts are tried upwards from one, each by one ``plan`` call; after three that fit
    nothing, ``top`` is tried once, so a job that fits no count ends in a few calls (memory per GPU does not
    grow with the count: ZeRO-3 shards over data parallelism, tp/pp/cp split the layers and the sequence).
    Raises ``ScenarioError`` where the planner does not model the scenario."""
    from memsim_widget.plan.search import plan

    counts = [1 << k for k in range(max(top, 1).bit_length()) if 1 << k <= top]

    def at(n: int) -> Plan:
        return plan(base=scenario, gpus=n, space=space, headroom=headroom, top=1, widen=False)

    for k, n in enumerate(counts):
        if k == 3 and n < counts[-1] and not at(counts[-1]).fitting:
            return None
        p = at(n)
        if p.fitting:
            i = int(p.ranking[0])
            return Reach("num_gpus", n, counts[k - 1] if k else None, p.scenario(i), p.estimate(i),
                         float(p.columns["tokens_per_gpu_s"][i]), int(p.fitting))  # fmt: skip
    return None


def _frugal(cols: dict[str, np.ndarray], space: SearchSpace) -> np.ndarray:
    """The candidates with the knobs that save most memory in ``space`` (full checkpointing, chunked loss,
    its furthest offload), the first to climb; all of them where the space has none such."""
    mask = np.ones(cols["dp"].shape[0], dtype=bool)
    for name, code in (
        ("checkpointing", CHECKPOINTING.index("full")),
        ("loss", LOSSES.index("chunked")),
        ("offload", max(OFFLOADS.index(o) for o in space.offload)),
    ):
        narrower = mask & (cols[name] == code)
        if narrower.any():
            mask = narrower
    return np.nonzero(mask)[0]


def _ranked(
    base: Scenario,
    cols: dict[str, np.ndarray],
    idx: np.ndarray,
    set_: dict[str, int],
    space: SearchSpace,
    headroom: float,
    limit: float,
) -> Plan:
    """A ``Plan`` of the candidates ``idx`` (with ``set_``'s columns) on ``base``, ranked as ``plan`` ranks."""
    sub: dict[str, Any] = {name: col[idx] for name, col in cols.items()}  # arrays, and one np.int64
    sub.update({name: np.full(idx.shape[0], v, dtype=np.int64) for name, v in set_.items()})
    sub = _evaluated(base, sub, space.optimizers)
    sub.update(time_columns(base, sub, space.optimizers))
    sub["gpu_memory_bytes"] = np.int64(Context(base).gpu.memory_bytes)
    sub["fits"] = fits_mask(sub["device_total_bytes"], sub["overflow"], sub["oom"], limit)
    return Plan(base, (int(cols["num_gpus"][0]),), space, headroom, sub, 0.0, None, 1)


def _climb(
    memory: Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray]],
    limit: float,
    alive: np.ndarray,
    hi: int,
    start: int = 1,
) -> int | None:
    """The largest stop k in [start, hi] at which some candidate of ``alive`` fits (None: none at ``start``).

    Each step evaluates only the candidates that fitted at the last stop that fitted. The next stop is the
    secant guess of where their least memory crosses ``limit``: extrapolated from the last two stops that
    fitted (doubling before there are two) until one does not fit, then interpolated within the bracket; the
    bracket's middle after a secant step that did not halve it (after two, a memory that is flat then jumps
    took up to 8 stops more than doubling then bisection: tests/plan/test_reach.py).
    """
    if hi < start or not alive.size:
        return None
    mem, ok = memory(start, alive)
    if not ok.any():
        return None
    alive, good, m_good = alive[ok], start, float(mem[ok].min())
    bad, m_bad = hi + 1, float("inf")
    last: tuple[int, float] | None = None  # the stop that fitted before ``good``
    stalls = 0
    while bad - good > 1:
        width = bad - good
        if bad > hi:  # no stop has failed yet: extrapolate
            if last is not None and m_good > last[1]:
                guess = good + int((limit - m_good) * (good - last[0]) // (m_good - last[1]))
            else:
                guess = good * 2
        elif stalls < 1 and m_bad != float("inf"):
            guess = good + int((limit - m_good) * width // max(m_bad - m_good, 1.0))
        else:
            guess, stalls = (good + bad) // 2, 0
        k = min(max(guess, good + 1), bad - 1)
        mem, ok = memory(k, alive)
        if ok.any():
            last = (good, m_good)
            alive, good, m_good = alive[ok], k, float(mem[ok].min())
        else:
            bad, m_bad = k, float(mem.min())
        if bad <= hi and 2 * (bad - good) > width:
            stalls += 1
    return good
