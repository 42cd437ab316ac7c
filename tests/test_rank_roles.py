"""What each simulated rank holds, in words: the per-rank bars' tooltip, ``estimate --json`` and the trace view."""

from __future__ import annotations

from memsim_widget.charts import breakdown_spec
from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario
from memsim_widget.widget.trace_panel import build_trace_view


def roles(**kw) -> list[str]:
    est = estimate(Scenario.from_dict({"model": "llama-3.1-8b", **kw}))
    return [est.role(r) for r in est.ranks]


def test_one_gpu_holds_everything():
    assert roles() == ["the only GPU (all 32 layers, embeddings, head and loss)"]


def test_fsdp_rank_holds_a_shard_of_every_state():
    assert roles(parallel={"dp": 8, "zero": 3}) == [
        "each of 8 GPUs (all 32 layers, embeddings, head and loss); "
        "1/8 of the parameters, gradients and optimizer states (ZeRO-3 over dp x cp = 8)"
    ]


def test_ddp_rank_is_a_full_replica():
    assert roles(parallel={"dp": 2, "zero": 0}) == [
        "each of 2 GPUs (all 32 layers, embeddings, head and loss); a full replica of the states (data parallel, dp=2)"
    ]


def test_pipeline_stages_name_their_layers_and_ends():
    par = {"tp": 2, "pp": 4, "dp": 2, "zero": 1, "sequence_parallel": True, "pp_microbatches": 8}
    split = (
        "1/2 of each layer's matrices (tensor parallel) and 1/2 of the sequence outside them (sequence parallel); "
        "1/2 of the optimizer states (ZeRO-1 over dp x cp = 2)"
    )
    assert roles(parallel=par) == [
        f"pipeline stage 0 of 4 (layers 0-7, embeddings); {split}",
        f"pipeline stage 1 of 4 (layers 8-15); {split}",
        f"pipeline stage 2 of 4 (layers 16-23); {split}",
        f"pipeline stage 3 of 4 (layers 24-31, head and loss); {split}",
    ]


def test_interleaved_stages_hold_chunks():
    par = {"pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2, "pp_microbatches": 4}
    assert (
        roles(parallel=par)[1] == "pipeline stage 1 of 2 (16 layers in 2 chunks (interleaved), head and loss)"
    )


def test_roles_reach_the_json_and_the_bar_tooltips():
    est = estimate(Scenario.from_dict({"model": "llama-3.2-1b", "parallel": {"pp": 2, "pp_microbatches": 2}}))
    assert [r["role"] for r in est.to_dict()["per_rank"]] == [est.role(r) for r in est.ranks]
    bars = next(layer for layer in breakdown_spec(est)["layer"] if layer.get("mark", {}).get("type") == "bar")
    assert {"field": "role", "type": "nominal", "title": "holds"} in bars["encoding"]["tooltip"]
    assert {r["role"] for r in bars["data"]["values"]} == {est.role(r) for r in est.ranks}


def test_trace_view_names_the_traced_rank_and_its_simulated_stage():
    sc = Scenario.from_dict({"model": "llama-3.2-1b", "parallel": {"dp": 4, "zero": 3}})
    report = {
        "scenario": sc.to_dict(),
        "peak_tensor_bytes": 100,
        "peak_phase": "backward",
        "peak_op": "mm",
        "peak_step": 2,
        "components": {"parameters": 100},
        "timeline": [],
        "rank": 3,
        "world_size": 4,
        "rank_role": "rank 3 of 4: FSDP shard 3 of 4",
        "simulated": {"peak_tensor_bytes": 101, "stage": 0, "role": "each of 4 GPUs", "components": {}},
    }
    summary = build_trace_view(report)["summary"]
    assert summary["rank"] == {
        "index": 3,
        "world_size": 4,
        "role": "rank 3 of 4: FSDP shard 3 of 4",
        "simulated_stage": 0,
        "simulated_role": "each of 4 GPUs",
    }
