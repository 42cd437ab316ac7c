"""The rules the engine and the planner share (issue 28: each written once, over numbers or arrays) give, per
element of an array, exactly what they give for that element as Python numbers -- the engine's path. The
planner's byte-exact tests (test_plan_vector, test_plan_equals_estimate) prove the whole; these pin each rule."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget.engine.arith import first_largest, maximum, minimum, negate, to_int, where
from memsim_widget.engine.counters.overhead import (
    FRAGMENTATION_PERSISTENT,
    FRAGMENTATION_TRANSIENT,
    FRAGMENTATION_VARIABLE,
    NCCL_PER_COMMUNICATOR,
    capped_reserved,
    communicator_count,
    group_sizes,
    nccl_bytes,
    outside_bytes,
    waste_bytes,
)
from memsim_widget.engine.items import allocated_of
from memsim_widget.engine.parallel.pipeline import (
    loss_count,
    outputs_held_count,
    pending_send_count,
    receive_count,
    through_step_count,
)
from memsim_widget.engine.parallel.schedule import (
    first_carrying_stage,
    grads_carried,
    in_flight,
    pipeline_carries_grads,
)
from memsim_widget.engine.step.moments import ACTIVATION_GROUPS
from memsim_widget.engine.step.timeline import (
    ActivationKnobs,
    StageCounts,
    activation_group_table,
    layer0_sets,
    resident_count,
    scaled_term,
)

SCHEDULES = ("1f1b", "interleaved", "gpipe")


def test_on_numbers_the_helpers_are_pythons_own():
    """min/max keep the first of equals and its type; a conditional picks without converting; not is not ~."""
    assert (type(minimum(2, 2.0)), type(maximum(2.0, 2))) == (int, float)
    assert where(True, 3, 0.5) == 3 and type(where(True, 3, 0.5)) is int
    assert (negate(True), negate(False)) == (False, True)
    assert negate(np.array([True, False])).tolist() == [False, True]
    assert (to_int(2.9), to_int(-0.5), type(to_int(3.0))) == (2, 0, int)  # int(): toward zero
    assert to_int(np.array([2.9, -0.5])).tolist() == [2, 0]


@st.composite
def stages(draw):
    """(p, m, v, schedule, stage): a pipeline layout the scenario accepts (interleaved: m a multiple of p)."""
    schedule = draw(st.sampled_from(SCHEDULES))
    p = draw(st.integers(1, 16))
    v = draw(st.integers(2, 4)) if schedule == "interleaved" else 1
    m = p * draw(st.integers(1, 8)) if schedule == "interleaved" else draw(st.integers(1, 64))
    return p, m, v, schedule, draw(st.integers(0, p - 1))


def by_schedule(rows):
    """(schedule, v, its rows) per schedule drawn, keeping the rows with its first row's chunks ``v``: the rows
    one array call can take (a schedule and a chunk count are per call, not per element)."""
    for schedule in SCHEDULES:
        sel = [r for r in rows if r[3] == schedule]
        if sel:
            v = sel[0][2]
            yield schedule, v, [r for r in sel if r[2] == v]


@settings(max_examples=300)
@given(st.lists(stages(), min_size=1, max_size=20), st.booleans(), st.integers(1, 80), st.booleans())
def test_the_pipeline_rules_give_per_element_what_they_give_one_stage(rows, returned, layers, offloading):
    for schedule, v, sel in by_schedule(rows):
        p, m, s = (np.array([r[k] for r in sel]) for k in (0, 1, 4))
        first, last = s == 0, s == p - 1
        f = in_flight(p, m, schedule, v, s)
        n_loss = loss_count(p, m, schedule, last)
        res = resident_count(layers * f, offloading)
        arrays = {
            "in_flight": f,
            "carries": pipeline_carries_grads(p, m, f),
            "carried": grads_carried(np.ones_like(p), pipeline_carries_grads(p, m, f), False),
            "receive": receive_count(p, m, v, first, last),
            "send": pending_send_count(p, m, v, first),
            "loss": n_loss,
            "held": outputs_held_count(p, m, f, last, n_loss, returned),
            "step": np.zeros(len(sel)) + through_step_count(p, m, last, returned),
            "resident": res,
            "layer0": layer0_sets(first, f, res, layers * f),
        }
        for j, (pj, mj, _, _, sj) in enumerate(sel):
            fj = in_flight(pj, mj, schedule, v, sj)
            assert type(fj) is float
            nl = loss_count(pj, mj, schedule, sj == pj - 1)
            rj = resident_count(layers * fj, offloading)
            one = {
                "in_flight": fj,
                "carries": pipeline_carries_grads(pj, mj, fj),
                "carried": grads_carried(1, pipeline_carries_grads(pj, mj, fj), False),
                "receive": receive_count(pj, mj, v, sj == 0, sj == pj - 1),
                "send": pending_send_count(pj, mj, v, sj == 0),
                "loss": nl,
                "held": outputs_held_count(pj, mj, fj, sj == pj - 1, nl, returned),
                "step": through_step_count(pj, mj, sj == pj - 1, returned),
                "resident": rj,
                "layer0": layer0_sets(sj == 0, fj, rj, layers * fj),
            }
            for name, x in one.items():
                assert arrays[name][j] == x, (name, pj, mj, v, schedule, sj)


@settings(max_examples=200)
@given(st.lists(st.tuples(*(st.sampled_from((1, 2, 3, 8)) for _ in range(5))), min_size=1, max_size=30))
def test_communicators_counted_on_arrays_are_the_groups_named_on_numbers(layouts):
    cols = [np.array(c) for c in zip(*layouts, strict=True)]
    counts = communicator_count(*cols)
    for j, lay in enumerate(layouts):
        named = [g for g, size in group_sizes(*lay).items() if size > 1]
        assert counts[j] == communicator_count(*lay) == len(named)


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.integers(0, 2**30), st.integers(0, 2**20), st.booleans(), st.integers(1, 64)),
        min_size=1,
        max_size=20,
    ),
    st.sampled_from((0.5, 1.0, 2.0, 3.0, 7.5, 32.0)),
    st.sampled_from((0.0, 1.0, 2.0)),
)
def test_a_scaled_term_and_its_allocation_on_arrays_are_those_on_numbers(terms, factor, first):
    tb, fb, skip, tens = (np.array([t[k] for t in terms], dtype=np.float64) for k in range(4))
    nb, nt = scaled_term(tb, fb, skip > 0, tens, factor, first)
    nb, nt = np.trunc(nb).astype(np.int64), np.maximum(1, np.trunc(nt)).astype(np.int64)
    alloc = np.where(nb > 0, allocated_of(nb, nt), 0)
    for j, (b, f0, s, t) in enumerate(terms):
        b1, t1 = scaled_term(b, f0, s, t, factor, first)
        b1, t1 = int(b1), max(1, int(t1))
        assert (nb[j], nt[j]) == (b1, t1)
        assert alloc[j] == (allocated_of(b1, t1) if b1 > 0 else 0)


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.integers(0, 2**50), st.integers(0, 2**50), st.integers(0, 2**40), st.integers(0, 2**50)),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from(
        (
            (FRAGMENTATION_TRANSIENT, 0.0),
            (FRAGMENTATION_TRANSIENT, FRAGMENTATION_VARIABLE),
            (0.02, 0.0),
        )
    ),
)
def test_the_fitted_pool_and_its_cap_on_arrays_are_those_on_numbers(pools, rates):
    """A moment's unused-but-reserved bytes and the capped reserved counter (engine/counters/overhead): per element of
    int64 columns, what one rank's Python ints give (the long-lived and loss bytes are parts of the allocated)."""
    rows = [(a + p + lo, p, lo, cap) for a, p, lo, cap in pools]
    alloc, pers, loss, cap = (np.array([r[k] for r in rows], dtype=np.int64) for k in range(4))
    waste = waste_bytes(alloc, pers, loss, rates)
    assert waste.dtype == np.int64
    reserved = capped_reserved(alloc, alloc + waste, cap)
    for j, (a, p, lo, c) in enumerate(rows):
        w = waste_bytes(a, p, lo, rates)
        assert type(w) is int and waste[j] == w == int(
            FRAGMENTATION_PERSISTENT * p + rates[0] * (a - p) + rates[1] * lo
        )
        assert reserved[j] == capped_reserved(a, a + w, c) == max(a, min(a + w, c))


class SumScaler:
    """A ``Scaler`` over made-up terms: a group's bytes are its terms' bytes times the factor, less layer 0's
    share where ``first`` (numbers, or (rows, 1) columns)."""

    none = 0

    def __call__(self, terms, factor, label="", first=0):
        nbytes = 1000 + 37 * len(terms) + 11 * sum(map(ord, terms)) % 97  # distinct per term group
        return where(factor > 0, nbytes * factor - 5 * first * (factor > 0), 0)

    def raw(self, group):
        return group


@settings(max_examples=200)
@given(st.lists(stages(), min_size=1, max_size=12), st.data())
def test_the_activation_groups_on_columns_are_those_of_each_stage(rows, data):
    """``activation_group_table`` on (rows, 1) columns gives, row by row, what it gives one stage in numbers:
    the rule is written over numpy-compatible arithmetic (the planner's byte-exact tests prove the whole)."""
    flags = [tuple(data.draw(st.booleans()) for _ in range(2)) for _ in rows]  # (ckpt, shared)
    knobs = {
        "offloading": data.draw(st.booleans()),
        "offloaded": data.draw(st.sampled_from([None, 0, 2, 5])),  # every layer, or the first N
        "through_step": data.draw(st.booleans()),
    }
    for schedule in SCHEDULES:
        sel = [(r, fl) for r, fl in zip(rows, flags, strict=True) if r[3] == schedule]
        if not sel:
            continue
        v = sel[0][0][2]
        sel = [(r, fl) for r, fl in sel if r[2] == v]
        layers = data.draw(st.integers(0, 8))
        one = []
        for (p, m, _, _, s), (ckpt, shared) in sel:
            f = in_flight(p, m, schedule, v, s)
            held = layers * f
            c = StageCounts(p, m, layers, f, s == 0, s == p - 1, held, held, schedule, v)
            one.append(
                activation_group_table(SumScaler(), c, ActivationKnobs(ckpt and layers > 0, shared, **knobs))
            )
        p, m, s = (np.array([r[k] for r, _ in sel])[:, None] for k in (0, 1, 4))
        ckpt, shared = (np.array([fl[k] for _, fl in sel])[:, None] for k in (0, 1))
        f = in_flight(p, m, schedule, v, s)
        c = StageCounts(
            p, m, np.full(p.shape, layers), f, s == 0, s == p - 1, layers * f, layers * f, schedule, v
        )
        cols = activation_group_table(SumScaler(), c, ActivationKnobs(ckpt & (layers > 0), shared, **knobs))
        assert set(cols) == set(ACTIVATION_GROUPS)
        for name, col in cols.items():
            got = np.broadcast_to(col, p.shape)[:, 0].tolist()
            assert got == [g[name] for g in one], (name, schedule)


@settings(max_examples=300)
@given(st.integers(1, 12), st.data())
def test_the_first_largest_on_arrays_is_max_of_each_row(width, data):
    """The peak moment and the larger of two instants (engine/core, engine/step/timeline; plan/vector on
    columns): per row, the value ``max`` returns and the index of the first that holds it. Values are drawn
    from a few small ones as well as large ones, so ties (the first of equals wins) are common."""
    value = st.one_of(st.integers(-1, 3), st.integers(0, 2**50))
    rows = data.draw(st.lists(st.lists(value, min_size=width, max_size=width), min_size=1, max_size=20))
    best, at = first_largest([np.array(col, dtype=np.int64) for col in zip(*rows, strict=True)])
    at = np.broadcast_to(at, best.shape)  # one value: index 0, not an array
    for j, row in enumerate(rows):
        b, a = first_largest(row)
        assert type(b) is int and type(a) is int
        assert (best[j], at[j]) == (b, a) == (max(row), row.index(max(row)))


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.integers(0, 2**31), st.sampled_from((0, 1, 2, 3, 4, 5)), st.integers(0, 2**45)),
        min_size=1,
        max_size=30,
    )
)
def test_the_bytes_outside_the_allocator_on_arrays_are_those_on_numbers(rows):
    """nvidia-smi's bytes outside the caching allocator (context, NCCL per communicator, paged states): per
    element of int64 columns, what one rank's Python ints give, the NCCL part the engine's item bytes."""
    ctx, comms, paged = (np.array([r[k] for r in rows], dtype=np.int64) for k in range(3))
    got = outside_bytes(ctx, comms, paged)
    assert got.dtype == np.int64
    for j, (c, n, pg) in enumerate(rows):
        one = outside_bytes(c, n, pg)
        assert type(one) is int and got[j] == one == c + n * NCCL_PER_COMMUNICATOR + pg
        assert nccl_bytes(n) == n * NCCL_PER_COMMUNICATOR


@settings(max_examples=300)
@given(st.lists(stages(), min_size=1, max_size=20))
def test_the_first_carrying_stage_on_arrays_is_that_of_each_pipeline(rows):
    """The planner's extra middle stage (engine/parallel/schedule ``first_carrying_stage``): per element, what
    one pipeline's numbers give, and that is the lowest stage >= 1 where ``in_flight`` drops below the
    micro-batches (-1 where none does)."""
    for schedule, v, sel in by_schedule(rows):
        p, m = (np.array([r[k] for r in sel]) for k in (0, 1))
        got = first_carrying_stage(p, m, schedule, v)
        for j, (pj, mj, _, _, _) in enumerate(sel):
            one = first_carrying_stage(pj, mj, schedule, v)
            below = [s for s in range(1, pj) if in_flight(pj, mj, schedule, v, s) < mj]
            assert type(one) is int and got[j] == one == (below[0] if below else -1), (pj, mj, schedule)
