"""The counters of a traced run by replay: the tracker's storages, in order, through the caching allocator."""

from __future__ import annotations

import pytest

from memsim_widget.engine.context import Context
from memsim_widget.engine.counters.allocator import FREE, replay
from memsim_widget.scenario import Scenario
from memsim_widget.trace.replay import allocation_stream, replay_trace, traced_counters

torch = pytest.importorskip("torch")
MiB = 1024**2


def _toy_trace():
    """tests/trace/test_trace.py's 2-layer MLP (fp32, SGD, batch 16): its peak is 111,880 B of live tensors."""
    from memsim_widget.trace.run import trace_training
    from tests.trace.test_trace import _mlp, _mlp_batch, _mse

    return trace_training(_mlp, _mlp_batch, precision="fp32", optimizer="sgd", loss_fn=_mse, progress=False)


def test_allocation_stream_is_the_tracker_order_and_frees_every_freed_storage():
    r = _toy_trace()
    events = allocation_stream(r.tracker)
    allocs = [e for e in events if e[1] != FREE]
    frees = [e for e in events if e[1] == FREE]
    recs = [x for x in r.tracker.records if x.nbytes > 0]
    assert len(allocs) == len(recs) and len(frees) == sum(x.free_seq is not None for x in recs)
    live = set()
    for h, n, _ in events:  # a handle is freed only after it was allocated, and only once
        if n == FREE:
            assert h in live
            live.remove(h)
        else:
            live.add(h)
    # the parameters are registered first (setup): W1, b1, W2, b2 (fp32)
    assert [n for _, n, _ in allocs[:4]] == [4 * 64 * 128, 4 * 128, 4 * 128 * 32, 4 * 32]


def test_toy_replay_counts_the_small_and_large_pools_exactly():
    r = _toy_trace()
    res = replay(allocation_stream(r.tracker))
    # every storage is under 1 MiB: the small pool; the peak (111,880 B, each storage rounded up to 512 B) fits
    # one 2 MiB segment, so reserved is exactly one small segment
    assert res.ok and r.peak_bytes <= res.peak_allocated < r.peak_bytes + 512 * 20
    assert (res.peak_reserved, res.segments) == (2 * MiB, 1)


def test_replay_adds_the_workspaces_and_what_lives_outside_the_allocator():
    r = _toy_trace()
    sc = Scenario(model="llama-3.2-1b", precision="fp32", gpu="h200")
    res, outside = replay_trace(r.tracker, sc)
    bare = replay(allocation_stream(r.tracker))
    ws = Context(sc).gpu.cublas_workspace_bytes
    # the two cuBLAS workspaces (large requests, whole segments of their own: 2 MiB multiples)
    assert res.peak_allocated == bare.peak_allocated + 2 * ws
    assert res.peak_reserved == 2 * MiB + 2 * ws
    counters = traced_counters(sc, r)
    assert counters["device_total_bytes"] == counters["peak_reserved_bytes"] + outside
    assert counters["peak_reserved_bytes"] == res.peak_reserved


def test_the_replay_on_the_card_says_whether_the_step_runs_and_why_not():
    r = _toy_trace()
    roomy = traced_counters(Scenario(model="llama-3.2-1b", precision="fp32", gpu="h200"), r)["on_card"]
    assert roomy["runs"] and not roomy["only_by_releasing_cache"] and roomy["oom_cause"] is None
    # a card whose capacity is below what the context leaves cannot hold even the workspaces: the total
    tiny = {"name": "tiny", "memory_gib": 0.5}
    small = traced_counters(Scenario(model="llama-3.2-1b", precision="fp32", gpu=tiny), r)["on_card"]
    assert not small["runs"] and small["oom_cause"] == "total"


def test_on_card_text_names_the_cause():
    from memsim_widget.trace.replay import on_card_text

    base = {"capacity_bytes": 10 * 1024**3, "cache_releases": 0, "oom_request_bytes": None}
    assert on_card_text(None) == ""
    assert on_card_text({**base, "runs": True, "only_by_releasing_cache": False}).endswith(": runs")
    slow = on_card_text({**base, "runs": True, "only_by_releasing_cache": True, "cache_releases": 3})
    assert "free its cache" in slow and "slower" in slow
    frag = {**base, "runs": False, "only_by_releasing_cache": False, "oom_cause": "fragmentation"}
    frag.update(oom_request_bytes=3 * MiB, oom_largest_free_bytes=2 * MiB)
    assert "fragmentation" in on_card_text(frag) and "2.00 MiB" in on_card_text(frag)
    assert "more than is free" in on_card_text({**frag, "oom_cause": "total"})


def test_storages_carry_the_stream_of_their_scope_and_are_replayed_on_it():
    from memsim_widget.trace.tracker import MemoryTracker

    tracker = MemoryTracker()
    with tracker:
        a = torch.empty(3 * MiB // 4)  # 3 MiB, compute stream
        with tracker.role_scope("collective", stream=2):
            b = torch.empty(3 * MiB // 4)  # 3 MiB, FSDP's reduce-scatter stream
        c = torch.empty(3 * MiB // 4)
    recs = [r for r in tracker.records if r.nbytes]
    assert [(r.stream, r.role) for r in recs] == [(0, None), (2, "collective"), (0, None)]
    # a and c share one 20 MiB segment of stream 0; b needs its own on stream 2
    assert replay(allocation_stream(tracker)).peak_reserved == 40 * MiB
    del a, b, c


def test_the_autograd_threads_workspace_follows_the_first_backward_matmul():
    """The autograd engine runs a CUDA backward on its own thread, whose cuBLAS handle gets its workspace from
    the caching allocator at its first cuBLAS call (CublasHandlePool.cpp): right after the output of the first
    matmul of the first backward. The forward thread's comes when the first forward starts."""
    from memsim_widget.trace.replay import CUBLAS_OPS

    r = _toy_trace()
    tracker = r.tracker
    events = allocation_stream(tracker, (7 * MiB, 9 * MiB), autograd_workspaces=1)
    order = [h for h, size, _ in events if size != FREE]
    recs = [(i, x) for i, x in enumerate(tracker.records) if x.nbytes > 0]
    backward = tracker.mark_seq(1, "backward")
    first_mm = min((x.alloc_seq, i) for i, x in recs if x.alloc_seq >= backward and x.op in CUBLAS_OPS)[1]
    forward = tracker.mark_seq(1, "forward")
    before_forward = sum(1 for _, x in recs if x.alloc_seq < forward)
    assert order.index(("workspace", 0)) == before_forward  # the first allocation of the first forward
    assert order.index(("workspace", 1)) == order.index(first_mm) + 1
    sizes = {h: size for h, size, _ in events if size != FREE}
    assert sizes[("workspace", 0)] == 7 * MiB and sizes[("workspace", 1)] == 9 * MiB
    # without the split (or without a backward matmul) every workspace comes at the first forward
    both = [h for h, size, _ in allocation_stream(tracker, (7 * MiB, 9 * MiB)) if size != FREE]
    assert set(both[before_forward : before_forward + 2]) == {("workspace", 0), ("workspace", 1)}
