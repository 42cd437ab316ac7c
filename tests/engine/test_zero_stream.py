"""DeepSpeed ZeRO-1/2 ranks in the replay (``engine/counters/zero_stream.py``; docs/allocator.md "DeepSpeed
ZeRO-1/2 ranks"): the partition geometry and buffer sizes of deepspeed 0.19.8's ``stage_1_and_2.py``, and the
engine's stream held to a CPU run of the real optimizer (``benchmarks/zero_trace.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.counters.alloc_stream import rank_stream, replay_stream
from memsim_widget.engine.counters.allocator import FREE, AllocatorConf, CachingAllocator
from memsim_widget.engine.counters.replayable import replayable
from memsim_widget.engine.counters.zero_stream import ALIGNMENT, partition_slices, rank_zero
from memsim_widget.engine.frameworks import allocator_conf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from fidelity_cases import DEEPSPEED_SMALL_LLAMA  # noqa: E402

#: a reduce_bucket_size under the model's gradients (several reduces a backward)
BUCKET_SMALL = 20_000_000
#: the small Llama of benchmarks/zero_trace.py: 44,367,872 decaying parameters, 9 norms of 512 (4,608)
SCENARIO = {
    **DEEPSPEED_SMALL_LLAMA,
    "parallel": {"dp": 4, "zero": 2},
    "reserved_model": "replay",
}


def _ctx(**over: object) -> Context:
    return Context(estimate({**SCENARIO, **over}).scenario)


def test_partition_of_the_small_llama_at_dp4() -> None:
    """Rank 0's partition of the decaying group: 44,367,872 elements (padded to a multiple of 2 x 4) / 4 =
    11,091,968, all inside the 16,384,000-element embedding; the norms' group 4,608 / 4 = 1,152 elements over
    the first three norms (512, 512, 128): the sizes the traced run allocates (44,367,872 B fp32 master,
    32,771,072 B of bf16 grads_in_partition: the embedding and three norms whole)."""
    z = rank_zero(_ctx(), _ctx().stages[0])
    assert sum(z.groups[0]) == 44_367_872 and sum(z.groups[1]) == 4_608
    assert z.partitions == (11_091_968, 1_152)
    assert z.slices[0] == ((0, 11_091_968),)
    assert z.slices[1] == ((0, 512), (1, 512), (2, 128))
    assert z.grads_in_partition * z.model_bytes == 32_771_072


def test_stream_writes_deepspeeds_buffers() -> None:
    """The wrap's flat bf16 buffer (88,735,744 B), partition clone (22,183,936 B) and fp32 master (44,367,872 B);
    in each backward the ipg buffer of 5e8 bf16 elements (1,000,000,000 B whatever the model's size), the
    epilogue's flattened bucket (every gradient: 88,744,960 B) and grads_in_partition; at the step the norm's
    fp64 cast of the embedding's slice (88,735,744 B)."""
    ctx = _ctx()
    s = rank_stream(ctx, ctx.stages[0])
    sizes = [size for _, size, _ in s.events if size != FREE]
    for size, count in (
        (88_735_744, 1 + 2),
        (22_183_936, 1),
        (1_000_000_000, 2),
        (88_744_960, 2),
        (32_771_072, 2),
    ):
        assert sizes.count(size) == count, size


def test_overlap_comm_makes_a_second_ipg_buffer_with_the_first() -> None:
    """Under ``overlap_comm`` ``setup_buckets`` makes two ipg buffers of reduce_bucket_size bf16 elements, one right
    after the other, and ``_release_ipg_buffers`` frees both: 2 x 1,000,000,000 B per backward, allocated back to
    back and freed together (as the CPU trace does, benchmarks/zero_trace.py --overlap)."""
    ctx = _ctx(parallel={"dp": 4, "zero": 2, "overlap_comm": True})
    events = rank_stream(ctx, ctx.stages[0]).events
    ipg = [i for i, (_, size, _) in enumerate(events) if size == 1_000_000_000]
    assert len(ipg) == 4 and ipg[1] == ipg[0] + 1 and ipg[3] == ipg[2] + 1
    handles = {events[i][0] for i in ipg}
    frees = [i for i, (h, size, _) in enumerate(events) if size == FREE and h in handles]
    assert len(frees) == 4 and frees[1] == frees[0] + 1 and frees[3] == frees[2] + 1


def _sizes_by_phase(ctx: Context) -> dict[str, list[int]]:
    """The stream's events per phase (allocations as bytes, frees as minus the bytes), phases of one step's
    micro-batches and its optimizer step (the layers' sub-phases folded into their micro-batch)."""
    s = rank_stream(ctx, ctx.stages[0])
    size = {h: n for h, n, _ in s.events if n != FREE}
    marks = dict(s.marks)
    out: dict[str, list[int]] = {}
    phase = ""
    for i, (h, n, _) in enumerate(s.events):
        if i in marks:
            phase = " ".join(marks[i].split()[:4]) if "micro-batch" in marks[i] else marks[i]
        out.setdefault(phase, []).append(n if n != FREE else -size[h])
    return out


def test_zero1_accumulation_keeps_the_gradients_and_the_ipg_buffer_to_the_boundary() -> None:
    """ZeRO-1 over 2 micro-batches (``reduce_ready_partitions_and_remove_grads`` runs only at the boundary): the
    first micro-batch makes the ipg buffer (1,000,000,000 B) and keeps every bf16 gradient whole (the 32,768,000 B
    embedding and head among them) with no reduce (no flattened bucket, no grads_in_partition) and no epilogue;
    the second adds its new gradients in place (made and freed), reduces once (the 88,744,960 B flattened
    bucket, the 32,771,072 B grads_in_partition) and frees the buffer: one ipg buffer a step, as traced."""
    ph = _sizes_by_phase(_ctx(grad_accum_steps=2, parallel={"dp": 4, "zero": 1}))
    first, second = ph["step 1 micro-batch 1"], ph["step 1 micro-batch 2"]
    assert first.count(1_000_000_000) == 1 and -1_000_000_000 not in first
    assert 88_744_960 not in first and 32_771_072 not in first
    assert first.count(32_768_000) - first.count(-32_768_000) == 2  # embedding and head gradients kept
    assert 1_000_000_000 not in second and second.count(-1_000_000_000) == 1
    assert second.count(88_744_960) == 1 and second.count(32_771_072) == 1


def test_zero2_accumulation_copies_into_a_new_grads_in_partition() -> None:
    """ZeRO-2 over 2 micro-batches reduces both (an ipg buffer and a flattened bucket each); the second makes a
    new grads_in_partition (32,771,072 B) and frees the first after its ipg buffer; the step frees the second."""
    ph = _sizes_by_phase(_ctx(grad_accum_steps=2, parallel={"dp": 4, "zero": 2}))
    first, second = ph["step 1 micro-batch 1"], ph["step 1 micro-batch 2"]
    for m in (first, second):
        assert m.count(1_000_000_000) == m.count(-1_000_000_000) == 1 and m.count(88_744_960) == 1
    assert first.count(32_771_072) == 1 and -32_771_072 not in first
    assert second.count(32_771_072) == second.count(-32_771_072) == 1
    assert second.index(-32_771_072) > second.index(-1_000_000_000)
    assert ph["step 1 optimizer step"].count(-32_771_072) == 1


@pytest.mark.parametrize(
    ("parallel", "bucket"),
    [
        ({}, 500_000_000),
        ({"reduce_bucket_size": 20_000_000}, 20_000_000),
        ({"reduce_bucket_size": 5e8}, 500_000_000),
        ({"reduce_bucket_size": "auto"}, 512 * 512),  # HF / accelerate: hidden_size x hidden_size
    ],
)
@pytest.mark.parametrize("overlap", [False, True])
def test_the_reduce_bucket_item_is_the_configs_buffers(parallel: dict, bucket: int, overlap: bool) -> None:
    """The states' reduce-bucket item (the fitted path) is reduce_bucket_size bf16 elements, twice under
    ``overlap_comm``; the replayed rank's ipg buffers are the same size."""
    from memsim_widget.engine.states.gradients import ZERO_BUCKET_ITEM

    par = {"dp": 4, "zero": 2, "overlap_comm": overlap, **parallel}
    base = {k: v for k, v in SCENARIO.items() if k != "reserved_model"}
    r = estimate({**base, "parallel": par})
    item = next(i for i in r.ranks[0].items if i.item == ZERO_BUCKET_ITEM)
    assert item.bytes == (2 if overlap else 1) * bucket * 2
    z = rank_zero(_ctx(parallel=par), _ctx(parallel=par).stages[0])
    assert (z.bucket, z.buffers) == (bucket, 2 if overlap else 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=12), st.integers(1, 16), st.data())
def test_partitions_cover_the_flat_buffer(tensors: list[int], dp: int, data: st.DataObject) -> None:
    """Every rank's partition is the same size, a multiple of 2 elements, and the ranks' slices of the tensors
    add up to each tensor (the padding lies past the last tensor)."""
    size, _ = partition_slices(tensors, dp)
    assert size * dp >= sum(tensors) and (size * dp) % (ALIGNMENT * dp) == 0
    covered = [0] * len(tensors)
    for r in range(dp):
        s, sl = partition_slices(tensors, dp, r)
        assert s == size and sum(n for _, n in sl) <= size
        for t, n in sl:
            covered[t] += n
    assert covered == tensors
    r = data.draw(st.integers(0, dp - 1))
    assert all(n > 0 for _, n in partition_slices(tensors, dp, r)[1])


def test_zero12_replays_by_default_and_the_rest_keeps_the_fitted_rule() -> None:
    """ZeRO-1 and ZeRO-2 ranks of a mixed-bf16 model under DeepSpeed replay, with gradient accumulation too; pure
    bf16 (no fp32 master: not DeepSpeed's bf16 mode) keeps the fitted rule (ZeRO-3: test_zero3_stream.py; LoRA
    replays, test_zero_lora_stream.py; ``offload: optimizer`` replays, test_zero_offload_stream.py)."""
    base = {k: v for k, v in SCENARIO.items() if k != "reserved_model"}
    assert replayable(Context(estimate(base).scenario))
    assert replayable(Context(estimate({**base, "parallel": {"dp": 4, "zero": 1}}).scenario))
    for zero in (1, 2):
        assert replayable(
            Context(estimate({**base, "grad_accum_steps": 4, "parallel": {"dp": 4, "zero": zero}}).scenario)
        )
    assert not replayable(Context(estimate({**base, "precision": "bf16"}).scenario))
    assert "DeepSpeed ZeRO-1/2" in estimate(base).ranks[0].reserved.formula


def _zero_trace() -> None:
    """Put benchmarks/ (``zero_trace``: the real runs and their recordings) on the import path."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.parametrize(("zero", "overlap"), [(1, False), (2, False), (1, True), (2, True)])
def test_replays_as_its_cpu_trace(zero: int, overlap: bool) -> None:
    """The engine's stream (traced_only) replays within 1% of the reserved of the real DeepSpeed optimizer run on
    the CPU (fake process group, world size 4, two steps; benchmarks/zero_trace.py; its recorded trace, held to a
    fresh run by ``test_the_recorded_traces_are_deepspeeds``), with DeepSpeed's defaults
    and with ``overlap_comm`` (two ipg buffers: -36.2% before the stream wrote the second one). Its large pool
    is the trace's to the byte; both are 4 MiB under in the small pool (two 2 MiB segments: the trace keeps three
    more 1 MiB activations at forward's end, not a ZeRO buffer, docs/allocator.md)."""
    _zero_trace()
    from zero_trace import BUCKET, recorded, replayed

    traced = replayed(recorded(zero, 4, BUCKET, overlap)["events"])
    ctx = _ctx(parallel={"dp": 4, "zero": zero, "overlap_comm": overlap})
    ours = replay_stream(rank_stream(ctx, ctx.stages[0], traced_only=True), allocator_conf(ctx)).peak_reserved
    assert abs(ours / traced - 1) < 0.01, (ours, traced)


@pytest.mark.parametrize(
    ("zero", "accum", "bucket"), [(1, 2, BUCKET_SMALL), (2, 2, BUCKET_SMALL), (1, 2, 0), (2, 3, 0)]
)
def test_accumulation_replays_as_its_cpu_trace(zero: int, accum: int, bucket: int) -> None:
    """Gradient accumulation (``accum`` micro-batches a step) at DeepSpeed's default and a 20,000,000-element
    reduce_bucket_size: the engine's stream without the cuBLAS workspaces, which a CPU run never makes
    (``zero_trace.without_workspaces``: with them ZeRO-1 at the small bucket is +14.1% over, the two 32 MiB
    workspaces outgrowing the cached blocks), replays within 1% of the real optimizer's CPU run, reserved and
    allocated (measured -0.46% / -0.01% for ZeRO-1 at the small bucket; -7.5% before the stream kept ZeRO-1's
    gradients and ipg buffer to the boundary at the default bucket). The runs' recorded traces."""
    _zero_trace()
    from zero_trace import BUCKET, engine_stream, recorded

    size = bucket or BUCKET
    t = recorded(zero, 4, size, False, accum)
    a = CachingAllocator(None)
    a.run(t["events"])
    ours = replay_stream(engine_stream(zero, 4, size, False, accum, cpu=True), AllocatorConf())
    assert abs(ours.peak_reserved / a.peak_reserved - 1) < 0.01, (ours.peak_reserved, a.peak_reserved)
    assert abs(ours.peak_allocated / a.peak_allocated - 1) < 0.01, (ours.peak_allocated, a.peak_allocated)


@pytest.mark.slow
def test_the_recorded_traces_are_deepspeeds() -> None:
    """The tests above read recorded runs (tests/data/zero_traces, ``zero_trace.recorded``: refused under other
    versions of deepspeed, torch, transformers or peft than recorded); one of them, ZeRO-2 over two
    micro-batches of the small bucket (several reduces a backward, a new grads_in_partition each micro-batch), is
    run again here, the real optimizer on the CPU, and must be its recording event for event."""
    _zero_trace()
    from zero_trace import difference, recorded, traced_apart

    args = (2, 4, BUCKET_SMALL, False, 2)
    gap = difference(traced_apart(*args), recorded(*args))
    assert not gap, gap


def test_a_recording_of_other_versions_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recorded trace is read only under the versions of deepspeed, torch, transformers and peft it ran under:
    the same recording claiming another deepspeed is refused with the versions and the command that records it
    again; a case never recorded names the command that records it."""
    import gzip
    import json

    _zero_trace()
    import zero_trace

    name = zero_trace.recording_name(zero_trace.trace_call(1))
    body = json.loads(gzip.decompress((zero_trace.RECORDINGS / name).read_bytes()))
    assert zero_trace.recorded(1)["events"][0] == tuple(body["events"][0])
    body["versions"]["deepspeed"] = "0.19.7"
    (tmp_path / name).write_bytes(gzip.compress(json.dumps(body).encode()))
    monkeypatch.setattr(zero_trace, "RECORDINGS", tmp_path)
    with pytest.raises(zero_trace.StaleRecording, match=r"0\.19\.7.*--record tests/data/zero_traces"):
        zero_trace.recorded(1)
    with pytest.raises(FileNotFoundError, match="--record tests/data/zero_traces --stage"):
        zero_trace.recorded(1, 4, 123)
