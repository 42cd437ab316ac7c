"""One rank of a multi-GPU job traced with PyTorch's own FSDP2 and replicate on fake tensors.

Expected bytes come from the config arithmetic (each parameter's FSDP2 shard is ceil(dim0 / N) rows, padded
alike on every rank), never from the tracer.
"""

from __future__ import annotations

import math

import pytest

from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from tests.conftest import TINY_LLAMA

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from memsim_widget.trace import distributed  # noqa: E402
from memsim_widget.trace.api import trace_scenario  # noqa: E402
from memsim_widget.trace.tracker import MemoryTracker  # noqa: E402

#: Every test here runs a real trace on fake tensors: behind the slow marker (scripts/dev test runs it).
pytestmark = pytest.mark.slow

BF16 = 2


def llama_shapes(c: dict) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """(one decoder layer's parameter shapes, the root's: embeddings, final norm, untied head)."""
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    layer = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i), (h,), (h,)]
    return layer, [(v, h), (h,), (v, h)]


def shard_bytes(shapes: list[tuple[int, ...]], world: int, itemsize: int) -> int:
    """Bytes of FSDP2's padded dim-0 shards of ``shapes`` on one rank of ``world``."""
    return sum(-(-s[0] // world) * math.prod(s[1:]) * itemsize for s in shapes)


def model_shapes(c: dict) -> list[tuple[int, ...]]:
    """Every parameter shape of the model."""
    layer, root = llama_shapes(c)
    return layer * c["num_hidden_layers"] + root


def scenario(**parallel: int) -> Scenario:
    """The small Llama, b2 s512 bf16, on the given layout."""
    return Scenario.from_dict(
        {"model": TINY_LLAMA, "micro_batch_size": 2, "seq_len": 512, "parallel": parallel}
    )


@pytest.mark.parametrize(("world", "rank"), [(2, 1), (8, 7)])
def test_fsdp_rank_holds_padded_shards_of_every_parameter(world: int, rank: int) -> None:
    result = trace_scenario(scenario(dp=world, zero=3), rank=rank)
    shapes = model_shapes(TINY_LLAMA)
    params = shard_bytes(shapes, world, BF16)
    state = result.model_state_bytes
    assert state["parameter"] == params
    assert state["gradient"] == params, "gradients are reduce-scattered into shards of the same size"
    step_counters = 4 * len(shapes)
    assert state["optimizer_state"] == 2 * params + step_counters
    assert (result.rank, result.world_size) == (rank, world)
    assert result.rank_role == (
        f"rank {rank} of {world}: FSDP shard {rank} of {world}, pipeline stage 0 of 1 (embeddings .. head)"
    )
    assert result.layout["coords"]["dp"] == rank


def test_fsdp_gathers_the_root_unit_through_the_step() -> None:
    result = trace_scenario(scenario(dp=4, zero=3))
    _layer, root = llama_shapes(TINY_LLAMA)
    # Embeddings, final norm and head stay gathered from the forward into backward (the root unit).
    assert result.by_role["unsharded_parameter"] >= sum(math.prod(s) for s in root) * BF16
    assert result.by_role["collective"] > 0
    assert sum(result.by_role.values()) == result.peak_bytes


def test_replicate_at_dp2_holds_the_full_parameters() -> None:
    result = trace_scenario(scenario(dp=2))
    full = sum(math.prod(s) for s in model_shapes(TINY_LLAMA)) * BF16
    assert result.model_state_bytes["parameter"] == full
    assert result.model_state_bytes["gradient"] == full
    assert any("replicate" in n and "DDP" in n for n in result.notes)
    assert "replica 0 of 2" in result.rank_role


@pytest.mark.parametrize(
    ("parallel", "field"),
    [
        ({"dp": 2, "zero": 1}, "parallel.zero"),
        ({"dp": 2, "zero": 2}, "parallel.zero"),
        ({"dp": 2, "zero": 3, "offload": "optimizer"}, "parallel.offload"),
        ({"dp": 2, "cp": 2, "zero": 3}, "parallel.cp"),
        ({"dp": 4, "zero": 3}, "rank"),
    ],
)
def test_untraceable_layouts_name_their_field(parallel: dict, field: str) -> None:
    kw = {"rank": 4} if field == "rank" else {}
    with pytest.raises(ScenarioError) as info:
        trace_scenario(scenario(**parallel), **kw)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("framework", "parallel", "traced"),
    [
        ("torchtune", {"dp": 4, "zero": 3}, True),  # torchao's NF4Tensor under FSDP2
        ("torchtune", {"dp": 1}, False),  # one GPU: not this trace
        ("hf", {"dp": 4, "zero": 3}, False),  # bitsandbytes' Params4bit cannot wrap a fake tensor
        ("torchtune", {"dp": 4, "zero": 0}, False),
    ],
)
def test_qlora_is_traced_only_as_torchtune_shards_it(framework: str, parallel: dict, traced: bool) -> None:
    from memsim_widget.trace.traceable import check_traceable, torchao_qlora

    sc = Scenario.from_dict(
        {
            "model": TINY_LLAMA,
            "method": "qlora",
            "precision": "bf16",
            "framework": framework,
            "parallel": parallel,
        }
    )
    assert torchao_qlora(sc) == traced
    if not traced:
        with pytest.raises(ScenarioError) as info:
            check_traceable(sc)
        assert info.value.field == "method"


def test_expert_parallelism_is_refused() -> None:
    mixtral = {**TINY_LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
    sc = Scenario.from_dict({"model": mixtral, "parallel": {"dp": 2, "ep": 2, "zero": 3}})
    with pytest.raises(ScenarioError) as info:
        trace_scenario(sc)
    assert info.value.field == "parallel.ep"


def _originals() -> dict[str, object]:
    """The functions a distributed trace patches, as they are now."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group
    from torch.distributed.tensor import _sharding_prop

    out: dict[str, object] = {
        name: getattr(_fsdp_param_group, name) for name in ("foreach_all_gather", "foreach_reduce")
    }
    out["wait_for_unshard"] = _fsdp_param_group.FSDPParamGroup.wait_for_unshard
    out["lazy_init"] = _fsdp_param_group.FSDPCommContext.lazy_init
    out["cpu.stream"] = torch.cpu.stream
    out["detect_fake_mode"] = _sharding_prop.detect_fake_mode
    out["resize_"] = torch.UntypedStorage.resize_
    return out


@pytest.mark.parametrize("where", ["_model_factory", "input_factory"])
def test_a_failing_trace_leaves_no_process_group_and_no_patch(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    import torch.distributed as dist

    before = _originals()

    def boom(*_a: object, **_k: object) -> object:
        def fail() -> None:
            raise RuntimeError("boom")

        return fail

    monkeypatch.setattr(distributed, where, boom)
    with pytest.raises(RuntimeError, match="boom"):
        trace_scenario(scenario(dp=2, zero=3))
    assert not dist.is_initialized()
    assert _originals() == before


def test_tracker_follows_a_storage_resized_to_zero_and_back() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        t = torch.empty(1024)  # 4096 B
        tracker = MemoryTracker()
        with tracker:
            tracker.register(t, "unsharded_parameter")
            t.untyped_storage().resize_(0)
            freed = tracker.live_bytes
            t.untyped_storage().resize_(8192)
            regrown = tracker.live_bytes
            t.untyped_storage().resize_(4096)
            seq = tracker.seq
    assert (freed, regrown, tracker.live_bytes, tracker.peak_bytes) == (0, 8192, 4096, 8192)
    assert tracker.by_role_at(seq)["unsharded_parameter"] == 4096


def test_without_reshard_after_forward_the_whole_model_stays_gathered_into_backward() -> None:
    result = distributed.trace_distributed(scenario(dp=4, zero=3), reshard_after_forward=False)
    full = sum(math.prod(s) for s in model_shapes(TINY_LLAMA)) * BF16
    assert result.peak_phase == "backward"
    assert result.by_role["unsharded_parameter"] == full


def test_the_trace_agrees_with_torchs_fsdp_mem_tracker_to_the_byte() -> None:
    """Two steps of the same FSDP2 rank under torch.distributed._tools' FSDPMemTracker: the same peak."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from memsim_widget.trace.hf import build_hf_config, input_factory, real_mode_shims

    sc = scenario(dp=2, zero=3)
    ours = trace_scenario(sc, rank=0).tracker.peak_bytes
    cfg = build_hf_config(dict(TINY_LLAMA), "sdpa")
    with distributed.fake_world(0, 2), distributed.private_sharding_fake_mode(), real_mode_shims(True, []):
        mesh = distributed.cpu_mesh({"dp": 2})
        with FakeTensorMode():
            model = distributed._model_factory(sc, cfg, mesh, [], True)()
            opt = torch.optim.AdamW(list(model.parameters()), lr=1e-3, foreach=True)
            make = input_factory(cfg, 2, 512, torch.bfloat16)
            fmt = FSDPMemTracker(model, opt)
            with fmt:
                for step in range(2):
                    loss = model(**make()).loss
                    loss.backward()
                    del loss
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    if step == 0:
                        fmt.reset_mod_stats()
            theirs = sum(snap["Total"] for snap in fmt.get_tracker_snapshot("peak").values())
    assert ours == theirs


def test_fsdp_buffers_carry_the_stream_fsdp2_allocates_them_on() -> None:
    """torch 2.13 ``_fsdp_collectives``: the all-gather output (world x a unit's padded shard) on the copy-in
    stream, the reduce-scatter input (the same size) on the compute stream, its output (one shard, the new
    gradient) on the reduce-scatter stream; the unsharded parameters on the compute stream."""
    from memsim_widget.engine.counters.allocator import replay
    from memsim_widget.engine.counters.fsdp_stream import FSDP_STREAMS
    from memsim_widget.trace.replay import allocation_stream

    world = 4
    result = trace_scenario(scenario(dp=world, zero=3))
    layer, root = llama_shapes(TINY_LLAMA)
    units = {shard_bytes(layer, world, BF16), shard_bytes(root, world, BF16)}
    recs = [r for r in result.tracker.records if r.nbytes]
    by_stream: dict[int, set[int]] = {}
    for r in recs:
        if r.role == "collective" or r.stream:
            by_stream.setdefault(r.stream, set()).add(r.nbytes)
    assert by_stream[FSDP_STREAMS["all_gather_copy_in"]] == {world * u for u in units}
    assert by_stream[FSDP_STREAMS["compute"]] == {world * u for u in units}  # the reduce-scatter inputs
    assert by_stream[FSDP_STREAMS["reduce_scatter"]] == units
    assert set(by_stream) == {0, 1, 2}
    assert {r.stream for r in recs if r.role == "unsharded_parameter"} == {0}
    # Blocks cached per stream: replayed on one stream, the allocator would reuse the freed all-gather outputs
    events = allocation_stream(result.tracker)
    one = [(h, size, 0) for h, size, _ in events]
    assert replay(events).peak_reserved > replay(one).peak_reserved
